"""The simulator can fail: a bug planted in a copy of the fold is caught within a bounded number of seeds, with
the seed to replay it and a smaller run that still breaks."""

from __future__ import annotations

from sim_fleets import planted, small

from marshal_workers.simulation.report import run
from marshal_workers.simulation.simulator import simulate

ENOUGH_SEEDS = 5


def test_a_fold_that_takes_a_live_owners_partition_is_caught() -> None:
    caught = []
    for seed in range(ENOUGH_SEEDS):
        report = simulate(small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0), planted)
        caught += [(seed, v) for v in report["violations"] if v["invariant"] == "one live owner"]
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    seed, violation = caught[0]
    assert "while host-" in violation["detail"] and "lease runs" in violation["detail"]


def test_the_real_fold_holds_where_the_planted_one_breaks() -> None:
    for seed in range(ENOUGH_SEEDS):
        report = simulate(small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0))
        assert report["violations"] == [], seed


def test_a_broken_run_says_how_to_replay_it_and_shrinks_it() -> None:
    ticks = iter(range(1000))
    report = run(small("freeze@10s:member=0,for=7s", members=6, seed=0, balance="greedy", duration_s=40.0),
                 lambda: float(next(ticks)), world=planted)  # fmt: skip
    assert report["violations"]
    assert report["replay"].startswith("marshal-workers simulate --partitions 12 --members 6 ")
    assert "--seed 0 --fault freeze@10s:member=0,for=7s" in report["replay"]
    shrunk = report["shrunk"]
    assert shrunk["violations"] and (shrunk["members"] < 6 or shrunk["duration_s"] < 40.0)
