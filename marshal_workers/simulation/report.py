"""What ``marshal-workers simulate`` prints: the report as text, the command that replays a run, and the fold's
cost per record measured on this machine (the only wall-clock figure: it goes under ``wall``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from marshal_workers.errors import DecodeError
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.simulator import GROUP, Simulation, real_world, shrink

Timer = Callable[[], float]  # seconds on a monotonic clock: the caller's (the simulation reads none)


def run(config: SimConfig, timer: Timer, shrink_failures: bool = True) -> dict[str, Any]:
    """One simulation's report, with ``wall`` (its wall time, and the fold's measured cost) and, if an invariant
    broke, ``replay`` (the command that runs it again) and ``shrunk`` (a smaller run that still breaks one)."""
    started = timer()
    simulation = Simulation(config)
    report = simulation.run()
    seconds = timer() - started
    report["wall"] = {"seconds": round(seconds, 3), **fold_cost(simulation.log.values(), config, timer)}
    if report["violations"]:
        report["replay"] = replay_command(config)
        found = shrink(config) if shrink_failures else None
        if found is not None:
            smaller, smaller_report = found
            report["shrunk"] = {
                "command": replay_command(smaller),
                "members": smaller.members,
                "duration_s": smaller.duration_s,
                "violations": smaller_report["violations"],
            }
    return report


def sweep(config: SimConfig, seeds: int) -> dict[str, Any]:
    """``config`` under ``seeds`` seeds from its own on: how many runs broke an invariant, and the first that did
    (with its replay command).  Wall time is the caller's to measure."""
    broken = []
    for seed in range(config.seed, config.seed + seeds):
        run_config = replace(config, seed=seed)
        report = Simulation(run_config).run()
        if report["violations"]:
            broken.append({"seed": seed, "replay": replay_command(run_config), "violations": report["violations"]})
    return {"runs": seeds, "first_seed": config.seed, "broken": len(broken), "first_broken": broken[:1]}


def replay_command(config: SimConfig) -> str:
    """The command line that runs ``config`` again, byte for byte."""
    faults = "".join(f" --fault {fault}" for fault in config.faults)
    if config.checkpoint_interval_s:
        faults = f" --checkpoint-interval {config.checkpoint_interval_s:g}s" + faults
    defaults = SimConfig()  # the calibration options, only when set (the replay lines of other runs stay as they were)
    if config.start_spread_s != defaults.start_spread_s:
        faults += f" --start-spread {config.start_spread_s * 1000:g}ms"
    if config.position_lookup_s != defaults.position_lookup_s:
        faults += f" --position-lookup {config.position_lookup_s * 1000:g}ms"
    return (
        f"marshal-workers simulate --partitions {config.partitions} --members {config.members} "
        f"--heartbeat-interval {config.heartbeat_s:g}s --duration {config.duration_s:g}s --balance {config.balance} "
        f"--topics {config.topics} --coordination-partitions {config.coordination_partitions} "
        f"{_topic_kinds(config)}--seed {config.seed}{faults}"
    )


def _topic_kinds(config: SimConfig) -> str:
    """The shared and at-most-once options, if any (left out when none: the replay of a run without them)."""
    found = ""
    if config.shared_topics:
        found += f"--shared-topics {config.shared_topics} --pending-timeout {config.pending_timeout_s:g}s "
    if config.amo_topics:
        found += f"--amo-topics {config.amo_topics} "
    return found


def fold_cost(values: list[tuple[int, bytes, int]], config: SimConfig, timer: Timer) -> dict[str, float]:
    """Decode and fold the run's log once with the real codec and fold, timed: what folding it costs a member."""
    world = real_world(config.heartbeat_ms, config.coordination_partitions)
    started = timer()
    for partition, value, at in values:
        try:
            world.apply_value(value, partition, at)
        except DecodeError:
            pass  # never: the simulation wrote them with the real codec
    seconds = timer() - started
    per_record = seconds / len(values) if values else 0.0
    records_per_s = len(values) / config.duration_s
    return {
        "fold_us_per_record": round(per_record * 1e6, 3),
        "fold_share_of_a_core_per_member": round(per_record * records_per_s, 6),
    }


def text(report: dict[str, Any]) -> str:
    """The report for people."""
    lines = [
        f"simulated {report['duration_s']:g}s of group {GROUP!r}: {report['partitions']} partitions, "
        f"{report['members']} members, HB {report['heartbeat_interval_s']:g}s, balance {report['balance']}, "
        f"seed {report['seed']}" + (f", faults: {' '.join(report['faults'])}" if report["faults"] else ""),
        (
            f"every partition owned after {_seconds(report['time_to_own_s'])}, balanced after "
            f"{_seconds(report['time_to_balance_s'])}; {report['handovers']} hand-overs; "
            f"{report['records_per_s']:g} records/s, {report['bytes_per_s']:g} bytes/s"
        ),
    ]
    if "range_records" in report:
        lines.append(
            f"shared and at-most-once topics: {report['range_records_per_s']:g} range-lease records/s, "
            f"{report['message_claim_records_per_s']:g} batch-claim records/s; {report['repeats']} offsets handled "
            f"again (at least once), {report['amo_lost_offsets']} lost (at most once)"
        )
    for phase in report["phases"]:
        lines.append(
            f"  {phase['phase']} ({phase['from_s']:g}s to {phase['to_s']:g}s): owned again after "
            f"{_seconds(phase['time_to_own_s'])}, balanced for good after {_seconds(phase['time_to_balance_s'])}, "
            f"{phase['handovers']} hand-overs, {phase['records_per_s']:g} records/s"
        )
    lines.extend(orders_and_checkpoints_text(report))
    if report["violations"]:
        lines.append(f"INVARIANTS BROKEN ({report['violation_count']}):")
        lines.extend(f"  {v['at_s']:g}s {v['invariant']}: {v['detail']}" for v in report["violations"])
        lines.append(f"replay: {report['replay']}")
        if "shrunk" in report:
            lines.append(f"shrunk: {report['shrunk']['command']}")
    else:
        lines.append("every invariant held")
    wall = report.get("wall")
    if wall:
        lines.append(
            f"wall: {wall['seconds']:.2f}s; the fold costs {wall['fold_us_per_record']:g} us a record, "
            f"{wall['fold_share_of_a_core_per_member'] * 100:.3f}% of a core per member at this rate"
        )
    return "\n".join(lines)


def orders_and_checkpoints_text(report: dict[str, Any]) -> list[str]:
    """The lines about operators' orders and checkpoints, if the run had them."""
    lines = [
        f"  {order['order']}: {order['partitions']} partition(s) given up, the last after "
        f"{_seconds(order['obeyed_after_s'])}"
        if order["partitions"]
        else f"  {order['order']}: nothing to give up"
        for order in report.get("orders", [])
    ]
    made = report.get("checkpoints")
    if made:
        lines.append(
            f"checkpoints every {made['interval_s']:g}s: {made['starts']} members started on a log with records; "
            f"they folded {made['records_folded_at_start']} records to catch up "
            f"({made['records_folded_at_start_without_checkpoints']} without checkpoints)"
        )
    return lines


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:g}s"


def sweep_text(swept: dict[str, Any]) -> str:
    first = swept["first_seed"]
    lines = [
        f"{swept['runs']} runs (seeds {first} to {first + swept['runs'] - 1}): {swept['broken']} broke an invariant"
    ]
    for broken in swept["first_broken"]:
        lines.append(
            f"first: seed {broken['seed']}: {broken['violations'][0]['invariant']}: {broken['violations'][0]['detail']}"
        )
        lines.append(f"replay: {broken['replay']}")
    if "wall" in swept:
        lines.append(f"wall: {swept['wall']['seconds']:.1f}s")
    return "\n".join(lines)
