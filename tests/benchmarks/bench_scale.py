"""Benchmark: a fleet on many partitions: time until every partition is owned, and coordination traffic.

    /work/venv/bin/python tests/benchmarks/bench_scale.py [--partitions 256] [--members 4] [--window 20]

Starts its own embedded broker, creates a topic with --partitions partitions
(empty: the handler never runs), then starts --members supervisors of one
group (``--balance fair``, HB 2 s) at once and measures:

1. the seconds from their start until every partition is owned and fresh
   (a tail of the coordination log, folded as ``status`` folds it, polled
   every 20 ms), and until the ownership is balanced (every member within
   one partition of the others); then ``status --json`` is asked once;
2. the coordination records written per second once the fleet is settled,
   over --window seconds (the coordination topic's end offsets before and
   after), and how many of them each kind is;
3. when each member's first coordination record landed (its broker time), from its launch: the start-up a
   simulated member (``marshal-workers simulate``) does not have; and the times of (1) counted from the
   first record of all, as the simulator counts them.

``--dump PATH`` writes every record of the coordination topic, read once the window is over, as JSON lines
(``partition``, ``offset``, ``broker_ms`` (the record's LogAppendTime), ``ms`` (from the launch), ``type``,
``client``, ``instance``, ``ts``, ``entries`` (beats or claims in a multi-partition record), ``bytes``,
``value`` (the record itself)), for the calibration in docs/simulation.md: ``bench_sim_calibration.py --real PATH``
folds it with the real fold and measures it as the simulator measures a run.

A benchmark, not a test: the exit status is 0 unless the benchmark could not run.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_run import SupervisorProcess, base_env, create_topic, machine_info, poll_until
from checkout import ROOT  # and the checkout on sys.path
from confluent_kafka import Consumer, TopicPartition
from processes import group_command

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.kafka.kafka_clients import admin_client, topic_partition_count
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_view import Liveness

HB = "2s"


def status(bootstrap: str, group: str, coordination: str, topic: str) -> list[dict]:
    result = subprocess.run(
        group_command(
            "status",
            "--heartbeat-interval",
            HB,
            "--topic",
            topic,
            "--json",
            brokers=bootstrap,
            group=group,
            coordination_topic=coordination,
        ),
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
        cwd=ROOT,
    )
    if result.returncode != 0:
        return []
    return json.loads(result.stdout)["partitions"]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset of each partition of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-scale-reader"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def kinds_between(bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int]) -> collections.Counter[str]:
    """Record types in the coordination topic between two sets of end offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-scale-kinds", "enable.auto.commit": False})
    counts: collections.Counter[str] = collections.Counter()
    left = {p: end[p] - start[p] for p in end if end[p] > start[p]}
    try:
        consumer.assign([TopicPartition(topic, p, start[p]) for p in left])
        deadline = time.monotonic() + 120
        while any(n > 0 for n in left.values()) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                p = message.partition()
                if message.error() is None and message.offset() < end[p]:
                    counts[json.loads(message.value()).get("type", "?")] += 1
                    left[p] -= 1
    finally:
        consumer.close()
    return counts


def read_all(bootstrap: str, topic: str, end: dict[int, int]) -> list[tuple[int, int, int, str]]:
    """Every record of ``topic`` below ``end``: (partition, offset, broker time in ms, its value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-scale-dump", "enable.auto.commit": False})
    records: list[tuple[int, int, int, str]] = []
    left = {p: n for p, n in end.items() if n > 0}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in left])
        deadline = time.monotonic() + 120
        while any(n > 0 for n in left.values()) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                p = message.partition()
                if message.error() is None and message.offset() < end[p]:
                    records.append((p, message.offset(), message.timestamp()[1], message.value().decode()))
                    left[p] -= 1
    finally:
        consumer.close()
    return records


def dump_and_first_records(
    records: list[tuple[int, int, int, str]], launched_ms: int, path: Path | None
) -> dict[str, float]:
    """Write ``records`` as JSON lines to ``path`` (if given); the seconds from the launch to each client's
    first record."""
    first: dict[str, float] = {}
    lines = []
    for partition, offset, broker_ms, value in sorted(records, key=lambda r: (r[2], r[0], r[1])):
        record = json.loads(value)
        client = record.get("client", "?")
        first.setdefault(client, (broker_ms - launched_ms) / 1000)
        entries = len(record.get("beats", record.get("claims", ()))) or 1
        lines.append(
            json.dumps(
                {
                    "partition": partition,
                    "offset": offset,
                    "broker_ms": broker_ms,
                    "ms": broker_ms - launched_ms,
                    "type": record.get("type"),
                    "client": client,
                    "instance": record.get("instance"),
                    "ts": record.get("ts"),
                    "entries": entries,
                    "bytes": len(value.encode()),
                    "value": value,
                }
            )
        )
    if path is not None:
        path.write_text("\n".join(lines) + "\n")
    return first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0, help="seconds over which traffic is counted")
    parser.add_argument("--dump", type=Path, help="write every coordination record here (JSON lines)")
    args = parser.parse_args()

    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    print(f"a fleet of {args.members} supervisors on {args.partitions} partitions (--balance fair, HB {HB})")
    for line in machine_info():
        print("  " + line)
    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-scale-"))
    name = uuid.uuid4().hex[:8]
    topic, group, coordination = f"scale-{name}", f"g-{name}", f"__marshal-{name}"
    supervisors: list[SupervisorProcess] = []
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        bootstrap = broker.bootstrap
        create_topic(bootstrap, topic, args.partitions)
        # The command line's --heartbeat-interval wins over the environment: HB is passed there (bench_run's
        # default, 1 s, made this fleet heartbeat at twice the rate its tail and status assumed).
        env = {"MARSHAL_WORKERS_BALANCE": "fair"}
        try:
            started, launched_ms = time.monotonic(), int(time.time() * 1000)
            for n in range(args.members):
                supervisors.append(
                    SupervisorProcess.start(
                        bootstrap,
                        group,
                        coordination,
                        f"member-{n}",
                        workdir / f"member-{n}.log",
                        env | {"MW_BENCH_TOPIC": topic},
                        heartbeat_interval=HB,
                    )
                )

            # A tail of the coordination log, as status reads it, polled every 20 ms (status itself takes ~1 s).
            settings = Settings(brokers=bootstrap, group=group, coordination_topic=coordination, heartbeat_interval=2.0)
            count = poll_until(
                lambda: topic_partition_count(admin_client(settings), settings, coordination),
                60,
                "the coordination topic",
            )
            tail = CoordinationLog(settings, group, count, from_beginning=True).start()
            try:

                def owners() -> list[MemberId | None]:
                    now = int(time.time() * 1000)
                    return tail.read(
                        lambda world: [
                            world.owner(topic, p) if world.liveness(topic, p, now) is Liveness.FRESH else None
                            for p in range(args.partitions)
                        ]
                    )

                poll_until(lambda: all(owners()), 300, "every partition owned and fresh", supervisors[0].alive)
                all_owned = time.monotonic() - started

                def balanced() -> bool:
                    counts = collections.Counter(owners())
                    fresh = [n for owner, n in counts.items() if owner is not None]
                    return len(fresh) == args.members and max(fresh) - min(fresh) <= 1

                poll_until(balanced, 300, "a balanced fleet", supervisors[0].alive)
                all_balanced = time.monotonic() - started
            finally:
                tail.close()
            print(
                f"\n1. every partition owned and fresh after {all_owned:.1f}s; balanced after {all_balanced:.1f}s",
                flush=True,
            )
            rows = status(bootstrap, group, coordination, topic)
            print(
                f"   status --json agrees: {len(rows)} partitions, "
                f"{len({r['client'] for r in rows})} owners, all fresh: {all(r['state'] == 'fresh' for r in rows)}"
            )

            time.sleep(4)  # let the last hand-overs settle
            before, window_start = end_offsets(bootstrap, coordination), time.monotonic()
            time.sleep(args.window)
            after, window_end = end_offsets(bootstrap, coordination), time.monotonic()
            rate = (sum(after.values()) - sum(before.values())) / (window_end - window_start)
            kinds = kinds_between(bootstrap, coordination, before, after)
            print(
                f"2. coordination records once settled: {rate:.1f} records/s over {args.window:g}s "
                f"({rate / args.members:.1f} per member; the policy's cadence, one heartbeats record per "
                f"member and HB/2, is {2 / settings.heartbeat_interval:g}); by type: {dict(kinds)}"
            )
            first = dump_and_first_records(read_all(bootstrap, coordination, after), launched_ms, args.dump)
            earliest = min(first.values())
            print(
                "3. first record from the launch: "
                + ", ".join(f"{c} {s:.2f}s" for c, s in sorted(first.items()))
                + f"; from the first record of all: owned after {all_owned - earliest:.1f}s, "
                f"balanced after {all_balanced - earliest:.1f}s"
            )
        finally:
            for supervisor in supervisors:
                supervisor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
