"""Benchmark: what a coordination log reader's fetches cost the writes beside it, on the embedded broker.

    python tests/benchmarks/bench_coordination_tail.py [--writes 3000]

Starts its own embedded broker and a one-partition topic.  One writer (the coordinator's producer settings:
``acks=all``, idempotent, ``linger.ms=0``) writes records of 300 bytes one after another, each waiting for its
delivery report, as a group commit does: the write's round trip (mean, p50, p90) and the broker's CPU per write,
with no reader, then with a reader tailing the partition from another process as a member's coordination log does,
with the reader's fetch settings of before (no ``queued.min.messages``: a fetch as soon as a record came) and of
now (``tail_tuning``: the next fetch 5 ms after one that brought records).  A benchmark, not a test: it prints
figures; the exit status is non-zero only if it could not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import checkout  # noqa: F401 - puts the checkout on sys.path
from bench_run import cpu_seconds, machine_info
from bench_serve import percentile
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.kafka.client_profiles import tail_tuning
from marshal_workers.kafka.embedded_broker import EmbeddedBroker

TOPIC = "tail-bench"


def tail(bootstrap: str, tuning: dict[str, Any], seconds: float) -> None:
    """The reader (run in its own process): tails the topic for ``seconds``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "tail-bench", "enable.partition.eof": False, **tuning}
    )
    consumer.assign([TopicPartition(TOPIC, 0, -1)])  # from the end
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        consumer.poll(0.1)
    consumer.close()


def writes(producer: Producer, count: int, broker_pid: int) -> dict[str, float]:
    took: list[float] = []
    cpu = cpu_seconds(broker_pid)
    for _ in range(count):
        delivered = threading.Event()
        started = time.perf_counter()
        producer.produce(TOPIC, b"x" * 300, on_delivery=lambda error, message, done=delivered: done.set())
        while not delivered.is_set():
            producer.poll(0.005)
        took.append(time.perf_counter() - started)
    cpu = cpu_seconds(broker_pid) - cpu
    return {
        "mean_ms": statistics.fmean(took) * 1000,
        "p50_ms": percentile(took, 0.5) * 1000,
        "p90_ms": percentile(took, 0.9) * 1000,
        "broker_us_per_write": cpu / count * 1e6,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--tail":
        tail(sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    args = parser.parse_args()
    print("\n".join(machine_info()), flush=True)
    now = tail_tuning(Settings())
    before = {k: v for k, v in now.items() if k != "queued.min.messages"}
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures die with it
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result()
        time.sleep(1.0)
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0}
        )
        producer.produce(TOPIC, b"first")
        producer.flush(10)
        for name, tuning in [("no reader", None), ("reader, before", before), ("reader, now (tail_tuning)", now)]:
            reader = None
            if tuning is not None:
                reader = subprocess.Popen(
                    [sys.executable, __file__, "--tail", broker.bootstrap, json.dumps(tuning), "600"]
                )
                time.sleep(2.0)
            try:
                found = writes(producer, args.writes, broker.pid)
            finally:
                if reader is not None:
                    reader.kill()
                    reader.wait(30)
            print(
                f"  {name:28} write mean {found['mean_ms']:.3f} ms, p50 {found['p50_ms']:.3f}, p90 "
                f"{found['p90_ms']:.3f}; broker {found['broker_us_per_write']:.0f} us of CPU a write",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
