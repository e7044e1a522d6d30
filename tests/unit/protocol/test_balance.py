"""Fair balance decisions (marshal_workers.protocol.balance): the share, the hysteresis, whom to ask."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.protocol.balance import (
    BalanceState,
    FairShare,
    claim_cap,
    fair_share,
    greedy_claims,
    is_hungry,
    partition_to_ask_for,
    partitions_to_hand_over,
    settled,
    yields_to_askers,
)

SETTLE = 1.0


@pytest.mark.parametrize(
    ("total", "members", "low", "high"),
    [(8, 1, 8, 8), (8, 2, 4, 4), (8, 3, 2, 3), (8, 9, 0, 1), (0, 3, 0, 0), (10, 4, 2, 3)],
)
def test_fair_share_is_the_floor_and_ceiling_of_partitions_per_member(
    total: int, members: int, low: int, high: int
) -> None:
    assert fair_share(total, members) == FairShare(low, high)


@given(st.integers(0, 10_000), st.integers(1, 500))
def test_the_band_always_fits_every_partition(total: int, members: int) -> None:
    share = fair_share(total, members)
    assert 0 <= share.high - share.low <= 1
    assert share.low * members <= total <= share.high * members


def test_no_members_is_a_bug_not_a_share() -> None:
    with pytest.raises(ValueError):
        fair_share(8, 0)


def test_a_need_is_acted_on_only_after_it_has_lasted_the_settle_time() -> None:
    state, give = settled(BalanceState(), 4, now=10.0, settle_s=SETTLE)
    assert give == 0 and state.need_since == 10.0
    state, give = settled(state, 4, now=10.9, settle_s=SETTLE)
    assert give == 0
    state, give = settled(state, 4, now=11.0, settle_s=SETTLE)
    assert give == 4 and state == BalanceState()


def test_a_need_that_goes_away_starts_the_clock_again() -> None:
    state, _ = settled(BalanceState(), 2, now=0.0, settle_s=SETTLE)
    state, give = settled(state, 0, now=0.5, settle_s=SETTLE)  # the asker left, briefly
    assert give == 0 and state == BalanceState()
    state, give = settled(state, 2, now=1.2, settle_s=SETTLE)
    assert give == 0, "the need is new: it must last the settle time again"


def gifts(counts: dict[str, int], asking: set[str]) -> dict[str, int]:
    share = fair_share(sum(counts.values()), len(counts))
    return {m: partitions_to_hand_over(m, counts, share, asking) for m in counts}


def test_a_member_that_asks_gets_half_from_the_one_holding_everything() -> None:
    assert gifts({"a": 8, "b": 0}, asking={"b"}) == {"a": 4, "b": 0}


def test_nobody_gives_unless_someone_asks() -> None:
    assert gifts({"a": 8, "b": 0}, asking=set()) == {"a": 0, "b": 0}
    assert gifts({"a": 5, "b": 4, "c": 1}, asking=set()) == {"a": 0, "b": 0, "c": 0}  # c capped: never asks


@pytest.mark.parametrize("counts", [{"a": 3, "b": 3, "c": 2}, {"a": 3, "b": 2, "c": 3}, {"a": 2, "b": 3, "c": 3}])
def test_nothing_moves_inside_the_band(counts: dict[str, int]) -> None:
    share = fair_share(8, 3)
    assert not any(is_hungry(n, share, max_partitions=0) for n in counts.values())
    assert set(gifts(counts, asking={m for m in counts if is_hungry(counts[m], share, 0)}).values()) == {0}


def test_members_at_the_floor_ask_while_another_holds_more_than_the_ceiling() -> None:
    share = fair_share(8, 3)  # 2 to 3
    assert is_hungry(2, share, 0, others_most=4) and not is_hungry(2, share, 0, others_most=3)
    assert not is_hungry(3, share, 0, others_most=4), "at the ceiling: nothing to ask for"
    assert not is_hungry(2, share, max_partitions=2, others_most=4), "capped at 2"
    assert gifts({"a": 4, "b": 2, "c": 2}, asking={"b", "c"}) == {"a": 1, "b": 0, "c": 0}, "4/2/2 becomes 3/3/2"
    assert gifts({"a": 3, "b": 3, "c": 2}, asking={"c"}) == {"a": 0, "b": 0, "c": 0}, "within the band"


def test_the_busiest_give_one_at_a_time_and_all_agree_who() -> None:
    assert gifts({"a": 4, "b": 4, "c": 2}, asking={"c"}) == {"a": 0, "b": 1, "c": 0}  # ties: by name
    assert gifts({"a": 6, "b": 4, "c": 0}, asking={"c"}) == {"a": 2, "b": 1, "c": 0}  # 6,4 -> 5,4 -> 4,4 -> 4,3
    assert gifts({"a": 5, "b": 5, "c": 0, "d": 0}, asking={"c", "d"}) == {"a": 2, "b": 2, "c": 0, "d": 0}


def test_nobody_gives_below_the_floor() -> None:
    # 4 partitions, 2 of them free (just released, say): b asks, but a holds only its share.
    assert partitions_to_hand_over("a", {"a": 2, "b": 0}, fair_share(4, 2), asking={"b"}) == 0
    assert partitions_to_hand_over("a", {"a": 3, "b": 0}, fair_share(4, 2), asking={"b"}) == 1


def test_hunger_and_the_claim_cap_respect_max_partitions() -> None:
    share = FairShare(4, 5)
    assert is_hungry(3, share, max_partitions=0) and not is_hungry(3, share, max_partitions=3)
    assert claim_cap(share, 0) == 5 and claim_cap(share, 2) == 2 and claim_cap(share, 9) == 5


def test_a_freed_partition_goes_to_an_asking_member_first() -> None:
    share = fair_share(10, 3)
    counts = {"a": 3, "b": 4, "c": 2}
    assert yields_to_askers("a", counts, share, {"c"}) and yields_to_askers("b", counts, share, {"c"})
    assert not yields_to_askers("c", counts, share, {"c"})
    assert not yields_to_askers("a", counts, share, set()), "c is below the floor but not asking: capped"


def test_ask_the_busiest_other_member() -> None:
    owned = {"me": [("t", 0)], "a": [("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4), ("t", 5)]}
    assert partition_to_ask_for(owned, "me") in {("t", 3), ("t", 4), ("t", 5)}
    assert partition_to_ask_for({"me": [("t", 0)], "a": [("t", 1)]}, "me") == ("t", 1)
    assert partition_to_ask_for({"me": [("t", 0)]}, "me") is None
    assert partition_to_ask_for({}, "me") is None


# A model of a fleet: every member sees the same world (as the fold guarantees). Each round a member
# below its share (and its own cap) asks; members hand partitions over to askers once the need has
# lasted the settle time; then the askers claim freed partitions first, up to the share, the others up
# to the share, and a partition free since the last round goes to anyone under its cap.


def run_rounds(
    holdings: dict[int, set[int]], free: set[int], caps: dict[int, int], rounds: int
) -> list[dict[int, int]]:
    members = len(holdings)
    states = {m: BalanceState() for m in range(members)}
    history = []
    long_free = set(free)
    for now in range(rounds):
        share = fair_share(len(free) + sum(len(h) for h in holdings.values()), members)
        counts = {m: len(h) for m, h in holdings.items()}
        asking = {
            m
            for m in range(members)
            if is_hungry(counts[m], share, caps[m], max((n for o, n in counts.items() if o != m), default=0))
        }
        handed_over: dict[int, set[int]] = {m: set() for m in range(members)}
        for m in range(members):
            wanted = partitions_to_hand_over(m, counts, share, asking)
            states[m], count = settled(states[m], wanted, float(now), SETTLE)
            for partition in sorted(holdings[m])[len(holdings[m]) - count :] if count else []:
                holdings[m].discard(partition)
                handed_over[m].add(partition)
        freed = set().union(*handed_over.values())
        free |= freed
        order = random.Random(now).sample(range(members), members)  # who claims first varies
        for m in order:
            yields = yields_to_askers(m, counts, share, asking)
            own_cap = caps[m] or len(free) + len(holdings[m])
            for partition in sorted(free - handed_over[m]):
                fresh = partition not in long_free
                if len(holdings[m]) >= own_cap or (fresh and (yields or len(holdings[m]) >= claim_cap(share, caps[m]))):
                    continue
                holdings[m].add(partition)
                free.discard(partition)
        long_free = set(free)
        history.append({m: len(h) for m, h in holdings.items()})
    return history


@given(
    members=st.integers(1, 6),
    total=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    capped=st.lists(st.integers(0, 3), max_size=6),
)
def test_a_fleet_settles_and_then_never_moves(members: int, total: int, seed: int, capped: list[int]) -> None:
    rng = random.Random(seed)
    caps = {m: capped[m] if m < len(capped) and m > 0 else 0 for m in range(members)}  # member 0 is never capped
    holdings: dict[int, set[int]] = {m: set() for m in range(members)}
    free: set[int] = set()
    for partition in range(total):  # any start: one member holding all, some unowned, above a cap, ...
        owner = rng.randrange(members + 1)
        (free if owner == members else holdings[owner]).add(partition)
    history = run_rounds(holdings, free, caps, rounds=12)
    share = fair_share(total, members)
    settled_counts = history[8]
    assert sum(settled_counts.values()) == total, "every partition is owned"
    for m, n in settled_counts.items():
        assert n >= min(share.low, caps[m] or share.low), f"member {m} below its share and not asking: {history}"
        if not any(caps.values()):  # nobody capped: every share within one of the others (8 over 3: 3/3/2)
            assert share.low <= n <= share.high, history
    assert history[8:] == [settled_counts] * 4, "no flapping once settled"


def test_a_greedy_member_claims_its_part_of_the_free_partitions_and_a_lone_one_takes_them_all() -> None:
    assert greedy_claims(256, 1, 4) == 256
    assert greedy_claims(256, 4, 4) == 64
    assert greedy_claims(10, 4, 4) == 4, "at least a few a round"
    assert greedy_claims(3, 4, 4) == 3, "never more than is free"
    assert greedy_claims(0, 2, 4) == 0
    assert greedy_claims(257, 4, 4) == 65, "rounded up: nothing is left over for lack of a claim"
    with pytest.raises(ValueError):
        greedy_claims(5, 0, 4)
