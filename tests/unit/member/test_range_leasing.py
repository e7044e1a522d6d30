"""The member core's range leasing, driven by hand: what a member writes for its shared workers and what it tells
them, from the fold's verdicts (the supervisor's shared pool and the simulator drive the same object)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marshal_workers.member.range_leasing import RangeLeasing
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_member import RangeMember
from marshal_workers.protocol.range_sizing import RangeSizing
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")
LOG_MS = 1_700_000_000_000  # the log's clock
LEASE_MS = 6_000
ME = MemberId("c", "i1")


@dataclass(eq=False)
class Worker:
    index: int
    leases: list[PoolLease] = field(default_factory=list)
    settled_at: tuple[int, int] | None = None
    running: bool = True


class Member:
    """The shell: a fold the test's writes land in at once (or fail), and what the workers were told."""

    def __init__(self, partitions: int = 2, end: int = 1_000) -> None:
        self.world = WorldState("g", 2_000)
        self.end = end
        self.partitions = partitions
        self.written: list[codec.Record] = []
        self.failing = False
        self.told: list[tuple[str, int, int, int]] = []  # (what, worker, partition, start)

    def holder(self) -> MemberId:
        return ME

    def fields(self) -> dict[str, Any]:
        return {"v": codec.VERSION, "ts": LOG_MS, "group": "g", "client": ME.client, "instance": ME.instance}

    def read(self, query: Callable[[WorldState], T]) -> T:
        return query(self.world)

    def ends(self, topic: str) -> dict[int, int]:
        return dict.fromkeys(range(self.partitions), self.end)

    def initial(self, topic: str) -> dict[int, int]:
        return dict.fromkeys(range(self.partitions), 0)

    def learn_starts(self, topic: str, partitions: list[int]) -> None:
        raise AssertionError("every start is known")

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        self.written += records
        if self.failing:
            on_failure(TimeoutError(what))
        else:
            on_verdicts([self.world.apply(record, LOG_MS, 0) for record in records])

    def leased(self, worker: Worker, leased: PoolLease) -> None:
        self.told.append(("lease", worker.index, leased.partition, leased.start))

    def renewed(self, worker: Worker, leased: PoolLease) -> None:
        self.told.append(("renewed", worker.index, leased.partition, leased.start))

    def dropped(self, worker: Worker, leased: PoolLease) -> None:
        pass

    def progress_of(self, worker: Worker, leased: PoolLease) -> int:
        return max(leased.upto, leased.start)


def leasing(member: Member, workers: int = 2) -> RangeLeasing[Worker]:
    return RangeLeasing(
        RangeMember("thumbs", LEASE_MS, amo=False),
        RangeSizing(100, LEASE_MS, adaptive=False),
        [Worker(i) for i in range(workers)],
        member,
        random.Random(1),
    )


def kinds(member: Member) -> list[str]:
    return [type(record).__name__ for record in member.written]


def test_hungry_workers_get_the_ranges_won_and_are_told() -> None:
    member = Member()
    core = leasing(member)
    core.step(0.0, 0, LOG_MS)
    core.step(0.1, 100, LOG_MS)
    assert kinds(member) == ["ClaimRanges", "ClaimRanges"]
    for worker in core.workers:
        first, second = worker.leases  # the one in hand and the next, which it reads on to without a seek
        assert (second.partition, second.start) == (first.partition, first.end)
    assert [t for t, *_ in member.told] == ["lease"] * 4
    assert core.counters.claimed == 4 and not core.claiming


def test_a_topic_held_back_by_an_operator_claims_nothing_until_let_go() -> None:
    member = Member()
    core = leasing(member)
    core.held_back = True
    core.step(0.0, 0, LOG_MS)
    assert member.written == [] and all(not w.leases for w in core.workers)
    core.held_back = False
    core.step(0.1, 100, LOG_MS)
    assert kinds(member) == ["ClaimRanges"]


def test_ranges_won_after_a_stop_began_go_back_untried() -> None:
    member = Member()
    core = leasing(member)
    real_submit = member.submit
    held: list[Callable[[], None]] = []
    member.submit = lambda what, records, ok, failed: held.append(lambda: real_submit(what, records, ok, failed))  # type: ignore[method-assign]
    core.step(0.0, 0, LOG_MS)
    core.stopping = True
    held.pop()()  # the claim's verdicts come in after the stop began
    assert all(not w.leases for w in core.workers) and member.told == []
    member.submit = real_submit  # type: ignore[method-assign]
    core.step(0.1, 100, LOG_MS)
    assert kinds(member) == ["ClaimRanges", "CancelRanges"]
    assert core.stopped()


def test_a_settlement_not_confirmed_is_written_again_unless_the_last_tries_are_made() -> None:
    member = Member()
    core = leasing(member, workers=1)
    core.step(0.0, 0, LOG_MS)
    worker = core.workers[0]
    first = worker.leases[0]
    core.settled(worker, first, first.end, (), (), None, first.end - first.start, 10.0, 0.1)
    member.failing = True
    core.step(0.1, 100, LOG_MS)
    assert core.acks, "kept to write again"
    core.last_tries = True
    core.step(0.2, 200, LOG_MS)
    assert not core.acks, "past the shutdown timeout: left to lapse"
    assert kinds(member).count("AckRanges") == 2
