"""Fair balance decisions (marshal_workers.balance): the share, the hysteresis, whom to ask."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.balance import (
    BalanceState,
    FairShare,
    claim_cap,
    fair_share,
    is_hungry,
    partition_to_ask_for,
    partitions_to_hand_over,
    settled_surplus,
    yields_to_hungry,
)

SETTLE = 1.0


@pytest.mark.parametrize(
    ("total", "members", "low", "high"),
    [(8, 1, 8, 8), (8, 2, 4, 4), (8, 3, 2, 3), (8, 9, 0, 1), (0, 3, 0, 0), (10, 4, 2, 3)],
)
def test_fair_share_is_the_floor_and_ceiling_of_partitions_per_member(total: int, members: int, low: int, high: int) -> None:
    assert fair_share(total, members) == FairShare(low, high)


@given(st.integers(0, 10_000), st.integers(1, 500))
def test_the_band_always_fits_every_partition(total: int, members: int) -> None:
    share = fair_share(total, members)
    assert 0 <= share.high - share.low <= 1
    assert share.low * members <= total <= share.high * members


def test_no_members_is_a_bug_not_a_share() -> None:
    with pytest.raises(ValueError):
        fair_share(8, 0)


def test_a_surplus_is_handed_over_only_after_it_has_lasted_the_settle_time() -> None:
    state, release = settled_surplus(BalanceState(), 4, now=10.0, settle_s=SETTLE)
    assert release == 0 and state.surplus_since == 10.0
    state, release = settled_surplus(state, 4, now=10.9, settle_s=SETTLE)
    assert release == 0
    state, release = settled_surplus(state, 4, now=11.0, settle_s=SETTLE)
    assert release == 4 and state == BalanceState()


def test_a_surplus_that_goes_away_starts_the_clock_again() -> None:
    state, _ = settled_surplus(BalanceState(), 2, now=0.0, settle_s=SETTLE)
    state, release = settled_surplus(state, 0, now=0.5, settle_s=SETTLE)  # a member left, briefly
    assert release == 0 and state == BalanceState()
    state, release = settled_surplus(state, 2, now=1.2, settle_s=SETTLE)
    assert release == 0, "the surplus is new: it must last the settle time again"


def test_above_the_share_the_surplus_goes() -> None:
    assert partitions_to_hand_over("a", {"a": 8, "b": 0}, fair_share(8, 2)) == 4
    assert partitions_to_hand_over("b", {"a": 8, "b": 0}, fair_share(8, 2)) == 0


@pytest.mark.parametrize("counts", [{"a": 3, "b": 3, "c": 2}, {"a": 3, "b": 2, "c": 3}, {"a": 2, "b": 3, "c": 3}])
def test_nothing_moves_inside_the_band(counts: dict[str, int]) -> None:
    share = fair_share(8, 3)
    assert [partitions_to_hand_over(m, counts, share) for m in counts] == [0, 0, 0]
    assert not any(is_hungry(n, share, max_partitions=0) for n in counts.values())


def test_members_at_the_ceiling_give_one_each_to_a_member_below_the_floor() -> None:
    counts = {"a": 4, "b": 4, "c": 2}  # 10 over 3: the band is 3..4, yet nobody is above it
    share = fair_share(10, 3)
    given = {m: partitions_to_hand_over(m, counts, share) for m in counts}
    assert given == {"a": 1, "b": 0, "c": 0}, "one giver, the same in every member's eyes"


def test_a_surplus_covers_the_shortfall_before_anyone_else_gives() -> None:
    counts = {"a": 6, "b": 4, "c": 0}  # 10 over 3: a gives its surplus (2) and, the busiest, one more
    share = fair_share(10, 3)
    assert {m: partitions_to_hand_over(m, counts, share) for m in counts} == {"a": 3, "b": 0, "c": 0}
    counts = {"a": 5, "b": 4, "c": 1}
    assert {m: partitions_to_hand_over(m, counts, share) for m in counts} == {"a": 2, "b": 0, "c": 0}


def test_hunger_and_the_claim_cap_respect_max_partitions() -> None:
    share = FairShare(4, 5)
    assert is_hungry(3, share, max_partitions=0) and not is_hungry(3, share, max_partitions=3)
    assert claim_cap(share, 0) == 5 and claim_cap(share, 2) == 2 and claim_cap(share, 9) == 5


def test_a_freed_partition_goes_to_a_hungry_member_first() -> None:
    share = fair_share(10, 3)
    counts = {"a": 3, "b": 4, "c": 2}
    assert yields_to_hungry("a", counts, share) and yields_to_hungry("b", counts, share)
    assert not yields_to_hungry("c", counts, share)
    assert not yields_to_hungry("a", {"a": 3, "b": 4, "c": 3}, share)


def test_ask_the_busiest_other_member() -> None:
    owned = {"me": [("t", 0)], "a": [("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4), ("t", 5)]}
    assert partition_to_ask_for(owned, "me") in {("t", 3), ("t", 4), ("t", 5)}
    assert partition_to_ask_for({"me": [("t", 0)]}, "me") is None
    assert partition_to_ask_for({}, "me") is None


# A small model of a fleet: every member sees the same world (as the fold guarantees), each round it
# releases a surplus that has lasted the settle time and claims free partitions up to its cap.


def run_rounds(holdings: dict[int, set[int]], free: set[int], members: int, rounds: int) -> list[dict[int, int]]:
    states = {m: BalanceState() for m in range(members)}
    history = []
    for now in range(rounds):
        share = fair_share(len(free) + sum(len(h) for h in holdings.values()), members)
        counts = {m: len(h) for m, h in holdings.items()}  # one world state, seen by all
        handed_over: dict[int, set[int]] = {m: set() for m in range(members)}
        for m in range(members):
            states[m], surplus = settled_surplus(
                states[m], partitions_to_hand_over(m, counts, share), float(now), SETTLE
            )
            for partition in sorted(holdings[m])[len(holdings[m]) - surplus :] if surplus else []:
                holdings[m].discard(partition)
                handed_over[m].add(partition)
        free |= set().union(*handed_over.values())
        order = random.Random(now).sample(range(members), members)  # who claims first varies, but
        order.sort(key=lambda m: yields_to_hungry(m, counts, share))  # the hungry claim before the rest
        for m in order:
            for partition in sorted(free - handed_over[m]):  # not claimed back by the member that gave it
                if len(holdings[m]) >= claim_cap(share, 0):
                    break
                holdings[m].add(partition)
                free.discard(partition)
        history.append({m: len(h) for m, h in holdings.items()})
    return history


@given(
    members=st.integers(1, 6),
    total=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_fleet_settles_within_the_band_and_then_never_moves(members: int, total: int, seed: int) -> None:
    rng = random.Random(seed)
    holdings: dict[int, set[int]] = {m: set() for m in range(members)}
    free: set[int] = set()
    for partition in range(total):  # any start: one member holding all, some unowned, ...
        owner = rng.randrange(members + 1)
        (free if owner == members else holdings[owner]).add(partition)
    history = run_rounds(holdings, free, members, rounds=10)
    share = fair_share(total, members)
    settled = history[6]
    assert sum(settled.values()) == total, "every partition is owned"
    assert all(share.low <= n <= share.high for n in settled.values()), history
    assert history[6:] == [settled] * 4, "no flapping once settled"
