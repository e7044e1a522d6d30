"""Benchmark: from ``marshal-workers run`` to the first message handled, this checkout against another.

    python tests/benchmarks/bench_first_message.py [--rounds 6] [--baseline /path/to/another/checkout]
        [--coordination-topic new|shared] [--busy-cores 0]

Starts its own embedded broker and a topic of 4 partitions with one message each.  Each round starts a
supervisor of the tests' sink application in a new group, this checkout and ``--baseline`` (e.g.
``git worktree add /tmp/base main``) alternating, and times from the process's start to the first line in its
sink: the interpreter, the imports, the coordination log read, the first claims, a worker forked, its first
fetch.  ``--coordination-topic new`` gives every supervisor a coordination topic of its own, which it creates (a
first deployment); ``shared`` (the default) has all of them use one, as the groups of a cluster do.  Then
SIGTERM, and the next.  ``--busy-cores N`` keeps N cores busy with Python loops meanwhile.
A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

import checkout  # puts the checkout on sys.path; its ROOT is the checkout timed
from bench_long_log import busy_loops, describe_trees, environment, time_supervisor
from bench_run import machine_info
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from processes import group_command

PARTITIONS = 4
GIVE_UP_S = 60.0


def first_message_s(tree: Path, brokers: str, topic: str, coordination_topic: str, logs: Path) -> float:
    """Seconds from the supervisor's start to its first handled message (inf: none within GIVE_UP_S); then
    SIGTERM, and wait for its exit."""
    name = uuid.uuid4().hex[:8]
    sink = logs / f"sink-{name}"
    env = environment(tree, topic, MW_TEST_SINK=str(sink))
    command = group_command(
        "run", "sink_app:app", brokers=brokers, group=f"g-{name}", coordination_topic=coordination_topic
    )
    return time_supervisor(
        command,
        env,
        tree,
        logs / f"supervisor-{name}.log",
        lambda: sink.exists() and sink.stat().st_size > 0,
        GIVE_UP_S,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, timed alternately")
    parser.add_argument("--coordination-topic", choices=["new", "shared"], default="shared")
    parser.add_argument("--busy-cores", type=int, default=0)
    args = parser.parse_args()
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    trees = {"this checkout": checkout.ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    print(f"from `marshal-workers run` to the first message handled ({args.coordination_topic} coordination topic)")
    for line in machine_info() + describe_trees(trees):
        print("  " + line)
    logs = Path(f"/tmp/bench-first-message-{uuid.uuid4().hex[:6]}")
    logs.mkdir()
    times: dict[str, list[float]] = {name: [] for name in trees}
    with EmbeddedBroker(log_path=str(logs / "broker.log")) as broker, ExitStack() as stack:
        topic = f"orders-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for partition in range(PARTITIONS):
            producer.produce(topic, b"1", partition=partition)
        producer.flush(10)
        busy_loops(args.busy_cores, stack)
        print(f"\n  {'round':>5} {'checkout':>14} {'first message (s)':>18}")
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                shared = args.coordination_topic == "shared"
                coordination_topic = "__marshal" if shared else f"__marshal-{uuid.uuid4().hex[:8]}"
                seconds = first_message_s(tree, broker.bootstrap, topic, coordination_topic, logs)
                times[name].append(seconds)
                print(f"  {round_:>5} {name:>14} {seconds:>18.3f}", flush=True)
    print(f"\n  logs in {logs}")
    for name, values in times.items():
        print(f"  {name:>14}: median {statistics.median(values):.3f}s (min {min(values):.3f}, max {max(values):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
