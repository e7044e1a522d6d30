"""Shared (range-lease) and at-most-once topics in the simulator: the real range and batch-claim decisions and fold
rules, under every fault kind, with their invariants; bugs planted in those rules (as they ship) are caught."""

from __future__ import annotations

import json

import pytest
from processes import CLI, run_command
from range_fleets import forgets_claimed_end, mixed, overlapping_claims
from sim_fleets import EVERY_KIND

from marshal_workers.simulation.handled_runs import HandledRuns
from marshal_workers.simulation.report import run, text
from marshal_workers.simulation.simulator import simulate

ENOUGH_SEEDS = 5


def test_same_seed_same_run_with_shared_and_amo_topics() -> None:
    config = mixed("crash@10s:members=1", "freeze@20s:for=8s", duration_s=40.0, seed=3)
    first, second = simulate(config), simulate(config)
    assert first == second
    assert first["range_records"] > 0 and first["message_claim_records"] > 0
    assert first["low_water_marks"], "the shared topics' partitions moved on"


def test_same_seed_same_output_across_processes() -> None:
    command = [
        *CLI,
        "simulate",
        "--partitions",
        "8",
        "--members",
        "2",
        "--topics",
        "2",
        "--shared-topics",
        "1",
        "--amo-topics",
        "2",
        "--duration",
        "20s",
        "--seed",
        "5",
        "--fault",
        "crash@5s:members=1",
        "--json",
    ]
    outputs = []
    for hash_seed in ("1", "2"):
        done = run_command(command, {"PYTHONHASHSEED": hash_seed}, timeout=120)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        report.pop("wall")
        outputs.append(report)
    assert outputs[0] == outputs[1]
    assert outputs[0]["range_records_per_s"] > 0 and outputs[0]["amo_lost_offsets"] >= 0


@pytest.mark.parametrize("kind", sorted(EVERY_KIND))
def test_every_fault_kind_breaks_no_range_or_amo_invariant(kind: str) -> None:
    for seed in range(2):
        report = simulate(mixed(EVERY_KIND[kind], seed=seed, duration_s=45.0))
        assert report["violations"] == [], (kind, seed)


def test_a_freeze_past_the_lease_loses_at_most_once_offsets_but_never_hands_one_out_twice() -> None:
    lost = 0
    for seed in range(4):
        report = simulate(mixed("freeze@10s:members=2,for=9s", seed=seed, duration_s=40.0))
        assert report["violations"] == [], seed
        assert report["amo_repeats"] == 0
        lost += report["amo_lost_offsets"]
    assert lost > 0, "a lease or claim that lapsed loses its offsets at most once"


def test_a_fold_that_leases_offsets_a_live_lease_holds_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    overlapping_claims(monkeypatch)
    caught = []
    for seed in range(ENOUGH_SEEDS):
        report = simulate(mixed(duration_s=30.0, seed=seed))
        caught += [v for v in report["violations"] if v["invariant"] == "one live holder (ranges)"]
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    assert "while a worker's lease on" in caught[0]["detail"]


def test_a_fold_that_forgets_the_batch_claimed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    forgets_claimed_end(monkeypatch)
    caught = []
    for seed in range(ENOUGH_SEEDS):
        report = simulate(mixed("crash@10s:members=1", duration_s=30.0, seed=seed))
        caught += [v for v in report["violations"] if v["invariant"] == "at most once"]
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    assert "handled a second time" in caught[0]["detail"]


def test_the_real_fold_holds_where_the_planted_ones_break() -> None:
    for seed in range(ENOUGH_SEEDS):
        assert simulate(mixed(duration_s=30.0, seed=seed))["violations"] == [], seed
        assert simulate(mixed("crash@10s:members=1", duration_s=30.0, seed=seed))["violations"] == [], seed


def test_handled_runs_count_what_is_handled_again() -> None:
    runs = HandledRuns()
    key = ("t", 0)
    assert runs.add(key, 0, 10) == 0
    assert runs.add(key, 20, 30) == 0
    assert runs.add(key, 5, 25) == 10  # 5..9 and 20..24 again
    assert runs.covered(key, 0, 30) and not runs.covered(key, 0, 31)
    assert runs.missing(key, 0, 40) == 30
    assert runs.count_below(key, 12) == 12
    assert runs.repeats == 10


def test_a_broken_run_with_shared_topics_replays_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    overlapping_claims(monkeypatch)
    ticks = iter(range(1000))
    report = run(mixed(duration_s=30.0, seed=0), lambda: float(next(ticks)), False)
    assert report["violations"]
    assert "--topics 4 " in report["replay"]
    assert "--shared-topics 2 --pending-timeout 6s --amo-topics 3 --seed 0" in report["replay"]
    assert "shared and at-most-once topics:" in text(report)
