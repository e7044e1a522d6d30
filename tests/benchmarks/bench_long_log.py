"""Benchmark: ``status`` and a restarted supervisor on a long coordination log that is still being written.

    python tests/benchmarks/bench_long_log.py [--records 30000] [--rounds 3] [--busy-rate 300]
        [--baseline /path/to/another/checkout] [--busy-cores 0]

Starts its own embedded broker and writes a group's past to the coordination topic as a fleet does: one record
per produce batch (claims and heartbeats of 12 partitions of one topic, so all on that topic's coordination
partition), with a checkpoint of the group every ``--records / 4`` records, as the checkpoint writer leaves one
every minute.  The embedded broker lists every batch of a partition on every fetch (docs/brokers.md, "Stalled
fetches on a long partition"), so such a log is what a fault storm leaves behind.

Then, while a writer keeps appending one-record batches at ``--busy-rate`` (the fleet still running), it times
in rounds, this checkout and ``--baseline`` (another checkout, e.g. ``git worktree add /tmp/base main``)
alternating:

  status   ``marshal-workers status --json`` of the group, as a process (what an operator waits for);
  start    ``marshal-workers run`` of a one-topic application in the same group, from its start to its start-up
           line (the coordinator caught up, ready to claim), then SIGTERM.

``--busy-cores N`` keeps N cores busy with Python loops meanwhile (a loaded machine).  Target: every status and
start-up under 2 s.  A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import checkout  # puts the checkout on sys.path; its ROOT is the checkout timed
from bench_run import machine_info, verdict
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from processes import child_environment, group_command

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.protocol import codec

TOPIC = "orders"
CHECKPOINT_EVERY_S = 60.0
GIVE_UP_S = 60.0  # a status or start-up slower than this is reported as such, not waited for (--give-up)
PARTITIONS = 12
APPS = checkout.ROOT / "tests" / "apps"


def one_record_batches(brokers: str) -> Producer:
    """A producer that sends every record as a batch of its own, as a supervisor's coordinator does."""
    return Producer(
        {
            "bootstrap.servers": brokers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "batch.num.messages": 1,
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def write_history(settings: Settings, count: int, writers: int = 4) -> None:
    """``count`` records of the group's past, one per batch, with a checkpoint after each quarter."""
    target = codec.coordination_partition(TOPIC, settings.coordination_partitions)
    common = {"v": codec.VERSION, "group": settings.group, "client": "old-host", "instance": "old-1"}
    quarter = max(1, count // 4)
    for start in range(0, count, quarter):
        now_ms = int(time.time() * 1000)

        def write(first: int, last: int, now_ms: int = now_ms) -> None:
            producer = one_record_batches(settings.brokers)
            for n in range(first, last):
                record: codec.Record
                if n % 50 == 0:
                    record = codec.Claim(**common, ts=now_ms, topic=TOPIC, partition=n % PARTITIONS)
                else:
                    record = codec.Heartbeat(**common, ts=now_ms, topic=TOPIC, partition=n % PARTITIONS, offset=n)
                while True:
                    try:
                        producer.produce(settings.coordination_topic, codec.encode(record), partition=target)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(120):
                raise RuntimeError("history not delivered")

        end = min(count, start + quarter)
        quarter_began = time.monotonic()
        step = max(1, (end - start) // writers)
        threads = [threading.Thread(target=write, args=(s, min(end, s + step))) for s in range(start, end, step)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        write_checkpoint(settings)
        print(
            f"  {end:,} records written, {time.monotonic() - quarter_began:.1f}s for the last {end - start:,}",
            flush=True,
        )


def write_checkpoint(settings: Settings) -> None:
    """A checkpoint of the group on the topic's coordination partition, as a member writes one every minute."""
    target = codec.coordination_partition(TOPIC, settings.coordination_partitions)
    with Coordinator(settings) as writer:
        writer.write(writer.checkpoint_records(target), partitions=[target])


def keep_writing(settings: Settings, rate: float, stop: threading.Event, written: list[int]) -> None:
    """Heartbeats of a member still running, one record per batch, ``rate`` a second, and a checkpoint every
    CHECKPOINT_EVERY_S (the default checkpoint_interval) so readers start near the end, as in a running fleet."""
    if rate <= 0:
        return
    target = codec.coordination_partition(TOPIC, settings.coordination_partitions)
    producer = one_record_batches(settings.brokers)
    common = {"v": codec.VERSION, "group": settings.group, "client": "busy-host", "instance": "busy-1"}

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is None:
            written[0] += 1

    n = 0
    began = checkpointed = time.monotonic()
    while not stop.is_set():
        if time.monotonic() - checkpointed > CHECKPOINT_EVERY_S:
            write_checkpoint(settings)
            checkpointed = time.monotonic()
        ts = int(time.time() * 1000)
        record = codec.Heartbeat(**common, ts=ts, topic="busy", partition=n % PARTITIONS, offset=n)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=target, on_delivery=delivered)
        producer.poll(0)
        n += 1
        time.sleep(max(0.0, began + n / rate - time.monotonic()))
    producer.flush(10)


def cli(settings: Settings, verb: str, *args: str) -> list[str]:
    """``marshal-workers VERB ARGS`` on the benchmark's group."""
    where = {
        "brokers": settings.brokers,
        "group": str(settings.group),
        "coordination_topic": settings.coordination_topic,
    }
    return [*group_command(verb, *args, **where), "--heartbeat-interval", f"{settings.heartbeat_interval:g}s"]


def environment(tree: Path, topic: str = TOPIC, **sink_app: str) -> dict[str, str]:
    """The checkout ``tree``'s package first on the path, the tests' apps next, in the tests' environment: the sink
    app (tests/apps/sink_app.py) reads ``topic``, with more of its MW_TEST_ settings in ``sink_app``."""
    path = os.pathsep.join([str(tree), str(APPS)])
    return child_environment({"PYTHONPATH": path, "MW_TEST_TOPIC": topic, **sink_app})


def time_status(settings: Settings, tree: Path) -> float:
    """Seconds until ``status`` answered (inf: not within GIVE_UP_S)."""
    began = time.monotonic()
    try:
        result = subprocess.run(
            cli(settings, "status", "--topic", TOPIC, "--json"),
            env=environment(tree),
            cwd=tree,  # `python -m` puts the working directory first on the path: the tree's package, not ours
            capture_output=True,
            text=True,
            timeout=GIVE_UP_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return float("inf")
    seconds = time.monotonic() - began
    if result.returncode != 0:
        raise RuntimeError(f"status failed ({result.returncode}): {result.stderr[-500:]}")
    return seconds


def time_start(settings: Settings, tree: Path, log_path: Path) -> float:
    """From the process's start to its start-up line (inf: not within GIVE_UP_S); then SIGTERM, and wait for its
    exit."""
    command = cli(settings, "run", "sink_app:app") + ["--client-id", f"restarted-{uuid.uuid4().hex[:4]}"]
    return time_supervisor(
        command, environment(tree), tree, log_path, lambda: " running sink_app:app " in log_path.read_text(), GIVE_UP_S
    )


def time_supervisor(
    command: list[str], env: dict[str, str], tree: Path, log_path: Path, ready: Callable[[], bool], give_up: float
) -> float:
    """Seconds from starting the supervisor ``command`` in the checkout ``tree`` (``python -m`` puts the working
    directory first on the path) until ``ready()`` (inf: not within ``give_up``); then SIGTERM, and wait for its
    exit."""
    with open(log_path, "w") as log:
        began = time.monotonic()
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree, start_new_session=True
        )
        try:
            while not ready():
                if process.poll() is not None:
                    raise RuntimeError(f"the supervisor exited {process.returncode}: {log_path.read_text()[-800:]}")
                if time.monotonic() - began > give_up:
                    return float("inf")
                time.sleep(0.005)
            return time.monotonic() - began
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def describe_trees(trees: dict[str, Path]) -> list[str]:
    """A line per checkout timed: its name, path and commit."""
    lines = []
    for name, tree in trees.items():
        head = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
        )
        lines.append(f"{name}: {tree} ({head.stdout.strip()[:80]})")
    return lines


def busy_loops(count: int, stack: ExitStack) -> None:
    for _ in range(count):
        process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        stack.callback(process.wait, 10)
        stack.callback(process.kill)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-rate", type=float, default=300.0, help="records a second appended while timing")
    parser.add_argument("--busy-cores", type=int, default=0)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, timed alternately")
    parser.add_argument("--give-up", type=float, default=60.0, help="seconds after which a call counts as inf")
    args = parser.parse_args()
    global GIVE_UP_S
    GIVE_UP_S = args.give_up
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    trees = {"this checkout": checkout.ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    print("status and a restarted supervisor on a long coordination log, one record per batch, still written")
    for line in machine_info():
        print("  " + line)
    for line in describe_trees(trees):
        print("  " + line)
    logs = Path(f"/tmp/bench-long-log-{uuid.uuid4().hex[:6]}")
    logs.mkdir()
    times: dict[tuple[str, str], list[float]] = {(name, kind): [] for name in trees for kind in ("status", "start")}
    with EmbeddedBroker(log_path=str(logs / "broker.log")) as broker, ExitStack() as stack:
        name = uuid.uuid4().hex[:8]
        settings = Settings(
            brokers=broker.bootstrap,
            group=f"g-{name}",
            client_id="bench",
            heartbeat_interval=1.0,
            coordination_topic=f"__marshal-{name}",
            connect_timeout=60.0,
        )
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(10)
        began = time.monotonic()
        with Coordinator(settings):
            pass  # creates the coordination topic as a supervisor does
        write_history(settings, args.records)
        print(
            f"\n  wrote {args.records:,} one-record batches (a checkpoint every quarter) in "
            f"{time.monotonic() - began:.1f}s; appending {args.busy_rate:g} a second while timing; "
            f"{args.busy_cores} busy cores"
        )
        stop, written = threading.Event(), [0]
        writer = threading.Thread(target=keep_writing, args=(settings, args.busy_rate, stop, written), daemon=True)
        writer.start()
        stack.callback(writer.join, 15)
        stack.callback(stop.set)
        busy_loops(args.busy_cores, stack)
        print(f"\n  {'round':>5} {'checkout':>14} {'status (s)':>10} {'start (s)':>10}")
        for round_ in range(1, args.rounds + 1):
            for tree_name, tree in trees.items():
                status_s = time_status(settings, tree)
                start_s = time_start(settings, tree, logs / f"start-{round_}-{tree_name.replace(' ', '-')}.log")
                times[(tree_name, "status")].append(status_s)
                times[(tree_name, "start")].append(start_s)
                print(f"  {round_:>5} {tree_name:>14} {status_s:>10.2f} {start_s:>10.2f}", flush=True)
        print(f"\n  appended {written[0]:,} records meanwhile; logs in {logs}")
    print()
    worst = 0.0
    for tree_name in trees:
        status_s, start_s = times[(tree_name, "status")], times[(tree_name, "start")]
        worst = max(worst, *status_s, *start_s) if tree_name == "this checkout" else worst
        print(
            f"  {tree_name:>14}: status median {statistics.median(status_s):.2f}s (max {max(status_s):.2f}), "
            f"start median {statistics.median(start_s):.2f}s (max {max(start_s):.2f})"
        )
    print(f"\n  slowest of this checkout: {worst:.2f}s (target < 2 s) {verdict(worst < 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
