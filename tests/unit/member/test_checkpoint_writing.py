"""The member core's checkpoint writing, driven by hand: a member looks every HB, writes the checkpoint of each
coordination partition due from it (one write in flight per partition), as of the offsets it has read to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from marshal_workers.member.checkpoint_writing import CheckpointWriting
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")
LOG_MS = 1_700_000_000_000
ME = MemberId("c", "a1")  # the lowest instance: checkpoints are due from it


class Member:
    def __init__(self) -> None:
        self.world = WorldState("g", 1_000, 2)
        self.read_to = [7, 3]
        self.writes: list[tuple[list[codec.Record], OnVerdicts, OnFailure, list[int]]] = []
        common = self.fields()
        self.world.apply(codec.Claim(**common, topic="t", partition=0), LOG_MS, 0)

    def read_folded(self, query: Callable[[WorldState, Sequence[int]], T]) -> T:
        return query(self.world, self.read_to)

    def now_ms(self) -> int:
        return LOG_MS + 100

    def fields(self) -> dict[str, Any]:
        return {"v": codec.VERSION, "ts": LOG_MS, "group": "g", "client": ME.client, "instance": ME.instance}

    def partition_count(self) -> int:
        return 2

    def submit(
        self,
        what: str,
        records: list[codec.Record],
        on_verdicts: OnVerdicts,
        on_failure: OnFailure,
        partitions: list[int],
    ) -> None:
        self.writes.append((records, on_verdicts, on_failure, partitions))


def test_checkpoints_due_are_written_as_of_the_offsets_read_each_to_its_partition_one_in_flight_at_a_time() -> None:
    member = Member()
    writing = CheckpointWriting(ME, member, heartbeat_s=1.0, interval_ms=60_000)
    writing.step(0.0, running=True)
    assert [(partitions, [r.as_of for r in records]) for records, _, _, partitions in member.writes] == [  # type: ignore[attr-defined]
        ([0], [7]),
        ([1], [3]),
    ]
    writing.step(0.5, running=True)
    writing.step(1.0, running=True)
    assert len(member.writes) == 2, "a look every HB; none while the partition's last write is in flight"
    member.writes[0][1]([True])
    member.writes[1][2](TimeoutError("not confirmed"))
    writing.step(2.0, running=True)
    assert len(member.writes) == 4, "settled (confirmed or not): written again once due"
    writing.step(3.0, running=False)
    assert len(member.writes) == 4, "a stopping member writes none"
