"""The simulator can fail: a bug planted in what ships (the fold, the member core) is caught within a bounded number
of seeds, with the seed to replay it and a smaller run that still breaks."""

from __future__ import annotations

from typing import Any

import pytest
from range_fleets import mixed
from sim_fleets import small, takes_live_claims

from marshal_workers.member import at_most_once, checkpoint_writing, partition_holding, range_leasing
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.faults import parse_fault
from marshal_workers.simulation.report import run
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.simulator import simulate

ENOUGH_SEEDS = 5


def test_a_fold_that_takes_a_live_owners_partition_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    takes_live_claims(monkeypatch)
    caught = []
    for seed in range(ENOUGH_SEEDS):
        report = simulate(small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0))
        caught += [(seed, v) for v in report["violations"] if v["invariant"] == "one live owner"]
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    seed, violation = caught[0]
    assert "while host-" in violation["detail"] and "lease runs" in violation["detail"]


def test_the_real_fold_holds_where_the_planted_one_breaks() -> None:
    for seed in range(ENOUGH_SEEDS):
        report = simulate(small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0))
        assert report["violations"] == [], seed


def test_a_broken_run_says_how_to_replay_it_and_shrinks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    takes_live_claims(monkeypatch)
    ticks = iter(range(1000))
    report = run(
        small("freeze@10s:member=0,for=7s", members=6, seed=0, balance="greedy", duration_s=40.0),
        lambda: float(next(ticks)),
    )
    assert report["violations"]
    assert report["replay"].startswith("marshal-workers simulate --partitions 12 --members 6 ")
    assert "--seed 0 --fault freeze@10s:member=0,for=7s" in report["replay"]
    shrunk = report["shrunk"]
    assert shrunk["violations"] and (shrunk["members"] < 6 or shrunk["duration_s"] < 40.0)


# ------------------------------------------------------- bugs planted in the member core
#
# The member core (marshal_workers/member/) is what the supervisor runs: each bug below is planted in it, where it
# ships, and the simulator's members run it (docs/architecture.md, "The member core").


def caught_by(invariant: str, configs: list[SimConfig]) -> list[dict[str, Any]]:
    """The violations of ``invariant`` in the runs of ``configs``."""
    return [v for config in configs for v in simulate(config)["violations"] if v["invariant"] == invariant]


def test_a_member_core_that_holds_a_lease_past_the_folds_takeover_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2.5 HB after the accepted record: past the 2*HB after which the fold lets another member take over.
    monkeypatch.setattr(partition_holding, "lease_until", lambda written_ms, hb_ms: written_ms + int(2.5 * hb_ms))
    caught = caught_by(
        "one live owner",
        [small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0) for seed in range(ENOUGH_SEEDS)],
    )
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    assert "lease runs" in caught[0]["detail"]


def test_a_member_core_that_takes_an_unconfirmed_batch_claim_for_claimed_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = at_most_once.ClaimAnswer
    monkeypatch.setattr(
        at_most_once, "answer_of", lambda verdict: answers.REFUSED if verdict is False else answers.CLAIMED
    )
    caught = caught_by(
        "at most once",
        [mixed("lose-writes@10s:members=1,for=10s", duration_s=30.0, seed=seed) for seed in range(ENOUGH_SEEDS)],
    )
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    assert "handled a second time" in caught[0]["detail"]


def test_a_member_core_that_takes_a_refused_range_claim_for_won_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(range_leasing, "per_entry", lambda verdict, count: [True] * count)
    caught = caught_by("one live holder (ranges)", [mixed(duration_s=30.0, seed=seed) for seed in range(ENOUGH_SEEDS)])
    assert caught, f"no seed of {ENOUGH_SEEDS} caught the planted bug"
    assert "taken by a worker while a worker's lease on" in caught[0]["detail"]


def test_a_member_core_that_writes_checkpoints_without_positions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = checkpoint_writing.state_records

    def state_records(world: WorldState, source: int, as_of: int, common: dict[str, Any]) -> list[codec.Checkpoint]:
        without = world.snapshot()
        for found in without.partitions.values():
            found.offset = None
        return real(without, source, as_of, common)

    monkeypatch.setattr(checkpoint_writing, "state_records", state_records)
    faults = tuple(parse_fault(f) for f in ("crash@15s:members=1", "join@25s"))
    caught = caught_by("checkpoints agree", [small(seed=0, duration_s=40.0, checkpoint_interval_s=5.0, faults=faults)])
    assert caught, "the planted bug was not caught"
    assert ".offset = None, the whole log " in caught[0]["detail"]


def test_the_real_member_core_holds_where_the_planted_bugs_break() -> None:
    runs = [small("freeze@10s:for=7s", seed=seed, balance="greedy", duration_s=30.0) for seed in range(ENOUGH_SEEDS)]
    runs += [mixed("lose-writes@10s:members=1,for=10s", duration_s=30.0, seed=seed) for seed in range(ENOUGH_SEEDS)]
    runs += [mixed(duration_s=30.0, seed=seed) for seed in range(ENOUGH_SEEDS)]
    faults = tuple(parse_fault(f) for f in ("crash@15s:members=1", "join@25s"))
    runs.append(small(seed=0, duration_s=40.0, checkpoint_interval_s=5.0, faults=faults))
    for config in runs:
        assert simulate(config)["violations"] == [], config
