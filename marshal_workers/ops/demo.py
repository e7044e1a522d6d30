"""``marshal-workers demo``: the whole thing on the embedded broker, in one command.

It starts the embedded broker, creates a topic, produces a steady stream,
runs ``examples/quickstart.py`` under several supervisors (separate
processes, as on separate hosts), and shows a live view of who owns which
partition, how far each got and how far behind it is, until Ctrl-C (or
``--duration``).  Then it stops the supervisors with SIGTERM, so every
partition is released at its exact offset, and stops the broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import orjson
from confluent_kafka import OFFSET_END, Producer, TopicPartition

import marshal_workers
from marshal_workers.core.config import Settings
from marshal_workers.errors import ConfigError
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.coordination_reader import CoordinationLog, read_group_state
from marshal_workers.kafka.coordination_writer import ensure_coordination_topic
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import admin_client, ensure_topic
from marshal_workers.protocol.world_state import WorldState

DEMO_APP = "examples.quickstart:app"
DEMO_TOPIC = "orders"
DEMO_GROUP = "examples.quickstart"


@dataclass
class DemoOptions:
    partitions: int = 8
    rate: int = 2000  # messages per second
    supervisors: int = 2
    duration: float = 0.0  # seconds; 0: until Ctrl-C
    heartbeat_interval: float = 1.0


@dataclass
class Throughput:
    """Messages per second from successive (time, total) samples."""

    last: tuple[float, int] | None = None
    rate: float = 0.0

    def sample(self, now: float, total: int) -> float:
        if self.last is not None and now > self.last[0]:
            self.rate = (total - self.last[1]) / (now - self.last[0])
        self.last = (now, total)
        return self.rate


@dataclass
class SteadyProducer:
    """Produces JSON orders at a steady rate on a thread, until stopped."""

    settings: Settings
    rate: int
    produced: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        producer = Producer(client_profiles.demo_producer(self.settings))
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for _ in range(due - self.produced):
                order = {"id": self.produced, "amount": round(1 + (self.produced % 97) * 0.5, 2)}
                producer.produce(DEMO_TOPIC, orjson.dumps(order), key=str(self.produced).encode())
                self.produced += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(10)

    def stop(self) -> None:
        self._stop.set()


def find_examples() -> Path:
    """The examples/ folder of the clone that marshal_workers was installed from."""
    examples = Path(marshal_workers.__file__).resolve().parent.parent / "examples"
    if not (examples / "quickstart.py").is_file():
        raise ConfigError(
            "the demo runs examples/quickstart.py from a clone of the marshal-workers repository; "
            "install from a clone with: pip install -e '.[embedded]'"
        )
    return examples


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    examples = find_examples()
    stop_requested: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: stop_requested.append(signum))
    log_dir = Path(tempfile.mkdtemp(prefix="marshal-workers-demo-"))
    with EmbeddedBroker(log_path=str(log_dir / "broker.log")) as broker:
        settings = Settings(brokers=broker.bootstrap, group=DEMO_GROUP, heartbeat_interval=options.heartbeat_interval)
        coordination_partitions = _create_topics(settings, options.partitions)
        producer = SteadyProducer(settings, options.rate)
        producer.start()
        supervisors = [
            _start_supervisor(settings, examples.parent, f"demo-{i + 1}", log_dir) for i in range(options.supervisors)
        ]
        out.write(f"demo: broker {broker.bootstrap}; supervisor logs in {log_dir}; Ctrl-C stops\n")
        try:
            _live_view(settings, coordination_partitions, options, producer, supervisors, stop_requested, out)
        finally:
            out.write(
                "\ndemo: stopping the supervisors (SIGTERM: each releases its partitions at their exact offsets)\n"
            )
            codes = _stop_supervisors(supervisors, timeout=30)
            producer.stop()
            state = read_group_state(settings, DEMO_GROUP)
            handled = sum(_resume_offsets(state, options.partitions))
            out.write(
                f"demo: produced {producer.produced} messages, handled {handled}; every partition was released at "
                "its exact offset, where a next run on a real cluster would resume (the embedded broker keeps "
                f"everything in memory: the next demo starts afresh). Supervisor exit codes: {codes}\n"
            )
    return 0 if all(code == 0 for code in codes) else 1


def _create_topics(settings: Settings, partitions: int) -> int:
    """The demo topic and the coordination topic; returns the coordination topic's partition count."""
    admin = admin_client(settings)
    ensure_topic(admin, settings, DEMO_TOPIC, partitions)
    return ensure_coordination_topic(admin, settings)


def _start_supervisor(settings: Settings, cwd: Path, client_id: str, log_dir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARSHAL_WORKERS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "marshal_workers",
        "run",
        DEMO_APP,
        "--brokers",
        settings.brokers,
        "--client-id",
        client_id,
        "--heartbeat-interval",
        f"{settings.heartbeat_interval}s",
        "--balance",
        "fair",  # the supervisors share the partitions evenly, whoever starts first
    ]
    with open(log_dir / f"{client_id}.log", "ab") as log:
        # Their own sessions: Ctrl-C reaches only the demo, which stops them in order.
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True)


def _stop_supervisors(supervisors: list[subprocess.Popen[bytes]], timeout: float) -> list[int | None]:
    for process in supervisors:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in supervisors:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return [process.returncode for process in supervisors]


def _resume_offsets(state: WorldState, partitions: int) -> list[int]:
    offsets = []
    for p in range(partitions):
        found = state.get(DEMO_TOPIC, p)
        offsets.append((found.resume_offset or 0) if found else 0)
    return offsets


class _HighWatermarks:
    """End offsets from fetch responses (Tansu's ListOffsets under-reports them)."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        self.partitions = partitions
        self._consumer = GuardedConsumer(
            client_profiles.demo_view(settings), "the demo's view", settings.heartbeat_interval
        )
        self._consumer.assign([TopicPartition(DEMO_TOPIC, p, OFFSET_END) for p in range(partitions)])

    def read(self) -> list[int]:
        self._consumer.consume(1000, 0.05)  # keeps the fetches, and so the watermarks, coming
        return [max(self._consumer.fetched_end(DEMO_TOPIC, p), 0) for p in range(self.partitions)]

    def close(self) -> None:
        self._consumer.close()


def _live_view(
    settings: Settings,
    coordination_partitions: int,
    options: DemoOptions,
    producer: SteadyProducer,
    supervisors: list[subprocess.Popen[bytes]],
    stop_requested: list[int],
    out: TextIO,
) -> None:
    log = CoordinationLog(settings, DEMO_GROUP, coordination_partitions).start()
    marks = _HighWatermarks(settings, options.partitions)
    handled_rate, produced_rate = Throughput(), Throughput()
    started = time.monotonic()
    try:
        while not stop_requested and (not options.duration or time.monotonic() - started < options.duration):
            if any(process.poll() is not None for process in supervisors):
                out.write("demo: a supervisor exited; see its log\n")
                return
            now = time.monotonic()
            state, highs = log.snapshot(), marks.read()
            offsets = _resume_offsets(state, options.partitions)
            frame = _render(
                state,
                offsets,
                highs,
                handled_rate.sample(now, sum(offsets)),
                produced_rate.sample(now, producer.produced),
            )
            out.write(("\x1b[H\x1b[2J" if out.isatty() else "\n") + frame + "\n")
            out.flush()
            time.sleep(1.0)
    finally:
        marks.close()
        log.close()


def _render(state: WorldState, offsets: list[int], highs: list[int], handled: float, produced: float) -> str:
    now_ms = int(time.time() * 1000)
    lines = [
        f"marshal-workers demo   topic {DEMO_TOPIC}   group {DEMO_GROUP}",
        f"produced {produced:8.0f} msgs/s   handled {handled:8.0f} msgs/s   (Ctrl-C: clean hand-over and exit)",
        "",
        f"{'PARTITION':<10} {'OWNER':<28} {'STATE':<9} {'OFFSET':>9} {'LAG':>7}",
    ]
    for p, (offset, high) in enumerate(zip(offsets, highs)):
        found = state.get(DEMO_TOPIC, p)
        owner = f"{found.owner.client}/{found.owner.instance[:8]}" if found and found.owner else "-"
        liveness = state.liveness(DEMO_TOPIC, p, now_ms).value
        lag = max(high - offset, 0)
        lines.append(f"{p:<10} {owner:<28} {liveness:<9} {offset:>9} {lag:>7}")
    return "\n".join(lines)
