"""Operators' orders and checkpoints in a simulation: members obey orders (release, drain, resume, pause,
shutdown) within the bound without breaking a safety invariant; members that start load the latest checkpoint
and the log after it, and their fold agrees with a fold of the whole log; a planted bug in either is caught."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from processes import CLI, run_command
from sim_fleets import SEEDS, small

from marshal_workers.cli import main
from marshal_workers.errors import ConfigError
from marshal_workers.member import obeying
from marshal_workers.protocol import checkpoints
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.orders import Orders, orders_for
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.faults import parse_fault
from marshal_workers.simulation.report import replay_command
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.simulator import Simulation, simulate

ROOT = Path(__file__).resolve().parents[3]
ORDERS = (
    "order@12s:release,member=1",
    "order@16s:drain,member=2",
    "order@24s:resume,member=2",
    "order@30s:pause,topic=t0,for=6s",
    "order@40s:shutdown,member=0",
)
RESTARTS = ("crash@20s:members=1", "join@45s")


def with_orders_and_checkpoints(seed: int, balance: str = "fair", extra: tuple[str, ...] = ()) -> SimConfig:
    faults = tuple(parse_fault(f) for f in (*ORDERS, *RESTARTS, *extra))
    return small(seed=seed, balance=balance, duration_s=90.0, checkpoint_interval_s=5.0, faults=faults)


@pytest.mark.parametrize("balance", ["fair", "greedy"])
def test_orders_are_obeyed_and_restarts_start_at_checkpoints_with_every_invariant_held(balance: str) -> None:
    for seed in SEEDS:
        report = simulate(with_orders_and_checkpoints(seed, balance))
        assert report["violations"] == [], (seed, report["violations"])
        for order in report["orders"]:
            assert order["obeyed_after_s"] is not None and order["obeyed_after_s"] <= 2 * 2.0 + 1.0, (seed, order)
        given_up = {order["order"].split(",")[0]: order["partitions"] for order in report["orders"]}
        if balance == "fair":  # every member holds a share: each order gives something up
            for action, at in (("release", 12), ("drain", 16), ("pause", 30), ("shutdown", 40)):
                assert given_up[f"order@{at}s:{action}"] > 0, f"{action} gave up nothing (seed {seed})"
        else:  # greedy: the first to claim may hold everything; the others, nothing to give up
            assert sum(given_up.values()) > 0, f"no order gave anything up (seed {seed})"
        made = report["checkpoints"]
        assert made["starts"] == 2, "the crashed member's restart and the joining member"
        assert made["records_folded_at_start"] < made["records_folded_at_start_without_checkpoints"] / 3, made
        assert made["compared"] >= 2 * made["starts"], "each start compared at load and after reading on"


def test_orders_do_what_they_say() -> None:
    faults = tuple(
        parse_fault(f)
        for f in ("order@10s:drain,member=1", "order@20s:shutdown,member=2", "order@30s:pause,topic=t0,for=8s")
    )
    simulation = Simulation(small(seed=3, duration_s=60.0, members=4, faults=faults))
    report = simulation.run()
    assert report["violations"] == []
    held = {owner.client for key in simulation.keys if (owner := simulation.oracle.owner(*key)) is not None}
    assert "host-0001" not in held, "a drained member (never resumed) holds nothing"
    assert "host-0002" not in held and not simulation.hosts[2].member.alive, "a shut-down member left"  # type: ignore[union-attr]
    assert held == {"host-0000", "host-0003"}
    paused = next(p for p in report["phases"] if p["phase"].startswith("after order@30s:pause"))
    assert paused["time_to_own_s"] >= 8.0, "nobody claims a paused topic until its pause ends"


def test_a_drained_member_claims_again_once_resumed() -> None:
    faults = tuple(parse_fault(f) for f in ("order@10s:drain,member=1", "order@20s:resume,member=1"))
    simulation = Simulation(small(seed=1, duration_s=90.0, faults=faults))
    report = simulation.run()
    assert report["violations"] == []
    shares = [
        sum(1 for key in simulation.keys if simulation.oracle.owner(*key) == host.member.me)  # type: ignore[union-attr]
        for host in simulation.hosts
    ]
    assert shares == [4, 4, 4], "balanced again, the resumed member with its share"


def test_the_same_seed_gives_the_same_run_with_orders_and_checkpoints() -> None:
    config = with_orders_and_checkpoints(5)
    first, second = simulate(config), simulate(config)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert simulate(replace(config, seed=6))["ownership_digest"] != first["ownership_digest"]


def test_two_processes_with_different_str_hashing_print_the_same_json() -> None:
    faults = [arg for fault in (*ORDERS, *RESTARTS) for arg in ("--fault", fault)]
    command = [
        *CLI,
        "simulate",
        "--partitions",
        "12",
        "--members",
        "3",
        "--duration",
        "60s",
        "--seed",
        "5",
        "--coordination-partitions",
        "2",
        "--topics",
        "2",
        "--checkpoint-interval",
        "5s",
        "--json",
        *faults,
    ]
    reports = []
    for hash_seed in ("1", "2"):
        env = {"PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        result = run_command(command, env, timeout=120, cwd=ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        report.pop("wall")
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["checkpoints"]["starts"] == 2 and len(reports[0]["orders"]) == len(ORDERS)


# --------------------------------------------------------------- planted bugs


def ignores_releases(world: WorldState, me: MemberId, started_ms: int, now_ms: int) -> Orders:
    """A bug to plant in the member core: its reading of the orders never sees a release order."""
    return replace(orders_for(world, me, started_ms, now_ms), release=frozenset())


def drops_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the checkpoint load that ships (what a member starting at checkpoints runs): every
    partition's position is dropped."""
    real = checkpoints.begin

    def begin(state: WorldState, start: checkpoints.Start, source: int) -> None:
        real(state, start, source)
        for found in state.partitions.values():
            found.offset = None

    monkeypatch.setattr(checkpoints, "begin", begin)


def test_a_member_that_ignores_release_orders_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(obeying, "orders_for", ignores_releases)  # in the member core, which supervisors run too
    violations = simulate(with_orders_and_checkpoints(0))["violations"]
    assert violations and {v["invariant"] for v in violations} == {"orders obeyed"}
    assert "still held by host-0001/" in violations[0]["detail"] and "release,member=1" in violations[0]["detail"]


def test_a_checkpoint_load_that_drops_positions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    drops_positions(monkeypatch)
    violations = simulate(with_orders_and_checkpoints(0))["violations"]
    assert violations and violations[0]["invariant"] == "checkpoints agree"
    assert ".offset = None, the whole log " in violations[0]["detail"]


def test_the_real_code_holds_where_the_planted_bugs_break() -> None:
    assert simulate(with_orders_and_checkpoints(0))["violations"] == []


# --------------------------------------------------------------- the command


def test_orders_read_back_as_written_and_replay_with_checkpoints() -> None:
    for text in ORDERS:
        assert str(parse_fault(text)) == text
    command = replay_command(with_orders_and_checkpoints(0))
    assert " --checkpoint-interval 5s --fault order@12s:release,member=1 " in command


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("order@10s", "ACTION one of release"),
        ("order@10s:evict,member=1", "ACTION one of release"),
        ("order@10s:drain,rate=3", "order takes member"),
    ],
)
def test_a_bad_order_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_fault(text)


def test_a_run_prints_what_orders_and_checkpoints_did() -> None:
    args = [
        "simulate",
        "--partitions",
        "8",
        "--members",
        "3",
        "--duration",
        "40s",
        "--checkpoint-interval",
        "5s",
        "--fault",
        "order@10s:release,member=0",
        "--fault",
        "crash@15s:member=1",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "order@10s:release,member=0: 1 partition(s) given up, the last after " in result.output
    assert "checkpoints every 5s: 1 members started on a log with records; they folded " in result.output
    assert "every invariant held" in result.output
