"""PartitionClaims without a broker: claim, resume, heartbeat, lose and release whole partitions.

The component runs against a coordinator whose world the test folds: every write it submits is decided by
folding its records, as the coordination log would, so the verdicts are the protocol's, not the test's.
"""

from __future__ import annotations

import logging
from typing import Any

from supervisor_fakes import (
    NOW_S,
    FakeOffsets,
    FakeProcess,
    FoldedCoordinator,
    RecordedWrites,
    new_slot,
    record_of,
    settings,
)

from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.supervisor.assignments import Assignment, Phase, Table
from marshal_workers.runtime.supervisor.partition_claims import PartitionClaims

OTHER = MemberId("d", "d1")


class Member:
    """One member's PartitionClaims over a topic "t" of ``partitions`` partitions."""

    def __init__(self, partitions: int = 2, **overrides: Any) -> None:
        config = settings(**overrides)
        self.table = Table(partition_counts={"t": partitions})
        self.coordinator = FoldedCoordinator(config)
        self.writes = RecordedWrites()
        self.offsets = FakeOffsets()
        self.counters = Counters()
        self.seconds = 0.0  # the monotonic clock, moved with the coordinator's
        self.claims = PartitionClaims(
            self.table,
            self.coordinator,
            self.writes,
            self.offsets,
            config,
            {"t": (0.0, 0.0)},  # type: ignore[arg-type]
            self.counters,
            logging.getLogger("test"),
            new_slot=new_slot,
            clock=lambda: self.seconds,
        )

    def pass_at(self, seconds: float) -> None:
        """A pass of the loop ``seconds`` after the start, then every write it made decided by the log."""
        self.coordinator.now_s = NOW_S + seconds
        self.seconds = seconds
        self.claims.step(seconds)
        self.writes.fold_all(self.coordinator)

    def held(self, partition: int) -> Assignment:
        return self.table.assignments[("t", partition)]


def test_free_partitions_are_claimed_and_resume_where_the_group_left_them() -> None:
    member = Member()
    member.offsets.committed = {("t", 0): 42}  # partition 1 was never committed: auto_offset_reset's answer
    member.offsets.reset_to = 7
    member.pass_at(0.0)
    assert member.coordinator.world.owner("t", 0) == member.coordinator.me
    assert member.coordinator.world.owner("t", 1) == member.coordinator.me
    assert (member.held(0).started_offset, member.held(1).started_offset) == (42, 7)
    assert {a.key for a in member.table.to_start} == {("t", 0), ("t", 1)}, "each waits for the pool to start its worker"
    assert member.held(0).slot.get(Field.LEASE_UNTIL_MS) > 0, "an accepted claim gives the worker a lease"
    assert member.coordinator.world.get("t", 0).offset == 42, "the first heartbeat tells the log where it resumes"
    assert member.counters.claims_accepted == 2


def test_a_partition_whose_position_kafka_does_not_tell_is_left_unclaimed_rather_than_guessed() -> None:
    member = Member(partitions=1)
    member.offsets.unknown = True
    member.pass_at(0.0)
    assert member.table.assignments == {} and not member.table.to_start


def test_a_partition_released_in_the_log_resumes_at_the_released_offset() -> None:
    member = Member(partitions=1)
    ts = round(NOW_S * 1000) - 10
    member.coordinator.fold(
        codec.Claim(**record_of(OTHER, ts - 1), topic="t", partition=0),
        codec.Release(**record_of(OTHER, ts), topic="t", partition=0, offset=500),
    )
    member.pass_at(0.0)
    assert member.held(0).started_offset == 500


def test_max_partitions_caps_what_is_claimed() -> None:
    member = Member(partitions=4, max_partitions=1)
    member.pass_at(0.0)
    assert len(member.table.assignments) == 1


def test_a_heartbeat_refused_means_the_partition_is_lost_its_worker_stops_and_nothing_is_released() -> None:
    member = Member(partitions=1)
    member.pass_at(0.0)
    lost = member.held(0)
    lost.process = FakeProcess(None, "worker")  # type: ignore[arg-type,assignment]
    # Our records stop (a long pause, say); 3 HB later another member takes the partition over.
    taken_at = round((NOW_S + 3.0) * 1000)
    assert member.coordinator.fold(codec.Claim(**record_of(OTHER, taken_at), topic="t", partition=0)) == [True]
    member.pass_at(3.5)
    assert lost.lost and lost.slot.get(Field.STOP_REQUESTED) == 1, "its worker is asked to stop at once"
    assert lost.slot.get(Field.LEASE_UNTIL_MS) == 0, "and may not handle another message"
    assert member.counters.partitions_lost == 1
    assert member.coordinator.world.owner("t", 0) == OTHER, "no release of ours undid the take-over"


def test_a_release_carries_the_workers_progress_and_the_stop_waits_for_its_verdict() -> None:
    member = Member(partitions=1)
    member.pass_at(0.0)
    assignment = member.held(0)
    assignment.slot.set(Field.NEXT_OFFSET, 50)
    member.table.phase = Phase.STOPPING
    member.claims.release(assignment)
    assert not member.claims.stopped(), "a release in flight"
    member.writes.fold_all(member.coordinator)
    assert member.claims.stopped()
    state = member.coordinator.world.get("t", 0)
    assert state is not None and state.owner is None and state.offset == 50
    assert member.table.assignments == {} and member.counters.releases["shutdown"] == 1


def test_at_most_once_a_release_never_resumes_before_a_claimed_batch() -> None:
    member = Member(partitions=1)
    member.pass_at(0.0)
    assignment = member.held(0)
    assignment.slot.set(Field.NEXT_OFFSET, 50)
    assignment.claimed_end = 60  # the worker claimed messages up to 60, and died handling them
    member.claims.release(assignment)
    member.writes.fold_all(member.coordinator)
    state = member.coordinator.world.get("t", 0)
    assert state is not None and state.offset == 60


def test_a_partition_released_as_sick_is_not_claimed_back_while_it_cools_down() -> None:
    member = Member(partitions=1, sick_cooldown=30.0)
    member.pass_at(0.0)
    member.claims.release(member.held(0), sick=True)
    member.writes.fold_all(member.coordinator)
    assert member.claims.cooling_down(1.0) == [("t", 0)]
    member.pass_at(1.0)
    assert member.table.assignments == {}, "free in the log, but ours to leave alone for sick_cooldown"
    assert member.counters.releases["sick"] == 1


def test_a_graceful_stop_asks_workers_to_finish_and_releases_partitions_without_one() -> None:
    member = Member()
    member.pass_at(0.0)
    running, waiting = member.held(0), member.held(1)
    running.process = FakeProcess(None, "worker")  # type: ignore[arg-type,assignment]
    waiting.process = None  # its worker crashed and waits for a restart
    member.table.phase = Phase.STOPPING
    member.claims.begin_stop()
    assert running.slot.get(Field.STOP_REQUESTED) == 1
    assert waiting.slot.get(Field.STOP_REQUESTED) == 0 and ("t", 1) not in member.table.assignments
    member.writes.fold_all(member.coordinator)
    assert member.coordinator.world.owner("t", 1) is None, "released at once"
    assert member.coordinator.world.owner("t", 0) == member.coordinator.me, "released when its worker exits"
    assert member.counters.releases == {"shutdown": 1}


def test_an_operators_order_hands_a_partition_over_and_its_release_says_so() -> None:
    member = Member(partitions=1)
    member.pass_at(0.0)
    assignment = member.held(0)
    assignment.process = FakeProcess(None, "worker")  # type: ignore[arg-type,assignment]
    member.claims.hand_over(assignment, "release")
    assert assignment.ordered == "release" and assignment.handing_over
    assert assignment.slot.get(Field.STOP_REQUESTED) == 1, "its worker stops first"
    member.claims.release_handed_over(assignment)  # (the worker pool, once the worker exited)
    member.writes.fold_all(member.coordinator)
    assert member.coordinator.world.owner("t", 0) is None
    assert member.counters.releases == {"operator": 1}
    assert member.claims.cooling_down(1.0) == [("t", 0)], "meant for another member: not claimed back at once"


def test_a_partition_being_handed_over_is_not_judged_sick_while_its_worker_finishes() -> None:
    # A worker asked to stop makes no progress while it finishes the call in hand: judged by the health monitor it
    # would look stalled, be released as sick and kept from us for sick_cooldown (the supervisor did so before
    # the member core: it judged every partition whose heartbeat was accepted).
    member = Member(partitions=1, heartbeat_interval=1.0, behind_cycles=1)
    member.pass_at(0.0)
    assignment = member.held(0)
    assignment.process = FakeProcess(None, "worker")  # type: ignore[arg-type,assignment]
    assignment.slot.set(Field.HIGH_WATERMARK, 1_000)  # far behind, and no progress from here on
    other = MemberId("d", "d1")  # a live member that could take it
    member.coordinator.fold(codec.Claim(**record_of(other, round(NOW_S * 1000)), topic="u", partition=0))
    member.claims.give_back(assignment)
    for seconds in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
        member.coordinator.fold(
            codec.Claim(**record_of(other, round((NOW_S + seconds) * 1000)), topic="u", partition=0)
        )
        member.pass_at(seconds)
    assert assignment.handing_over and not assignment.unhealthy
    member.claims.release_handed_over(assignment)
    member.writes.fold_all(member.coordinator)
    assert member.counters.releases == {"balance": 1}
