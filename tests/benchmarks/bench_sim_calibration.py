"""The simulator's side of the calibration against bench_scale.py (docs/simulation.md, "Calibration").

    /work/venv/bin/python tests/benchmarks/bench_sim_calibration.py [--partitions 256] [--members 4] [--seeds 1-5]

Runs ``marshal-workers simulate``'s Simulation for each seed (``--balance fair``, HB 2 s, 60 simulated
seconds) and prints the figures bench_scale.py measures, measured the way it measures them:

* every partition owned and fresh, and balanced, sampled every 20 ms (bench_scale.py polls its tail every
  20 ms; the command samples every HB/10, 200 ms, which rounds its times up to the next 0.2 s), counted from
  the first record of all (bench_scale.py's third line counts from there too: process start-up is not
  simulated) and from the start of the run;
* coordination records and bytes per second over the last ``--window`` seconds (the fleet is settled).

Deterministic: the same seeds print the same figures.  ``--real DUMP`` (repeatable: a file bench_scale.py
``--dump`` wrote) measures a real fleet's coordination log the same way: the records folded in order by the
real fold (``WorldState``) at their broker times, sampled every 20 ms from the first record; records and bytes
per second over its last ``--window`` seconds.  So both sides' figures have one definition, and the tail's
polling and reading lag (in bench_scale.py's own figures) drop out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from checkout import ROOT  # noqa: F401  (the checkout on sys.path)

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.simulator import Simulation

SAMPLE_S = 0.02  # as bench_scale.py polls its tail


def seeds_of(text: str) -> list[int]:
    """``1-5`` or ``1,3,7``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def one_run(config: SimConfig, window: float) -> dict[str, float]:
    sim = Simulation(config)
    sim.sample_s = SAMPLE_S
    sim.run()
    entries = [entry for log in sim.log.partitions for entry in log]
    first = min(entry.appended for entry in entries)
    owned = next(s.at for s in sim.samples if s.owned)
    balanced = next(s.at for s in sim.samples if s.owned and s.spread is not None and s.spread <= 1)
    settled = [entry for entry in entries if entry.appended >= config.duration_s - window]
    return {
        "first_record_s": first,
        "owned_s": owned,
        "balanced_s": balanced,
        "owned_from_first_s": owned - first,
        "balanced_from_first_s": balanced - first,
        "records_per_s": len(settled) / window,
        "bytes_per_s": sum(len(entry.value) for entry in settled) / window,
    }


def real_run(path: Path, partitions: int, heartbeat_s: float, window: float) -> dict[str, float]:
    """A bench_scale.py dump, folded and sampled as ``one_run`` samples a simulation (times from its first record)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    # In log order: by offset within a coordination partition.  The record times need not grow with the offsets
    # (a broker that keeps the producer's time, as the embedded one does: a batch made first may land second), so
    # a record counts from the latest time at or before it in its partition.
    lines.sort(key=lambda r: (r["partition"], r["offset"]))
    latest: dict[int, int] = {}
    for line in lines:
        line["broker_ms"] = latest[line["partition"]] = max(line["broker_ms"], latest.get(line["partition"], 0))
    lines.sort(key=lambda r: (r["broker_ms"], r["partition"], r["offset"]))
    records = [(line, codec.decode(line["value"].encode())) for line in lines]
    claims = [record for _, record in records if type(record) is codec.Claim]
    topic, group = claims[0].topic, claims[0].group
    members = len({record.client for record in claims})
    hb_ms = round(heartbeat_s * 1000)
    world = WorldState(group, hb_ms, max(line["partition"] for line in lines) + 1)
    first, last = lines[0]["broker_ms"], lines[-1]["broker_ms"]
    owned_at = balanced_at = None
    folded, now = 0, first
    while balanced_at is None and now <= last:
        while folded < len(records) and records[folded][0]["broker_ms"] <= now:
            line, record = records[folded]
            world.apply(record, line["broker_ms"], line["partition"])
            folded += 1
        counts: dict[MemberId, int] = {}
        owned = True
        for p in range(partitions):
            state = world.partitions.get((topic, p))
            if state is None or state.owner is None or now - state.last_ts >= hb_ms:
                owned = False
                break
            counts[state.owner] = counts.get(state.owner, 0) + 1
        if owned:
            owned_at = now if owned_at is None else owned_at
            if len(counts) == members and max(counts.values()) - min(counts.values()) <= 1:
                balanced_at = now
        now += round(SAMPLE_S * 1000)
    settled = [line for line in lines if line["broker_ms"] > last - window * 1000]
    return {
        "first_record_s": 0.0,
        "owned_s": float("nan") if owned_at is None else (owned_at - first) / 1000,
        "balanced_s": float("nan") if balanced_at is None else (balanced_at - first) / 1000,
        "owned_from_first_s": float("nan") if owned_at is None else (owned_at - first) / 1000,
        "balanced_from_first_s": float("nan") if balanced_at is None else (balanced_at - first) / 1000,
        "records_per_s": len(settled) / window,
        "bytes_per_s": sum(line["bytes"] for line in settled) / window,
    }


def summary(runs: list[dict[str, float]]) -> None:
    for name in ("owned_from_first_s", "balanced_from_first_s", "records_per_s", "bytes_per_s"):
        values = [run[name] for run in runs]
        print(f"  {name}: median {statistics.median(values):.3f}, {min(values):.3f} to {max(values):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--heartbeat-interval", type=float, default=2.0, help="seconds")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds")
    parser.add_argument("--window", type=float, default=20.0, help="seconds, at the end, over which traffic is counted")
    parser.add_argument("--start-spread", type=float, default=0.3, help="seconds (SimConfig.start_spread_s)")
    parser.add_argument("--position-lookup", type=float, default=0.1, help="seconds (SimConfig.position_lookup_s)")
    parser.add_argument("--real", type=Path, action="append", default=[], help="a bench_scale.py --dump file")
    args = parser.parse_args()
    if args.real:
        real = []
        print(f"measured (bench_scale.py dumps), sampled every {SAMPLE_S * 1000:g} ms from the first record:")
        for path in args.real:
            run = real_run(path, args.partitions, args.heartbeat_interval, args.window)
            real.append(run)
            print(
                f"  {path.name}: owned after {run['owned_from_first_s']:.2f}s, balanced after "
                f"{run['balanced_from_first_s']:.2f}s; settled: {run['records_per_s']:.2f} records/s, "
                f"{run['bytes_per_s']:.0f} bytes/s"
            )
        summary(real)
    runs = []
    print(
        f"simulated: {args.partitions} partitions, {args.members} members, HB {args.heartbeat_interval:g}s, "
        f"balance fair, start spread {args.start_spread:g}s, position lookup {args.position_lookup:g}s, "
        f"sampled every {SAMPLE_S * 1000:g} ms"
    )
    for seed in seeds_of(args.seeds):
        config = SimConfig(
            partitions=args.partitions,
            members=args.members,
            heartbeat_s=args.heartbeat_interval,
            duration_s=args.duration,
            seed=seed,
            balance="fair",
            start_spread_s=args.start_spread,
            position_lookup_s=args.position_lookup,
        )
        run = one_run(config, args.window)
        runs.append(run)
        print(
            f"  seed {seed}: first record at {run['first_record_s']:.3f}s; from it: owned after "
            f"{run['owned_from_first_s']:.2f}s, balanced after {run['balanced_from_first_s']:.2f}s "
            f"(from the start: {run['owned_s']:.2f}s, {run['balanced_s']:.2f}s); settled: "
            f"{run['records_per_s']:.2f} records/s, {run['bytes_per_s']:.0f} bytes/s"
        )
    summary(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
