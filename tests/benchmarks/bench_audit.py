"""Benchmark: ``marshal-workers audit`` on Spark (local[2]) over a 1,000,000-record coordination log.

    python tests/benchmarks/bench_audit.py [--records 1000000] [--seed 1] [--runs 2] [--master local[2]]

The log is bench_fold.py's realistic one (one busy group and two smaller ones,
claim races, releases, restarts, crashes, pauses, zombies, ~0.1% garbage),
built in memory, then produced to a coordination topic of 8 partitions on an
embedded broker (Tansu) started here, each record on the partition a member
would write it to, outside the timed part.  Then, in one run:

a. baseline, one core, no Kafka: ``codec.decode`` + ``WorldState.apply`` of
   every value in memory (the ceiling of a single reader);
b. baseline, one process reading Kafka: ``read_group_state`` (what ``status``
   does: consume every coordination partition, decode, fold);
c. the audit on ``local[2]``: one task per coordination partition reads,
   decodes and folds it; then the figures (hand-overs, zombies, clients);
d. the same with ``--out``: the six Parquet tables written too.

Rates are records of the whole log per second (all groups, garbage included:
the audit reads them all).  The Spark session is started once, before (its
start-up is printed, not counted); c and d run ``--runs`` times, interleaved,
best counts.  The audit's figures are checked against baseline a's fold: the
same records, partitions and owners, or the benchmark says MISMATCH.
A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import bench_fold
import bench_run
import checkout  # noqa: F401 - puts the checkout on sys.path
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.errors import DecodeError
from marshal_workers.kafka.coordination_reader import read_group_state
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.spark.audit import AuditReport, audit, plan_log
from marshal_workers.spark.session import start_session, stop_session

T = TypeVar("T")
COORDINATION_TOPIC = "__marshal-bench-audit"


def timed(action: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def produce_log(bootstrap: str, log: bench_fold.Log) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(COORDINATION_TOPIC, num_partitions=bench_fold.COORDINATION_PARTITIONS, replication_factor=1)
    admin.create_topics([topic])[COORDINATION_TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap} | bench_run.FAST_PRODUCER)
    started = time.perf_counter()
    for value, at, source in zip(log.values, log.times, log.sources):
        while True:
            try:
                producer.produce(COORDINATION_TOPIC, value=value, partition=source, timestamp=at)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("the coordination log was not all delivered")
    return time.perf_counter() - started


def fold_in_memory(log: bench_fold.Log) -> WorldState:
    """Baseline a: what one reader does, without Kafka.  Record time = ts (the topic keeps producer times)."""
    state = WorldState(bench_fold.BUSY_GROUP, bench_fold.HB_MS, bench_fold.COORDINATION_PARTITIONS)
    decode, apply = codec.decode, state.apply
    for value, source in zip(log.values, log.sources):
        try:
            record = decode(value)
        except DecodeError:
            state.stats.garbage += 1
            continue
        apply(record, record.ts, source)
    return state


def check(report: AuditReport, state: WorldState) -> list[str]:
    """Where the audit disagrees with one reader's fold of the same log."""
    found = {
        "records": (report.records, state.stats.applied),
        "garbage": (report.garbage, state.stats.garbage),
        "partitions": (report.partitions, len(state.partitions)),
        "owned now": (
            sum(1 for t in report.timeline if t.end_ms is None) if report.timeline else None,
            sum(1 for p in state.partitions.values() if p.owner is not None),
        ),
    }
    return [f"{name}: audit {a} != fold {b}" for name, (a, b) in found.items() if a is not None and a != b]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=2, help="runs of c and d, interleaved; the best counts")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    print("marshal-workers audit benchmark")
    print(f"  python   {platform.python_version()}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    built_s, log = timed(lambda: bench_fold.build_log(args.records, args.seed))
    n = len(log)
    print(
        f"  log      {n:,} records ({sum(map(len, log.values)) / 1e6:.1f} MB), seed {args.seed}, "
        f"{bench_fold.COORDINATION_PARTITIONS} coordination partitions, built in {built_s:.1f} s"
    )
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in log.kinds.most_common())
    print(f"  types    {kinds}")

    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-audit-"))
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        produced_s = produce_log(broker.bootstrap, log)
        print(f"  produced to {COORDINATION_TOPIC} on {broker.bootstrap} in {produced_s:.1f} s (not timed)", flush=True)
        settings = Settings(
            brokers=broker.bootstrap,
            group=bench_fold.BUSY_GROUP,
            coordination_topic=COORDINATION_TOPIC,
            heartbeat_interval=bench_fold.HB_MS / 1000,
            connect_timeout=30.0,
        )

        a_s, state = timed(lambda: fold_in_memory(log))
        print(f"\na. one core, in memory: decode + fold   {a_s:7.2f} s {n / a_s:>12,.0f} records/s", flush=True)
        b_s, read = timed(lambda: read_group_state(settings, bench_fold.BUSY_GROUP))
        print(f"b. one process from Kafka (status)     {b_s:7.2f} s {n / b_s:>12,.0f} records/s", flush=True)
        if read.stats.applied != state.stats.applied:
            print(
                f"   ! read_group_state folded {read.stats.applied:,} records, the in-memory fold {state.stats.applied:,}"
            )

        session_s, spark = timed(lambda: start_session(args.master, app_name="bench-audit"))
        print(f"   Spark session on {args.master} started in {session_s:.1f} s (not counted)", flush=True)
        times: dict[str, list[float]] = {"c": [], "d": []}
        reports: list[AuditReport] = []
        try:
            for run in range(1, args.runs + 1):
                for key in ("c", "d"):
                    out = workdir / f"tables-{run}" if key == "d" else None
                    seconds, report = timed(lambda out=out: _audit(spark, settings, out))
                    times[key].append(seconds)
                    reports.append(report)
                    what = "audit + Parquet tables" if key == "d" else "audit (figures)"
                    print(
                        f"{key}. {what:<36} {seconds:7.2f} s {n / seconds:>12,.0f} records/s  (run {run})", flush=True
                    )
                    if out is not None:
                        shutil.rmtree(out, ignore_errors=True)
        finally:
            stop_session(spark)
    shutil.rmtree(workdir, ignore_errors=True)

    report = reports[0]
    print(
        f"\naudit of {report.group}: {report.records:,} records, {report.garbage:,} garbage, "
        f"{report.partitions} partitions, {report.tenures:,} tenures, {report.handoffs:,} hand-overs "
        f"(p50 {report.handoff_p50_ms} ms, max {report.handoff_max_ms} ms; {report.handoffs_after_pause:,} after "
        f"pauses), {report.zombie_records:,} zombie records"
    )
    mismatches = check(report, state)
    print("cross-check with the one-reader fold: " + ("OK" if not mismatches else "MISMATCH " + "; ".join(mismatches)))
    best_c, best_d = min(times["c"]), min(times["d"])
    print("\nsummary (records/s of the whole log; best of runs)")
    print(f"  a. one core in memory          {n / a_s:>12,.0f}")
    print(f"  b. one process from Kafka      {n / b_s:>12,.0f}")
    print(f"  c. audit on {args.master:<18} {n / best_c:>12,.0f}   ({best_c:.2f} s; c/b = {b_s / best_c:.2f})")
    print(f"  d. c + Parquet tables          {n / best_d:>12,.0f}   ({best_d:.2f} s)")
    return 0


def _audit(spark, settings: Settings, out: Path | None) -> AuditReport:
    partitions, splits, _ = plan_log(settings, from_beginning=True)  # the whole log: what is measured
    return audit(spark, settings, partitions, splits, out)


if __name__ == "__main__":
    sys.exit(main())
