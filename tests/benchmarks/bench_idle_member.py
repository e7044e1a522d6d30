"""Benchmark: what an idle supervisor costs itself and the embedded broker, by coordination fetch wait.

    python tests/benchmarks/bench_idle_member.py [--waits 5ms,50ms,200ms] [--rounds 2] [--seconds 10]

Starts its own embedded broker and a 4-partition topic with nothing in it.  For each ``coordination_fetch_wait``
in turn (rounds alternate the waits), one supervisor of the tests' sink app claims the 4 partitions and idles:
after it has settled, the CPU of its process tree (supervisor, fork server, workers) and of the broker over
``--seconds``, per second.  On the embedded broker an idle member's coordination log reader is its main cost:
Tansu answers an empty fetch only at the end of its wait and lists the partitions again after each half of the
remaining wait (docs/brokers.md, "The coordination log's fetch wait"); on Kafka an empty fetch costs the broker
next to nothing.  A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import time
import uuid

import checkout  # puts the checkout on sys.path; its ROOT is the checkout measured
from bench_long_log import cli, environment
from bench_run import cpu_seconds, group_cpu, machine_info
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.core.durations import parse_duration
from marshal_workers.kafka.embedded_broker import EmbeddedBroker

TOPIC = "idle"
PARTITIONS = 4
SETTLE_S = 6.0  # start-up, claims and the workers' first empty fetches


def idle_cost(broker: EmbeddedBroker, wait: str, seconds: float) -> tuple[float, float]:
    """(supervisor tree, broker) CPU-seconds per second of one idle supervisor at fetch wait ``wait``."""
    settings = Settings(
        brokers=broker.bootstrap,
        group=f"idle-{uuid.uuid4().hex[:8]}",
        coordination_topic=f"__idle-{uuid.uuid4().hex[:8]}",
        heartbeat_interval=1.0,
    )
    env = environment(checkout.ROOT, TOPIC) | {"MARSHAL_WORKERS_COORDINATION_FETCH_WAIT": wait}
    command = cli(settings, "run", "sink_app:app", "--client-id", "idle")
    supervisor = subprocess.Popen(
        command,
        env=env,
        cwd=checkout.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(SETTLE_S)
        if supervisor.poll() is not None:
            raise RuntimeError(f"the supervisor exited ({supervisor.returncode}): run {' '.join(command)} to see why")
        own, brokers = group_cpu(supervisor.pid), cpu_seconds(broker.pid)
        time.sleep(seconds)
        own, brokers = group_cpu(supervisor.pid) - own, cpu_seconds(broker.pid) - brokers
    finally:
        os.killpg(supervisor.pid, signal.SIGTERM)
        supervisor.wait(30)
    return own / seconds, brokers / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waits", default="5ms,50ms,200ms", help="coordination_fetch_wait values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each idle supervisor is measured")
    args = parser.parse_args()
    waits = args.waits.split(",")
    for wait in waits:
        parse_duration(wait)  # a typo fails here, not in a supervisor that exits unseen
    print("\n".join(machine_info()))
    figures: dict[str, list[tuple[float, float]]] = {wait: [] for wait in waits}
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        del admin  # closed before the broker stops, or it logs the lost connection
        for round_ in range(1, args.rounds + 1):
            for wait in waits:
                own, brokers = idle_cost(broker, wait, args.seconds)
                figures[wait].append((own, brokers))
                print(f"round {round_}  wait {wait:>6}: supervisor {own:.3f} CPU-s/s, broker {brokers:.3f} CPU-s/s")
    print(
        f"\nmedians over {args.rounds} rounds, CPU-seconds per second of one idle supervisor ({PARTITIONS} partitions):"
    )
    for wait, rows in figures.items():
        own = statistics.median(r[0] for r in rows)
        brokers = statistics.median(r[1] for r in rows)
        print(f"  wait {wait:>6}: supervisor {own:.3f}, broker {brokers:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
