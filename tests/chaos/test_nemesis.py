"""The nemesis in the suite: half a minute of random faults per delivery mode, then the verdicts.

The suite runs one fixed seed per mode, so a red CI is a regression, not bad
luck; MW_NEMESIS_SEED=<seed> replays another plan, MW_NEMESIS_SEED=random draws
a fresh one (the seed is printed).  The long run (several seeds, 90 s of
faults each) is ``python tests/chaos/run_nemesis.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nemesis import Nemesis, NemesisConfig, seed_from_environment

from marshal_workers.embedded_broker import EmbeddedBroker

pytestmark = [pytest.mark.broker, pytest.mark.chaos, pytest.mark.serial]  # SIGTERM deadlines: run alone

SUITE_FAULT_SECONDS = 24.0
SUITE_SEEDS = {"alo": 98, "amo": 167}  # their 24 s plans meet every kind of fault (test_ledger checks it)


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_random_faults_keep_the_delivery_guarantees(
    mode: str, own_broker: EmbeddedBroker, tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # AMO writes a claim per fetched batch, so its coordination log grows with its workers: on 6 partitions it
    # stays well below the size at which the embedded broker's readers get stuck (README, Brokers).
    partitions, rate = {"alo": (12, 800), "amo": (6, 500)}[mode]
    config = NemesisConfig(
        mode=mode, seed=seed_from_environment(SUITE_SEEDS[mode]), fault_seconds=SUITE_FAULT_SECONDS, rate=rate,
        partitions=partitions,
    )
    with capsys.disabled():
        print(f"\nnemesis {mode}: seed {config.seed} (replay with MW_NEMESIS_SEED={config.seed})")
    report = Nemesis(config, own_broker, tmp_path, unique).run()
    with capsys.disabled():
        print(report.summary())
    assert report.problems == [], report.summary()
    # The run must have been a real test: faults fired, messages flowed, the fleet settled.
    assert report.unclean_faults >= 3 and report.delivered > 10_000 and report.complete_after_s is not None
