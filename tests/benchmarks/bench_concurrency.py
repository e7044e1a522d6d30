"""Benchmark: concurrency inside a worker (docs/concurrency.md) on one partition.

    /work/venv/bin/python tests/benchmarks/bench_concurrency.py [--messages 10000] [--concurrency 1,16,64,256]

Starts its own embedded broker and measures, per configuration, one
supervisor (``concurrency_app``) on a fresh 1-partition topic whose
messages were all produced first, each with its own key (10,000 keys for
10,000 messages, ordering "key"):

1. I/O-bound: a handler that waits 0-5 ms at random (``time.sleep`` in a
   ``def`` handler, ``asyncio.sleep`` in an ``async def`` one), for each
   concurrency N.  The Confluent Parallel Consumer's published run of the
   same setup (KEY ordering) took 2.13 s, about 4,700 msgs/s.  Targets:
   >= 15,000 msgs/s with async def, >= 8,000 with threads (best N).
   At N = 1 only a fifth of the messages is used (the rate is what counts:
   10,000 calls of 2.5 ms on average would take 25 s).
2. CPU-bound: a handler that spins about 1 ms of pure Python, at N = 1 and
   N = 8 (threads).  Target: N = 8 no more than 5% slower than N = 1.

Throughput = messages / (the last call's end - the first call's start), as
the worker itself times them; CPU seconds are the worker process's (user +
system).  A benchmark, not a test: misses print FAIL, the exit status stays 0.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import checkout  # noqa: F401 - puts the checkout on sys.path
from bench_run import SupervisorProcess, create_topic, machine_info, poll_until, verdict
from confluent_kafka import Producer

TARGET_ASYNC = 15_000
TARGET_THREADS = 8_000
TARGET_CPU_RATIO = 0.95
SLOW_FRACTION = 5  # N = 1 handles messages / 5


@dataclass
class Result:
    label: str
    messages: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def produce_keyed(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(count):
        producer.produce(topic, value=b'{"id": %d}' % n, key=b"key-%d" % n, partition=0)
    if producer.flush(60):
        raise RuntimeError(f"messages to {topic} not delivered")


def measure(bootstrap: str, workdir: Path, kind: str, concurrency: int, count: int) -> Result:
    name = f"{kind}-c{concurrency}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, name, 1)
    produce_keyed(bootstrap, name, count)
    result_file = workdir / f"{name}.result"
    env = {
        "MW_BENCH_TOPIC": name,
        "MW_BENCH_CONCURRENCY": str(concurrency),
        "MW_BENCH_KIND": kind,
        "MW_BENCH_TOTAL": str(count),
        "MW_BENCH_RESULT": str(result_file),
    }
    supervisor = SupervisorProcess.start(
        bootstrap, f"g-{name}", f"__marshal-{name}", "bench", workdir / f"{name}.log", env, app="concurrency_app:app"
    )
    try:
        poll_until(lambda: result_file.exists() and result_file.read_text().endswith("\n"), 300, name, supervisor.alive)
    finally:
        supervisor.stop()
    first, last, cpu = (float(x) for x in result_file.read_text().split())
    return Result(f"{kind} N={concurrency}", count, last - first, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated values of N")
    parser.add_argument("--cpu-messages", type=int, default=3_000)
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]

    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    print("concurrency inside a worker: one partition")
    for line in machine_info():
        print("  " + line)
    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-concurrency-"))
    began = time.monotonic()
    results: dict[str, list[Result]] = {"io-def": [], "io-async": []}
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        print(f"\n1. I/O-bound handler (waits 0-5 ms), {args.messages:,} messages, {args.messages:,} keys")
        print(f"  {'handler':<18} {'msgs':>7} {'seconds':>8} {'msgs/s':>9} {'CPU s':>7} {'msgs/CPU-s':>11}")
        for kind in ("io-def", "io-async"):
            for n in levels:
                count = args.messages // SLOW_FRACTION if n == 1 else args.messages
                result = measure(broker.bootstrap, workdir, kind, n, count)
                results[kind].append(result)
                print(
                    f"  {result.label:<18} {result.messages:>7,} {result.seconds:>8.2f} {result.rate:>9,.0f} "
                    f"{result.cpu_seconds:>7.2f} {result.messages / result.cpu_seconds:>11,.0f}",
                    flush=True,
                )
        best_async = max(r.rate for r in results["io-async"])
        best_threads = max(r.rate for r in results["io-def"])
        print(
            f"  best async def: {best_async:,.0f} msgs/s (target >= {TARGET_ASYNC:,}) "
            f"{verdict(best_async >= TARGET_ASYNC)}"
        )
        print(
            f"  best def (threads): {best_threads:,.0f} msgs/s (target >= {TARGET_THREADS:,}) "
            f"{verdict(best_threads >= TARGET_THREADS)}"
        )
        print("  the Confluent Parallel Consumer's published KEY-mode figure for this setup: ~4,700 msgs/s")

        print(f"\n2. CPU-bound handler (~1 ms of Python), {args.cpu_messages:,} messages")
        cpu = [measure(broker.bootstrap, workdir, "cpu", n, args.cpu_messages) for n in (1, 8, 1, 8)]
        one = max(r.rate for r in cpu if r.label.endswith("N=1"))
        eight = max(r.rate for r in cpu if r.label.endswith("N=8"))
        for r in cpu:
            print(f"  {r.label:<18} {r.rate:>9,.0f} msgs/s  {r.messages / r.cpu_seconds:>9,.0f} msgs/CPU-s")
        print(
            f"  N=8 / N=1 (best of two each): {eight / one:.3f} (target >= {TARGET_CPU_RATIO}) "
            f"{verdict(eight / one >= TARGET_CPU_RATIO)}"
        )
    print(f"\ntook {time.monotonic() - began:.0f}s")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
