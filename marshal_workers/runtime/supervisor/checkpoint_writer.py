"""Checkpoints of the coordination log written by a member: the supervisor's shell of the member core's
CheckpointWriting (member/checkpoint_writing.py).

Which member writes a coordination partition's checkpoint, when, and what it holds is the member core's (with the
fold's ``checkpoints.due`` and protocol/checkpoint_schedule.py), which the simulator drives too; this component
reads the coordinator's fold with the offsets it has read to, and writes those due without waiting on Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.member.checkpoint_writing import CheckpointWriting
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.supervisor.assignments import Table


class CheckpointWriter:
    """The supervisor's component that writes the checkpoints due from us (component.py's interface), and the shell
    its member core drives."""

    def __init__(
        self, table: Table, coordinator: Coordinator, writes: InFlightWrites, settings: Settings, log: Any
    ) -> None:
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        me = MemberId(coordinator.client, coordinator.instance)
        interval_ms = round(settings.checkpoint_interval * 1000)
        self.core = CheckpointWriting(me, self, settings.heartbeat_interval, interval_ms, log)

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        self.core.step(now, self.table.running)

    def begin_stop(self) -> None:
        """Nothing: a stopping member writes no more checkpoints."""

    def stopped(self) -> bool:
        return True  # a checkpoint in flight is an optimisation of others' start-up, not ours to wait for

    # ----------------------------------------------------- the core's shell

    def read_folded(self, query: Callable[[WorldState, Sequence[int]], Any]) -> Any:
        return self.coordinator.read_folded(query)

    def now_ms(self) -> int:
        return self.coordinator.now_ms()

    def fields(self) -> dict[str, Any]:
        return self.coordinator.record_fields()

    def partition_count(self) -> int:
        return self.coordinator.partition_count

    def submit(
        self,
        what: str,
        records: list[codec.Record],
        on_verdicts: OnVerdicts,
        on_failure: OnFailure,
        partitions: list[int],
    ) -> None:
        self.writes.submit(what, records, on_verdicts, on_failure, partitions=partitions)
