"""Small fleets under every fault kind, over a fixed set of seeds: every invariant holds, and each fault did
what it says (the runs are not vacuous)."""

from __future__ import annotations

import pytest
from sim_fleets import EVERY_KIND, SEEDS, small

from marshal_workers.simulation.simulator import simulate


@pytest.mark.parametrize("balance", ["fair", "greedy"])
@pytest.mark.parametrize("kind", sorted(EVERY_KIND))
def test_every_invariant_holds_under_each_fault(kind: str, balance: str) -> None:
    for seed in SEEDS:
        report = simulate(small(EVERY_KIND[kind], seed=seed, balance=balance))
        assert report["violations"] == [], (kind, seed, report["violations"])
        assert report["time_to_own_s"] is not None and report["time_to_own_s"] < 2 * 2.0
        moves = {"crash", "freeze", "lose-writes", "leave", "slow"} | ({"join"} if balance == "fair" else set())
        if kind in moves:  # greedy balance gives a joining member nothing
            assert report["handovers"] > 0, f"{kind} moved no partition (seed {seed}): the fault did nothing"


def test_a_fleet_settles_balanced_and_stays_so_without_faults() -> None:
    report = simulate(small(partitions=32, members=5))
    assert report["violations"] == []
    assert report["time_to_balance_s"] is not None
    (phase,) = report["phases"]
    assert phase["time_to_balance_s"] is not None, "balanced for good by the end"
    assert report["records_per_s"] == pytest.approx(5 * 2 / 2.0, rel=0.1), "one heartbeats record per member and HB/2"


def test_many_members_crashing_at_once_are_recovered_from_within_the_bound() -> None:
    report = simulate(small("crash@20s:members=4,for=never", partitions=40, members=8))
    assert report["violations"] == []
    after = report["phases"][1]
    assert after["time_to_own_s"] is not None and after["time_to_own_s"] <= 10 * 2.0
    assert after["handovers"] >= 4 * 40 // 8 - 1, "the dead members' partitions moved to the living"


def test_clock_skew_changes_nothing_but_the_ts_field() -> None:
    """The fold uses the broker's record time: who owns what, and when, is the same with a member's clock off."""
    plain = simulate(small(seed=7))
    for by in ("3s", "-3s", "45s"):
        skewed = simulate(small(f"skew@0s:member=0,by={by}", seed=7))
        assert skewed["ownership_digest"] == plain["ownership_digest"], by
        assert (skewed["handovers"], skewed["records"]) == (plain["handovers"], plain["records"])


def test_a_slow_handler_has_its_partitions_handed_over() -> None:
    report = simulate(small("slow@5s:member=0,for=never", duration_s=60.0))
    assert report["violations"] == []
    assert report["phases"][1]["handovers"] >= 12 // 3, "every partition of the slow member moved"


@pytest.mark.parametrize("by", ["3s", "-3s", "10s", "-10s"])
def test_a_members_decisions_on_a_skewed_clock_never_break_safety(by: str) -> None:
    """A member whose wall clock is off decides on it (what is stale, who is live); the fold's record time keeps
    every claim safe whatever the skew.  Balance needs clocks within 2*HB of each other (docs/simulation.md)."""
    for seed in SEEDS:
        report = simulate(small(f"skew@0s:member=1,by={by},of=clock", seed=seed, duration_s=150.0))
        safety = [v for v in report["violations"] if v["invariant"] in ("one live owner", "nothing skipped")]
        assert safety == [], (by, seed)
        if by in ("3s", "-3s"):
            assert report["violations"] == [], (by, seed)
