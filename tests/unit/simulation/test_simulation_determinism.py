"""One seed gives one run, byte for byte: twice in one process, and in two processes whose str hashing differs."""

from __future__ import annotations

import json
from pathlib import Path

from processes import CLI, run_command
from sim_fleets import small

from marshal_workers.simulation.simulator import simulate

ROOT = Path(__file__).resolve().parents[3]
FAULTS = [
    "--fault",
    "crash@10s:members=1",
    "--fault",
    "freeze@20s:for=7s",
    "--fault",
    "join@30s:members=2",
    "--fault",
    "slow@5s:member=2,for=10s",
    "--fault",
    "lose-writes@40s:for=3s",
]


def test_the_same_seed_twice_gives_the_same_report() -> None:
    config = small("crash@10s:members=1", seed=11)
    first, second = simulate(config), simulate(config)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    other = simulate(small("crash@10s:members=1", seed=12))
    assert other["ownership_digest"] != first["ownership_digest"], "the seed matters: another gives another run"


def simulate_in_a_process(hash_seed: str) -> dict:
    command = [
        *CLI,
        "simulate",
        "--partitions",
        "24",
        "--members",
        "4",
        "--duration",
        "60s",
        "--seed",
        "5",
        "--coordination-partitions",
        "3",
        "--topics",
        "3",
        "--json",
        *FAULTS,
    ]
    result = run_command(command, {"PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report.pop("wall")["seconds"] > 0  # the only figure that may differ
    return report


def test_two_processes_with_different_str_hashing_print_the_same_json() -> None:
    first, second = simulate_in_a_process("1"), simulate_in_a_process("2")
    assert first == second
    assert first["handovers"] > 0 and len(first["phases"]) == 6
