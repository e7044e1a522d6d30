"""Benchmark: ``replay`` on Spark (local[2]) against ``marshal-workers run``, same data, same handler.

    python tests/benchmarks/bench_replay.py [--messages 1000000] [--partitions 4] [--runs 2] [--max-split 500000]

Starts its own embedded broker (Tansu), produces N small JSON messages evenly
over the partitions of one topic (outside the timed part), and measures, on
that same topic and with the same handler (bench_app.handle_throughput:
``msg.json()``, and a time stamp at offset 0 and at the last offset of each
partition):

a. baseline: ``python -m marshal_workers run bench_app:app`` (one supervisor,
   ALO, one worker process per partition), from the start of the topic in a
   fresh group; throughput = N / (last stamp - first stamp), as bench_run.py;
b. ``replay`` of the whole topic on one local[2] session (started once,
   before; its start-up is printed, not counted): the same stamps give the
   same measure, and the Spark job's wall time (submission to last result)
   a second one that includes scheduling and each task's consumer start-up;
c. once, ``marshal-workers replay`` end to end as a user runs it (a new JVM,
   the range checks, the job, the report): wall time of the command.

a and b run ``--runs`` times, interleaved; the best counts.  Replay handles
every message of the range: the benchmark checks its count.  A benchmark, not
a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_run
import orjson
from checkout import HERE, ROOT  # and the checkout on sys.path

from marshal_workers.core.config import Settings
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.spark.planner import plan_splits
from marshal_workers.spark.ranges import Bound, resolve_ranges
from marshal_workers.spark.replay import ReplayReport, replay
from marshal_workers.spark.session import start_session, stop_session

APP = "bench_app:app"

EARLIEST, LATEST = Bound("earliest"), Bound("latest")


def stamps(outdir: Path, partitions: int) -> bench_run.Timing | None:
    firsts = [outdir / f"first-{p}" for p in range(partitions)]
    lasts = [outdir / f"last-{p}" for p in range(partitions)]
    if not all(f.exists() for f in firsts + lasts):
        return None
    return bench_run.Timing(0, [float(f.read_text()) for f in firsts], [float(f.read_text()) for f in lasts])


def clear(outdir: Path) -> None:
    for path in outdir.iterdir():
        path.unlink()


def run_replay(spark, settings: Settings, topic: str, max_split: int, outdir: Path, count: int, partitions: int):
    clear(outdir)
    splits = plan_splits(resolve_ranges(settings, topic, None, EARLIEST, LATEST), max_split)
    report: ReplayReport = replay(spark, APP, settings, splits)
    if report.handled != count or report.failed:
        raise RuntimeError(f"replay handled {report.handled:,} of {count:,} messages; failed splits: {report.failed}")
    timing = stamps(outdir, partitions)
    if timing is None:
        raise RuntimeError(f"the replayed handler left no stamps in {outdir}")
    timing.count = count
    return report, timing


def run_cli(bootstrap: str, topic: str, max_split: int, env: dict[str, str]) -> tuple[float, dict]:
    command = [
        sys.executable,
        "-m",
        "marshal_workers",
        "replay",
        APP,
        "--topic",
        topic,
        "--brokers",
        bootstrap,
        "--spark-master",
        "local[2]",
        "--max-split",
        str(max_split),
        "--json",
    ]
    started = time.perf_counter()
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"marshal-workers replay exited with {result.returncode}: {result.stderr[-2000:]}")
    return seconds, orjson.loads(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-split", type=int, default=500_000, help="most offsets per Spark task (the CLI default)")
    args = parser.parse_args()
    count = args.messages - args.messages % args.partitions
    per_partition = count // args.partitions

    print("marshal-workers replay benchmark")
    for line in bench_run.machine_info():
        print("  " + line)
    print(
        f"  N = {count:,} messages over {args.partitions} partitions; replay max split {args.max_split:,}; "
        f"{args.runs} runs each, best counts"
    )
    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-replay-"))
    replay_out = workdir / "replay-stamps"
    replay_out.mkdir()
    rates: dict[str, list[float]] = {"a": [], "b": [], "b_job": []}
    failed: list[str] = []
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        bootstrap = broker.bootstrap
        topic = bench_run.new_topic(bootstrap, "bench-replay", count, args.partitions)
        # What the replay's Python workers import bench_app with: they inherit the session's environment.
        bench_env = {
            "MW_BENCH_TOPIC": topic,
            "MW_BENCH_KIND": "throughput",
            "MW_BENCH_OUT": str(replay_out),
            "MW_BENCH_LAST_OFFSET": str(per_partition - 1),
            "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p),
        }
        os.environ.update(bench_env)
        settings = Settings(brokers=bootstrap, connect_timeout=30.0)
        session_started = time.perf_counter()
        spark = start_session("local[2]", app_name="bench-replay")
        print(f"  Spark session on local[2] started in {time.perf_counter() - session_started:.1f} s (not counted)")
        try:
            for run in range(1, args.runs + 1):
                print(f"  run {run} a: marshal-workers run, ALO", flush=True)
                try:
                    rundir = workdir / f"run-{run}"
                    rundir.mkdir()
                    result = bench_run.run_supervised(
                        bootstrap, topic, count, args.partitions, "alo", rundir, sample_memory=False
                    )
                    assert result.timing is not None
                    rates["a"].append(result.timing.rate)
                    print(f"    {result.timing.rate:12,.0f} msgs/s   ({result.timing.describe()})", flush=True)
                except Exception as exc:  # noqa: BLE001 - report the failed measurement and go on
                    failed.append(f"run {run} a: {exc}")
                    print(f"    ! failed: {exc}", flush=True)
                print(f"  run {run} b: replay on local[2]", flush=True)
                try:
                    report, timing = run_replay(
                        spark, settings, topic, args.max_split, replay_out, count, args.partitions
                    )
                    rates["b"].append(timing.rate)
                    rates["b_job"].append(report.rate)
                    busy = sum(r.seconds for r in report.results)
                    print(
                        f"    {timing.rate:12,.0f} msgs/s   ({timing.describe()}); job {report.seconds:.2f} s = "
                        f"{report.rate:,.0f} msgs/s over {len(report.results)} splits (tasks busy {busy:.2f} s)",
                        flush=True,
                    )
                except Exception as exc:  # noqa: BLE001 - report the failed measurement and go on
                    failed.append(f"run {run} b: {exc}")
                    print(f"    ! failed: {exc}", flush=True)
        finally:
            stop_session(spark)
        print("  c: marshal-workers replay, end to end (new JVM)", flush=True)
        cli_seconds = None
        try:
            cli_seconds, document = run_cli(bootstrap, topic, args.max_split, os.environ.copy())
            print(
                f"    {cli_seconds:.1f} s for {document['messages']:,} messages "
                f"(job {document['seconds']:.2f} s, {document['rate']:,.0f} msgs/s)"
            )
        except Exception as exc:  # noqa: BLE001 - report the failed measurement and go on
            failed.append(f"c: {exc}")
            print(f"    ! failed: {exc}", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"summary (msgs/s, best of {args.runs}; all runs in brackets)")
    best = {k: max(v) if v else None for k, v in rates.items()}
    labels = {
        "a": "a. marshal-workers run, ALO (baseline)",
        "b": "b. replay local[2], first to last message",
        "b_job": "b. replay local[2], whole Spark job",
    }
    for key, label in labels.items():
        runs = ", ".join(f"{r:,.0f}" for r in rates[key])
        shown = f"{best[key]:12,.0f}" if best[key] else f"{'-':>12}"
        print(f"  {label:<44} {shown}   [{runs}]")
    if best["a"] and best["b"] and best["b_job"]:
        print(f"  replay / run: {best['b'] / best['a']:.2f} (messages), {best['b_job'] / best['a']:.2f} (whole job)")
    if cli_seconds is not None:
        print(f"  c. marshal-workers replay end to end: {cli_seconds:.1f} s ({count / cli_seconds:,.0f} msgs/s)")
    for failure in failed:
        print(f"  FAILED: {failure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
