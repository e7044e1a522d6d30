"""Checkpoints of the coordination log written by a member: each partition's, when it is due from us.

Which member writes a coordination partition's checkpoint, and when, is
decided by the fold (protocol/checkpoints.py: checkpoints.due); this
component looks every HB and writes those due, one write in flight per
partition, without waiting on Kafka.
"""

from __future__ import annotations

from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordinator import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.protocol import checkpoints
from marshal_workers.protocol.world_state import Owner
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
        self._next_look = 0.0  # monotonic
        self._checkpointing: set[int] = set()  # coordination partitions whose checkpoint is being written

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        if now >= self._next_look:
            self._next_look = now + self.settings.heartbeat_interval
            self._write_checkpoints()

    def begin_stop(self) -> None:
        """Nothing: a stopping member writes no more checkpoints."""

    def stopped(self) -> bool:
        return True  # a checkpoint in flight is an optimisation of others' start-up, not ours to wait for

    def _write_checkpoints(self) -> None:
        """Write the checkpoint of each coordination partition that is due from us (checkpoints.due)."""
        interval_ms = round(self.settings.checkpoint_interval * 1000)
        if not interval_ms or not self.table.running:
            return
        coordinator = self.coordinator
        me = Owner(coordinator.client, coordinator.instance)
        now_ms = coordinator.now_ms()
        for partition in range(coordinator.partition_count):
            if partition in self._checkpointing:
                continue
            if not coordinator.read(lambda world: checkpoints.due(world, partition, now_ms, interval_ms, me)):
                continue
            records = coordinator.checkpoint_records(partition)
            self._checkpointing.add(partition)
            self.writes.submit(
                "checkpoint",
                records,
                lambda _verdicts, p=partition: self._checkpointing.discard(p),
                lambda exc, p=partition: self._checkpoint_failed(p, exc),
                partitions=[partition] * len(records),
            )

    def _checkpoint_failed(self, partition: int, exc: Exception) -> None:
        self._checkpointing.discard(partition)
        self.log.warning("checkpoint of coordination partition %d not confirmed: %s", partition, exc)
