"""Where the HTTP service's CPU goes under bench_serve.py's load: a profile, not a benchmark.

    python tests/benchmarks/profile_serve.py [--seconds 6] [--clients 8] [--max 1] [--no-cprofile]
        [--threads serve-loop,coordination-deliveries]

Starts the embedded broker, a topic with plenty of messages and ``marshal-workers serve`` (through
serve_profiled.py), runs bench_serve.py's clients against it, then prints the server's CPU per message by
thread and the top functions of the event loop thread (cProfile; it slows the loop, so compare the thread
figures of a run with --no-cprofile).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import checkout  # noqa: F401  (sys.path: the checkout's package, this folder)
from bench_run import base_env, create_topic, leftovers, produce
from bench_serve import PARTITIONS, histogram_percentile, launch, percentile, run_clients, write_histogram

from marshal_workers.kafka.embedded_broker import EmbeddedBroker, free_port

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max", type=int, default=1)
    parser.add_argument("--no-cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--threads", default="", help="Also profile these threads (comma-separated names).")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="profile-serve-"))
    with EmbeddedBroker() as broker:
        topic, group = f"serve-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        produce(broker.bootstrap, topic, 100_000, PARTITIONS)
        port = free_port()
        command = [
            sys.executable,
            str(HERE / "serve_profiled.py"),
            str(out),
            "serve",
            "--brokers",
            broker.bootstrap,
            "--group",
            group,
            "--coordination-topic",
            f"__marshal-{group}",
            "--topic",
            topic,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        env = base_env()
        if args.no_cprofile:
            env["MW_PROFILE_OFF"] = "1"
        if args.threads:
            env["MW_PROFILE_THREADS"] = args.threads
        server, url = launch(command, env, out / "server.log", port)
        try:
            time.sleep(1.0)
            before = json.loads((out / "threads.json").read_text())
            writes_before = write_histogram(url)
            results, elapsed = run_clients(url, args.clients, 2, args.seconds, args.max, out)
            writes_after = write_histogram(url)
            time.sleep(0.6)
            after = json.loads((out / "threads.json").read_text())
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    handled = sum(r["messages"] for r in results)
    print(f"{handled} messages in {elapsed:.1f}s: {handled / elapsed:,.0f}/s")
    reads, acks = [s for r in results for s in r["reads"]], [s for r in results for s in r["acks"]]
    writes = writes_after.get(float("inf"), 0.0) - writes_before.get(float("inf"), 0.0)
    print(
        f"read p50/p99 {percentile(reads, 0.5) * 1000:.1f}/{percentile(reads, 0.99) * 1000:.1f} ms, ack "
        f"{percentile(acks, 0.5) * 1000:.1f}/{percentile(acks, 0.99) * 1000:.1f} ms, {writes:.0f} writes "
        f"({handled / writes if writes else float('nan'):.1f} messages each), write p50/p99 "
        f"{histogram_percentile(writes_before, writes_after, 0.5) * 1000:.1f}/"
        f"{histogram_percentile(writes_before, writes_after, 0.99) * 1000:.1f} ms"
    )
    # A client's round trip is its read's and its ack's mean (a rare slow one weighs in the rate as much as many p50s).
    print(
        f"read mean {statistics.fmean(reads) * 1000:.2f} ms, ack mean {statistics.fmean(acks) * 1000:.2f} ms, "
        f"{args.clients} clients / rate: {args.clients / (handled / elapsed) * 1000:.2f} ms a round trip"
    )
    total = 0.0
    for name, cpu in sorted(after["cpu"].items(), key=lambda kv: -(kv[1] - before["cpu"].get(kv[0], 0.0))):
        used = cpu - before["cpu"].get(name, 0.0)
        total += used
        if used > 0.005:
            print(f"  {name:32} {used:7.2f} s  {used / handled * 1e6:7.1f} us/msg")
    print(f"  {'all':32} {total:7.2f} s  {total / handled * 1e6:7.1f} us/msg")
    for name in ["loop", *args.threads.split(",")] if args.threads else ["loop"]:
        if (out / f"{name}.prof").exists() and not (name == "loop" and args.no_cprofile):
            print(f"--- {name}")
            pstats.Stats(str(out / f"{name}.prof")).sort_stats("tottime").print_stats(args.top)
    stray = leftovers()
    if stray:
        print(f"FAIL: processes left behind: {stray}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
