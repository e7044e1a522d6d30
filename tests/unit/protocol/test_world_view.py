"""The queries of the world state (protocol/world_view.py): scenarios, and the indexes and kept answers the fold
keeps up for them, checked against scans of the partitions over generated logs (hypothesis)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples
from test_world_state import claim, heartbeat, release, release_group, world
from test_world_state_properties import CLIENTS, GROUP, HB, STEPS, TOPICS, fold_all, logs

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import Liveness

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (0, Liveness.FRESH),
        (HB - 1, Liveness.FRESH),
        (HB, Liveness.UNKNOWN),
        (2 * HB, Liveness.UNKNOWN),
        (2 * HB + 1, Liveness.STALE),
    ],
)
def test_liveness_by_heartbeat_age(age: int, expected: Liveness) -> None:
    state, _ = world(claim("a", "a1", 1000))
    assert state.liveness("orders", 0, 1000 + age) is expected


def test_liveness_of_released_and_never_seen_partitions() -> None:
    state, _ = world(claim("a", "a1", 0), release("a", "a1", 1, 3))
    assert state.liveness("orders", 0, 2) is Liveness.RELEASED
    assert state.liveness("orders", 1, 2) is Liveness.UNCLAIMED


def test_is_free_matches_what_a_claim_would_get() -> None:
    state, _ = world(claim("a", "a1", 0))
    assert not state.is_free("orders", 0, 2 * HB, "b", "b1")
    assert state.is_free("orders", 0, 2 * HB + 1, "b", "b1")
    assert state.is_free("orders", 0, 10, "a", "a2")  # fast reclaim
    assert state.is_free("orders", 1, 10, "b", "b1")
    state.apply(release_group("op", 20, 100), 20)
    assert not state.is_free("orders", 1, 50, "b", "b1")


def test_owned_by_lists_a_clients_partitions() -> None:
    state, _ = world(
        claim("a", "a1", 0, partition=0), claim("a", "a1", 0, partition=1), claim("b", "b1", 0, partition=2)
    )
    assert sorted(state.owned_by("a")) == [("orders", 0), ("orders", 1)]
    assert list(state.owned_by("a", "zz")) == []


def test_live_members_are_fresh_owners_and_recent_claimants_whatever_the_verdict() -> None:
    state, _ = world(claim("a", "a1", 0), claim("b", "b1", 1000), heartbeat("a", "a1", 1500, 5))  # b refused
    assert state.live_members(2000) == {MemberId("a", "a1"), MemberId("b", "b1")}
    assert state.live_members(1000 + 2 * HB) == {MemberId("a", "a1"), MemberId("b", "b1")}
    assert state.live_members(1500 + 2 * HB + 1) == set()  # a stale, b's claim too old


def test_a_zombie_heartbeat_does_not_make_a_member() -> None:
    state, _ = world(claim("a", "a1", 0), heartbeat("z", "z1", 500, 5))
    assert state.live_members(1000) == {MemberId("a", "a1")}


def test_a_member_that_released_everything_is_gone_at_once() -> None:
    state, _ = world(claim("a", "a1", 0), claim("b", "b1", 0, partition=1), release("a", "a1", 3 * HB, 7))
    state.apply(heartbeat("b", "b1", 3 * HB, 1, partition=1), 3 * HB)
    assert state.live_members(3 * HB + 1) == {MemberId("b", "b1")}


def test_holdings_list_the_partitions_of_owners_that_are_not_stale() -> None:
    state, _ = world(claim("a", "a1", 0), claim("a", "a1", 0, partition=1), claim("b", "b1", 1000, partition=2))
    assert {k: sorted(v) for k, v in state.holdings(2 * HB).items()} == {
        MemberId("a", "a1"): [("orders", 0), ("orders", 1)],
        MemberId("b", "b1"): [("orders", 2)],
    }
    assert state.holdings(2 * HB + 1) == {MemberId("b", "b1"): [("orders", 2)]}


def test_askers_are_those_whose_claim_of_a_live_owners_partition_was_refused_within_two_heartbeats() -> None:
    state, verdicts = world(claim("a", "a1", 0), claim("b", "b1", 1000), claim("c", "c1", 1000, partition=1))
    assert verdicts == [True, False, True]  # b asked for a's partition; c claimed a free one
    assert state.askers(1000 + 2 * HB) == {MemberId("b", "b1")}
    assert state.askers(1000 + 2 * HB + 1) == set()


def test_a_member_that_claims_a_partition_after_asking_is_no_longer_asking() -> None:
    state, verdicts = world(claim("a", "a1", 0), claim("b", "b1", 1000), claim("b", "b1", 1500, partition=1))
    assert verdicts == [True, False, True]  # b asked for a's partition, then got a free one
    assert state.askers(1500) == set(), "answered: b asks again if it still wants more"
    state.apply(claim("b", "b1", 1600), 1600)
    assert state.askers(1600) == {MemberId("b", "b1")}


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.sampled_from(STEPS), st.sampled_from(CLIENTS))
def test_free_partitions_answers_as_is_free_asked_of_each(
    log: list[codec.Record], later: int, who: tuple[str, str]
) -> None:
    """A claim round asks free_partitions once (pause and drain checked once): the answer is is_free's, key by key."""
    state = fold_all(log)
    now = log[-1].ts + later
    keys = [(topic, p) for topic in TOPICS for p in range(4)]
    assert state.free_partitions(keys, now, *who) == [key for key in keys if state.is_free(*key, now, *who)]


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(
    logs(),
    st.lists(st.sampled_from([-3 * HB, -HB, 0, 1, HB, 2 * HB, 2 * HB + 1, 5 * HB]), min_size=1, max_size=4),
    st.sampled_from(CLIENTS),
    st.booleans(),
)
def test_free_partitions_index_answers_as_the_scan_between_records(
    log: list[codec.Record], lags: list[int], who: tuple[str, str], back_in_time: bool
) -> None:
    """A member asks free_partitions every claim round while it folds: the fold's index (no owned partition can
    be stale yet) never changes the answer, whatever the times asked, also when record times go backwards
    (a log folded by ``ts``) or a checkpoint loads partitions."""
    state = WorldState(GROUP, HB)
    keys = [(topic, p) for topic in TOPICS for p in range(4)]
    for i, record in enumerate(log):
        at = record.ts - (HB * 3 if back_in_time and i % 5 == 4 else 0)
        state.apply(record, at)
        for lag in lags:
            now = at + lag
            assert state.free_partitions(keys, now, *who) == [key for key in keys if state.is_free(*key, now, *who)]
    restored = WorldState(GROUP, HB)
    restored.free_partitions(keys, log[-1].ts, *who)  # learns the index of an empty world
    restored.partitions.update(copy.deepcopy(state.partitions))
    restored.partitions_restored()  # as checkpoints.seed does
    now = log[-1].ts + HB
    assert restored.free_partitions(keys, now, *who) == [key for key in keys if restored.is_free(*key, now, *who)]


def holdings_by_scan(state: WorldState, now: int) -> list[tuple[MemberId, list[tuple[str, int]]]]:
    """``holdings`` as its definition reads: every owner heard from within 2*HB, its partitions in the fold's order."""
    held: dict[MemberId, list[tuple[str, int]]] = {}
    for key, found in state.partitions.items():
        if found.owner is not None and now - found.last_ts <= 2 * HB:
            held.setdefault(found.owner, []).append(key)
    return list(held.items())


def group_view_by_scan(state: WorldState, now: int, me: MemberId) -> tuple[dict[MemberId, int], set[MemberId], int]:
    """``group_view`` as its definition reads: live members with their holdings, askers, the most held by others."""
    held = {owner: len(keys) for owner, keys in holdings_by_scan(state, now)}
    claimed = {MemberId(state.clients[i], i) for i, at in state.last_claim.items() if now - at <= 2 * HB}
    counts = {member: held.get(member, 0) for member in set(held) | claimed}
    askers = {
        MemberId(state.clients[i], i)
        for i, at in state.last_refused_claim.items()
        if now - at <= 2 * HB and state.last_claim.get(i) == at
    }
    return counts, askers, max((n for m, n in counts.items() if m != me), default=0)


def group_view_of(state: WorldState, now: int, me: MemberId) -> tuple[dict[MemberId, int], set[MemberId], int]:
    view = state.group_view(now)
    return dict(view.counts), set(view.askers), view.most_held_by_others(me)


def release_requests_by_scan(state: WorldState, owner: MemberId) -> frozenset[tuple[str, int]]:
    """``release_requests`` as its definition reads."""
    return frozenset(k for k, found in state.partitions.items() if found.release_requested and found.owner == owner)


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(
    logs(),
    st.lists(st.sampled_from([-3 * HB, -HB, 0, 1, HB, 2 * HB, 2 * HB + 1, 5 * HB]), min_size=1, max_size=4),
    st.lists(st.sampled_from(CLIENTS), min_size=1, max_size=3),
)
def test_kept_answers_of_free_partitions_and_holdings_are_the_scans_between_records(
    log: list[codec.Record], lags: list[int], askers: list[tuple[str, str]]
) -> None:
    """The fold keeps free_partitions' answer for a tuple of keys, and the holdings (and their counts), until a
    partition changes owner (members ask both every round, mostly of an unchanged world): asked again and again between records, by
    several members at several times, they answer as the scans."""
    state = WorldState(GROUP, HB)
    keys = tuple((topic, p) for topic in TOPICS for p in range(4))
    for record in log:
        state.apply(record, record.ts)
        for lag in lags:
            now = record.ts + lag
            for who in askers:
                assert state.free_partitions(keys, now, *who) == [key for key in keys if state.is_free(*key, now, *who)]
                assert list(state.holdings(now).items()) == holdings_by_scan(state, now)
                assert state.holding_counts(now) == {owner: len(keys) for owner, keys in holdings_by_scan(state, now)}
                assert state.release_requests(MemberId(*who)) == release_requests_by_scan(state, MemberId(*who))
                assert group_view_of(state, now, MemberId(*who)) == group_view_by_scan(state, now, MemberId(*who))
            state.holdings(now)[MemberId("x", "x1")] = []  # a caller's change to an answer changes no later answer
            assert list(state.holdings(now).items()) == holdings_by_scan(state, now)
