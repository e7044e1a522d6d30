"""Benchmark: reading a dead-letter topic (what ``dlq list``, ``dlq redrive`` and the dashboard read), this checkout
against another.

    python tests/benchmarks/bench_dlq_read.py [--partitions 12] [--letters 3] [--rounds 3]
        [--baseline /path/to/another/checkout]

Starts its own embedded broker and a dead-letter topic of ``--partitions`` partitions with ``--letters`` records
each; then, in rounds, each checkout (``--baseline``, e.g. ``git worktree add /tmp/base main``, alternating) reads it
all with ``dead_letter_reader.read_dead_letters`` in a process of its own, timed from the call to its last letter.
A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import checkout
from bench_run import machine_info
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "orders.dlq"
READER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from marshal_workers.core.config import Settings
from marshal_workers.kafka.dead_letter_reader import read_dead_letters
settings = Settings(brokers=sys.argv[2], group="bench", client_id="bench")
began = time.perf_counter()
count = sum(1 for _ in read_dead_letters(settings, sys.argv[3]))
print(count, time.perf_counter() - began)
"""


def read_all(tree: Path, brokers: str) -> tuple[int, float]:
    """(letters read, seconds) of one read by the checkout ``tree``, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", READER, str(tree), brokers, TOPIC], capture_output=True, text=True, check=True, cwd="/"
    )
    count, seconds = done.stdout.split()
    return int(count), float(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--letters", type=int, default=3, help="records per partition")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, timed alternately")
    args = parser.parse_args()
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    trees = {"this checkout": checkout.ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    print(f"reading a dead-letter topic of {args.partitions} partitions, {args.letters} records each")
    for line in machine_info():
        print("  " + line)
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    with EmbeddedBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for partition in range(args.partitions):
            for _ in range(args.letters):
                producer.produce(TOPIC, b"a dead letter", partition=partition)
        if producer.flush(30):
            print("the letters were not written")
            return 1
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                count, took = read_all(tree, broker.bootstrap)
                seconds[name].append(took)
                print(f"  round {round_}  {name:>14}: {count} letters in {took:.2f} s", flush=True)
    print()
    for name, taken in seconds.items():
        print(f"  {name:>14}: median {statistics.median(taken):.2f} s (max {max(taken):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
