"""The range-picking policy of the shared pool (the range-lease member's, marshal_workers.protocol.range_member): pure
parts, no broker."""

from __future__ import annotations

import random
from collections import Counter

from marshal_workers.handlers.app import App
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import SharedPartition
from marshal_workers.protocol.range_member import free_candidates, pick_ranges
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.supervisor.shared_pool import SharedTopic

NOW = 1_000_000


def topic(**high: int) -> SharedTopic:
    app = App(group="g")
    app.handler("thumbs", shared=True)(lambda msg: None)
    shared = SharedTopic(app.handlers["thumbs"], workers=[])
    shared.ends.ends = {int(p[1:]): end for p, end in high.items()}
    return shared


def test_picks_spread_over_partitions_before_taking_a_second_range_of_one() -> None:
    candidates = {p: [(s, s + 10, 0) for s in range(0, 100, 10)] for p in range(4)}
    picked = pick_ranges(candidates, want=4, members=1, rng=random.Random(7))
    assert sorted(p for p, *_ in picked) == [0, 1, 2, 3]
    assert all(start == 0 for _, start, _, _ in picked), "a lone member takes the lowest free range of each"


def test_members_pick_at_random_among_the_lowest_ranges_so_they_rarely_race() -> None:
    candidates = {0: [(s, s + 10, 0) for s in range(0, 100, 10)]}
    starts = Counter(pick_ranges(candidates, 1, members=3, rng=random.Random(seed))[0][1] for seed in range(300))
    assert set(starts) == {0, 10, 20}, "three members: one of the three lowest"
    assert min(starts.values()) > 50


def test_candidates_start_where_the_group_starts_and_stop_at_the_end() -> None:
    world = WorldState("g", 1000)
    shared = topic(p0=250, p1=0)
    found, _members, unknown = free_candidates(
        world, "thumbs", shared.ends.ends, shared.initial, NOW, size=100, want=4, idle=0
    )
    assert (found, unknown) == ({}, [0, 1]), "a partition never leased needs its start looked up first"
    shared.initial = {0: 50, 1: 0}
    found, _members, unknown = free_candidates(
        world, "thumbs", shared.ends.ends, shared.initial, NOW, size=100, want=4, idle=0
    )
    assert found == {0: [(50, 150, 0)], 1: [(0, 1, 0)]} and unknown == []


def test_a_partition_read_to_its_end_gets_a_one_offset_range_only_for_an_idle_worker() -> None:
    world = WorldState("g", 1000)
    world.shared[("thumbs", 0)] = state = SharedPartition()
    assert state.claim(0, 100, MemberId("a", "1"), NOW - 10, 60_000, False)
    assert state.ack(0, 100, MemberId("a", "1"), NOW - 5, (), (), high=100)
    shared = topic(p0=100)
    assert free_candidates(world, "thumbs", shared.ends.ends, shared.initial, NOW, 100, 4, idle=0)[0] == {0: []}
    assert free_candidates(world, "thumbs", shared.ends.ends, shared.initial, NOW, 100, 4, idle=1)[0] == {
        0: [(100, 101, 0)]
    }
    # The end the holders' fetches saw (in the acks) counts when ListOffsets under-reports it.
    assert state.claim(100, 101, MemberId("a", "1"), NOW - 4, 60_000, False)
    assert state.ack(100, 101, MemberId("a", "1"), NOW - 3, (), (), high=400)
    assert free_candidates(world, "thumbs", shared.ends.ends, shared.initial, NOW, 100, 2, idle=0)[0] == {
        0: [(101, 201, 0), (201, 301, 0), (301, 400, 0)]
    }


def test_a_range_that_starts_where_a_worker_stands_is_picked_first_so_its_consumer_reads_on() -> None:
    candidates = {p: [(s, s + 10, 0) for s in range(0, 100, 10)] for p in range(2)}
    for seed in range(50):
        picked = pick_ranges(candidates, want=3, members=4, rng=random.Random(seed), follow=[(1, 40), (0, 70)])
        assert picked[:2] == [(1, 40, 50, 0), (0, 70, 80, 0)], "both workers read on where they stand"
    assert pick_ranges(candidates, want=1, members=1, rng=random.Random(1), follow=[(0, 15)])[0][1] == 0, (
        "no free range starts there (someone else's): the lowest as before"
    )


def test_a_worker_that_wants_two_ranges_gets_two_that_follow_one_another_where_it_stands() -> None:
    # One worker per partition, each wanting its two leases: each stays on its partition (a worker moved to the other
    # partition waits tens of milliseconds for a fresh fetch there), whatever the random spread would pick.
    candidates = {p: [(s, s + 10, 0) for s in range(0, 100, 10)] for p in range(2)}
    for seed in range(50):
        picked = pick_ranges(
            candidates, want=4, members=1, rng=random.Random(seed), follow=[(0, 30), (0, 30), (1, 60), (1, 60)]
        )
        assert picked == [(0, 30, 40, 0), (0, 40, 50, 0), (1, 60, 70, 0), (1, 70, 80, 0)]
    # The chain stops where the free ranges do (the next one is someone else's): the rest is spread as before.
    gap = {0: [(30, 40, 0), (50, 60, 0)]}
    assert pick_ranges(gap, want=2, members=1, rng=random.Random(3), follow=[(0, 30), (0, 30)]) == [
        (0, 30, 40, 0),
        (0, 50, 60, 0),
    ]


def test_a_worker_stands_where_its_last_lease_ends_or_where_it_last_settled() -> None:
    from marshal_workers.protocol.worker_supply import PoolLease, reads_next
    from marshal_workers.runtime.supervisor.shared_pool import SharedWorkerHandle

    standing = SharedWorkerHandle(0, process=object(), leases=[PoolLease(0, 0, 100, 0, 10**12)])  # type: ignore[arg-type]
    settled = SharedWorkerHandle(1, process=object(), settled_at=(1, 300))  # type: ignore[arg-type]
    idle = SharedWorkerHandle(2, process=object())  # type: ignore[arg-type]
    assert (reads_next(standing), reads_next(settled), reads_next(idle)) == ((0, 100), (1, 300), None)
