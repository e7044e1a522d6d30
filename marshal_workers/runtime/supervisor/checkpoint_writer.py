"""Checkpoints of the coordination log written by a member: each partition's, when it is due from us.

Which member writes a coordination partition's checkpoint, and when, is
decided by the fold (protocol/checkpoints.py: checkpoints.due); when to look
(every HB) and what is in flight (one write per partition) by
protocol/checkpoint_schedule.py, which the simulator steps too; this
component writes those due without waiting on Kafka.
"""

from __future__ import annotations

import functools
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.protocol import checkpoints
from marshal_workers.protocol.checkpoint_schedule import CheckpointSchedule
from marshal_workers.protocol.member_id import MemberId as Owner
from marshal_workers.runtime.supervisor.assignments import Table


class CheckpointWriter:
    """The supervisor's component that writes the checkpoints due from us (component.py's interface)."""

    def __init__(self, table: Table, coordinator: Coordinator, writes: InFlightWrites, settings: Settings,
                 log: Any) -> None:  # fmt: skip
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        self.settings = settings
        self.log = log
        interval_ms = round(settings.checkpoint_interval * 1000)
        self.schedule = CheckpointSchedule(settings.heartbeat_interval, interval_ms)  # on the monotonic clock

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        self._write_checkpoints(now)

    def begin_stop(self) -> None:
        """Nothing: a stopping member writes no more checkpoints."""

    def stopped(self) -> bool:
        return True  # a checkpoint in flight is an optimisation of others' start-up, not ours to wait for

    def _write_checkpoints(self, now: float) -> None:
        """Write the checkpoint of each coordination partition that is due from us (checkpoints.due)."""
        coordinator = self.coordinator
        me = Owner(coordinator.client, coordinator.instance)
        now_ms = coordinator.now_ms()
        interval_ms = self.schedule.interval_ms

        def due(partition: int) -> bool:
            return coordinator.read(lambda world: checkpoints.due(world, partition, now_ms, interval_ms, me))

        for partition in self.schedule.to_write(now, self.table.running, coordinator.partition_count, due):
            records = coordinator.checkpoint_records(partition)
            self.writes.submit(
                "checkpoint",
                records,
                functools.partial(self._checkpoint_written, partition),
                functools.partial(self._checkpoint_failed, partition),
                partitions=[partition] * len(records),
            )

    def _checkpoint_written(self, partition: int, _verdicts: list[bool]) -> None:
        self.schedule.settled(partition)

    def _checkpoint_failed(self, partition: int, exc: Exception) -> None:
        self.schedule.settled(partition)
        self.log.warning("checkpoint of coordination partition %d not confirmed: %s", partition, exc)
