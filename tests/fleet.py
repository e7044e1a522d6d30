"""Running real supervisors (``python -m marshal_workers run``) against the test broker."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from polling import poll_until
from processes import child_environment, cmdline, group_command, process_group, run_command

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.protocol import codec

APPS = Path(__file__).parent / "apps"  # the applications the e2e and chaos tests run
HB = "1s"
STATUS_TIMEOUT_S = 60.0  # a `status` call that takes longer is given up (subprocess.TimeoutExpired)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def new_fleet(
    brokers: str, unique: str, tmp_path: Path, name: str = "seq", partitions: int = 8, **fields: Any
) -> Fleet:
    """The one way tests make a fleet: a fresh topic ``<name>-<unique>`` of ``partitions`` partitions, its group,
    a coordination topic of the test's own, and a sink file of the fleet's own; ``fields``: Fleet's others
    (env, app, heartbeat).  Whoever makes one stops it (the ``fleet`` and ``fleets`` fixtures do)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # only the fixtures need it

    topic = f"{name}-{unique}"
    admin = AdminClient({"bootstrap.servers": brokers})  # held until the topic exists: its end cancels the request
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(10)
    (tmp_path / topic).mkdir(parents=True, exist_ok=True)
    env = dict(fields.pop("env", {}))  # the fleet's own: tests add to it (fleet.env |= ...)
    return Fleet(
        brokers=brokers,
        group=f"group-{topic}",
        topic=topic,
        coordination_topic=f"__marshal-{unique}",
        sink=tmp_path / topic / "sink.txt",
        partitions=partitions,
        env=env,
        **fields,
    )


@dataclass(frozen=True)
class SinkLine:
    """One message handled by the sink app."""

    client: str
    pid: int
    partition: int
    offset: int
    value: str
    at: float


@dataclass(frozen=True)
class StatusCall:
    """One ``marshal-workers status`` subprocess: when it began (wall clock) and how long it took."""

    started: float
    seconds: float  # a timed-out call: its timeout
    timed_out: bool = False

    @property
    def answered_at(self) -> float:
        return self.started + self.seconds


def parse_sink_lines(text: bytes) -> list[SinkLine]:
    out = []
    for raw in text.decode(errors="replace").splitlines():
        parts = raw.split()
        if len(parts) == 6:  # a line cut by a SIGKILL mid-write is not a handled message
            client, pid, partition, offset, value, at = parts
            out.append(SinkLine(client, int(pid), int(partition), int(offset), value, float(at)))
    return out


@dataclass
class Fleet:
    """Supervisors of one group on one topic, started as processes; all killed by ``stop_all``."""

    brokers: str
    group: str
    topic: str
    coordination_topic: str
    sink: Path
    partitions: int
    env: dict[str, str] = field(default_factory=dict)
    app: str = "sink_app:app"  # MODULE:APP in tests/apps
    heartbeat: str = HB  # --heartbeat-interval of its supervisors, servers and status
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    # Every `status` call, in the order they ended: how long a user waits for an answer (the nemesis reports it).
    status_calls: list[StatusCall] = field(default_factory=list)
    # What lines() parsed so far: not fields of __init__, so that dataclasses.replace() (another fleet beside this
    # one, with a sink of its own) starts afresh instead of sharing this one's.
    _sink_lines: list[SinkLine] = field(default_factory=list, init=False, repr=False)
    _sink_parsed_bytes: int = field(default=0, init=False, repr=False)

    def start(self, client_id: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        """Start a supervisor; its stderr goes to a log file next to the sink."""
        app_env = (
            {
                "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
                "MW_TEST_TOPIC": self.topic,
                "MW_TEST_SINK": str(self.sink),
            }
            | self.env
            | env
        )
        return self._spawn(
            client_id,
            self.command("run", self.app, *args),
            app_env,
        )

    def serve(self, client_id: str, *args: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
        """Start ``marshal-workers serve`` of the fleet's topic on a free port; return it and its URL."""
        port = free_port()
        process = self._spawn(
            client_id,
            self.command("serve", "--topic", self.topic, "--port", str(port), *args),
            env,
        )
        return process, f"http://127.0.0.1:{port}"

    def http_client(self, name: str, *urls: str, **env: str) -> subprocess.Popen[bytes]:
        """Start tests/apps/http_client.py: an HTTP client process that reads, writes the sink, and acks."""
        return self._spawn(name, [sys.executable, str(APPS / "http_client.py"), name, str(self.sink), *urls], env)

    def command(self, verb: str, *args: str) -> list[str]:
        """``marshal-workers VERB ARGS`` on this fleet's brokers, group, coordination topic and heartbeat (their options
        last, so that ``args`` may begin with a subcommand: ``command("admin", "pause", ...)``)."""
        where = {"brokers": self.brokers, "group": self.group, "coordination_topic": self.coordination_topic}
        return [*group_command(verb, *args, **where), "--heartbeat-interval", self.heartbeat]

    def run(self, verb: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A one-shot ``marshal-workers VERB ARGS`` on this fleet (:meth:`command`), run to its end."""
        return run_command(self.command(verb, *args), timeout=timeout)

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``command`` as ``name`` (its client id), in ``child_environment(env)``; its output goes to a log file
        next to the sink."""
        full_env = child_environment({"MARSHAL_WORKERS_CLIENT_ID": name} | env)
        log_path = self.sink.with_name(f"{name}.log")
        self.logs[name] = log_path
        with open(log_path, "ab") as log:
            # Its own session: signals we send reach only it, and killpg() ends its fork server and workers too.
            process = subprocess.Popen(command, env=full_env, stderr=log, stdout=log, start_new_session=True)
        self.processes[name] = process
        return process

    def acked_lines(self) -> list[tuple[int, int, str, float]]:
        """(partition, offset, value, time) of every ack the HTTP clients got a 200 for."""
        path = self.sink.with_name(self.sink.name + ".acked")
        if not path.exists():
            return []
        found = []
        for raw in path.read_text().splitlines():
            parts = raw.split()
            if len(parts) == 5:
                found.append((int(parts[1]), int(parts[2]), parts[3], float(parts[4])))
        return found

    def log_of(self, client_id: str) -> str:
        return self.logs[client_id].read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)
            for pid in process_group(process.pid):  # nothing of it may outlive the test
                os.kill(pid, signal.SIGKILL)

    def worker_pids(self, client_id: str) -> dict[int, int]:
        """partition -> pid of the workers that a supervisor runs now (by their process titles)."""
        supervisor = self.processes[client_id]
        workers = {}
        for pid in process_group(supervisor.pid):
            title = cmdline(pid)
            prefix = f"marshal-workers: worker {self.group} {self.topic}["
            if title.startswith(prefix):
                workers[int(title[len(prefix) :].split("]")[0])] = pid
        return workers

    def shared_worker_pids(self, client_id: str) -> set[int]:
        """The pids of the shared workers (range leases) that a supervisor runs now (by their process titles)."""
        supervisor = self.processes[client_id]
        prefix = f"marshal-workers: shared worker {self.group} {self.topic}"
        return {pid for pid in process_group(supervisor.pid) if cmdline(pid).startswith(prefix)}

    def produce(self, values: range, headers: list[tuple[str, bytes]] | None = None, timestamp: int = 0) -> None:
        """Values 'N' on partition N % partitions, in order (with these headers and timestamp, if given)."""
        producer = Producer({"bootstrap.servers": self.brokers, "linger.ms": 5})
        for n in values:
            producer.produce(
                self.topic, value=str(n).encode(), partition=n % self.partitions, headers=headers, timestamp=timestamp
            )
        assert producer.flush(30) == 0

    def lines(self) -> list[SinkLine]:
        """Every message handled so far, in the sink's order.  The sink only grows: each call parses what was
        appended since the last (tests poll this 20 times a second; parsing a 10,000-line sink each time kept a
        core busy)."""
        if not self.sink.exists():
            return []
        with open(self.sink, "rb") as sink:
            sink.seek(self._sink_parsed_bytes)
            appended = sink.read()
        complete = appended.rfind(b"\n") + 1  # a line still being written is parsed again, whole, next time
        self._sink_lines.extend(parse_sink_lines(appended[:complete]))
        self._sink_parsed_bytes += complete
        return self._sink_lines + parse_sink_lines(appended[complete:])

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(line.value for line in self.lines())

    def status_rows(self) -> dict[int, dict[str, Any]]:
        """``marshal-workers status --json`` of the fleet's topic, by partition."""
        return {row["partition"]: row for row in self.status_document()["partitions"]}

    def shared_rows(self) -> dict[int, dict[str, Any]]:
        """The shared partitions (range leases) of ``status --json``, by partition: those the log knows of."""
        return {row["partition"]: row for row in self.status_document().get("shared", [])}

    def status_document(self) -> dict[str, Any]:
        """``marshal-workers status --json`` of the fleet's topic; its duration goes to ``status_calls``."""
        started, clock = time.time(), time.monotonic()
        try:
            result = self.run("status", "--topic", self.topic, "--json", timeout=STATUS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.status_calls.append(StatusCall(started, STATUS_TIMEOUT_S, timed_out=True))
            raise
        self.status_calls.append(StatusCall(started, time.monotonic() - clock))
        # UNKNOWN_GROUP: no supervisor wrote yet; the document (every partition unclaimed) is printed all the same.
        assert result.returncode in (ExitCode.OK, ExitCode.UNKNOWN_GROUP), result.stderr
        document: dict[str, Any] = orjson.loads(result.stdout)
        return document

    def coordination_records(self) -> list[codec.Record]:
        """Every record of the coordination log, decoded, read from the beginning of each partition to its end."""
        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": "log-reader", "enable.partition.eof": True})
        topic = self.coordination_topic
        partitions = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        found: list[codec.Record] = []
        at_end: set[int] = set()
        try:
            deadline = time.monotonic() + 30
            while len(at_end) < partitions and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error() is not None:
                    at_end.add(message.partition())
                    continue
                found.append(codec.decode(message.value()))
        finally:
            consumer.close()
        return found

    def dead_letters(self, count: int) -> list[Message]:
        """The first ``count`` messages of the dead-letter topic (waits for them)."""
        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": "dlq-reader", "enable.auto.commit": False})
        dlq = f"{self.topic}.dlq"  # created by the first dead letter, with the broker's default partition count
        metadata = poll_until(
            lambda: consumer.list_topics(dlq, timeout=10).topics[dlq].partitions or None,
            timeout=30,
            what=f"topic {dlq}",
        )
        consumer.assign([TopicPartition(dlq, p, 0) for p in metadata])
        found: list[Message] = []
        try:
            while len(found) < count:
                message = poll_until(lambda: consumer.poll(0.5), timeout=30, what="a dead letter")
                if message.error() is None:
                    found.append(message)
        finally:
            consumer.close()
        return found
