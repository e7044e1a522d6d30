"""What the calibration against a real fleet added to the simulator (docs/simulation.md, "Calibration"): heartbeats
the size of a real supervisor's, the members' start spread, and the position lookup after a claim won."""

from __future__ import annotations

import json
from dataclasses import replace

from click.testing import CliRunner
from sim_fleets import EVERY_KIND, small

from marshal_workers.cli import main
from marshal_workers.protocol import codec
from marshal_workers.simulation.report import replay_command
from marshal_workers.simulation.simulator import Simulation

CALIBRATED = {"start_spread_s": 0.3, "position_lookup_s": 0.1}


def _run(**fields: object) -> Simulation:
    simulation = Simulation(small(**fields))
    simulation.run()
    return simulation


def test_heartbeats_report_lag_and_rate_as_a_real_supervisor_does() -> None:
    """A real supervisor's beats carry the worker's lag and consume rate; the simulated ones must too, or the
    simulated bytes per second are a third short of a real fleet's."""
    simulation = _run(duration_s=20.0)
    beats = [
        beat
        for entry in simulation.log.partitions[0]
        if type(entry.record) is codec.Heartbeats and entry.appended > 10
        for beat in entry.record.beats
    ]
    assert beats and all(beat.lag is not None and beat.rate is not None for beat in beats)
    assert all(beat.lag >= 0 for beat in beats) and any(beat.rate > 0 for beat in beats)


def _first_records(simulation: Simulation) -> dict[str, float]:
    first: dict[str, float] = {}
    for entry in simulation.log.partitions[0]:
        first.setdefault(entry.record.client, entry.appended)
    return first


def test_members_start_over_the_start_spread() -> None:
    """Launched together, real supervisors start claiming up to half a second apart (the order in which they
    claim decides the collisions); the default keeps every member within one pass of the loop."""
    spreads = []
    for seed in range(6):
        first = _first_records(_run(seed=seed, duration_s=5.0, start_spread_s=1.0))
        assert len(first) == 3 and max(first.values()) < 1.1
        spreads.append(max(first.values()) - min(first.values()))
    assert max(spreads) > 0.3
    default = _first_records(_run(duration_s=5.0))
    assert max(default.values()) < 0.15


def test_a_position_lookup_delays_the_first_heartbeat_after_a_claim() -> None:
    """A partition with no position in the log is looked up in Kafka before its worker starts: the heartbeat
    that tells the log where it resumes comes at least half the lookup after the claim's verdict is read."""
    simulation = _run(duration_s=5.0, position_lookup_s=0.4)
    log = simulation.log.partitions[0]
    claims = {
        (entry.record.client, entry.record.partition): entry.appended
        for entry in log
        if type(entry.record) is codec.Claim
    }
    beaten: dict[tuple[str, int], float] = {}
    for entry in log:
        if type(entry.record) is codec.Heartbeats:
            for beat in entry.record.beats:
                beaten.setdefault((entry.record.client, beat.partition), entry.appended)
    assert beaten and all(beaten[key] - claims[key] >= 0.2 for key in beaten)
    without = _run(duration_s=5.0)
    assert without.report()["time_to_own_s"] < simulation.report()["time_to_own_s"]


def test_the_calibrated_settings_break_no_invariant_under_every_fault_kind() -> None:
    for kind, fault in EVERY_KIND.items():
        report = Simulation(small(fault, **CALIBRATED)).run()
        assert report["violations"] == [], (kind, report["violations"][:3])


def test_the_replay_command_carries_the_calibration_and_reruns_the_same_run() -> None:
    config = replace(small(**CALIBRATED), duration_s=20.0, seed=3)
    command = replay_command(config)
    assert "--start-spread 300ms --position-lookup 100ms" in command
    assert "--start-spread" not in replay_command(small())  # other runs' replay lines stay as they were
    result = CliRunner().invoke(main, [*command.split()[1:], "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ownership_digest"] == Simulation(config).run()["ownership_digest"]
