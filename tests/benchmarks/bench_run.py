"""Benchmark: ``marshal-workers run`` against raw confluent-kafka consumers, worker memory, hand-over latency.

    /work/venv/bin/python tests/benchmarks/bench_run.py [--messages 1000000] [--partitions 4] [--handover-rounds 10]

Starts its own embedded broker (Tansu, memory only) and measures:

1. Throughput of a trivial handler (``msg.json()`` of small JSON values, the
   same function, ``bench_app.handle_throughput``, everywhere), N messages
   spread evenly over the partitions of a fresh topic per measurement, all
   produced before the measurement starts:

   a. raw baseline: one spawned process per partition (the parent holds no
      Kafka client when they start), each a confluent_kafka.Consumer with
      librdkafka's default fetch settings, assign()ed its partition at offset
      0, looping ``consume(num_messages=500, timeout=0.5)``.  The processes
      import everything, then wait on one start signal before they create
      their consumers, so their start-up costs do not overlap the measurement;
   b. the same with the fetch settings of a worker (marshal_workers.kafka.client_profiles.worker_consumer);
   c. ``python -m marshal_workers run bench_app:app`` (one supervisor), ALO;
   d. the same in AMO with batch_size 500 (per-message handler);
   e. c with --metrics-port (every handler call timed); f. c with one empty
      before_message hook (target: >= 0.97 x c); g. c with an empty
      before_message and after_message hook; h. c with a typed handler
      (``msg: Message[Order]``, a msgspec Struct decoded by the worker,
      reading ``msg.body.amount``): issue 28's target, no slower than c;
      i. c with built-in tracing on
      (bench_app.py MW_BENCH_TRACING: an SDK TracerProvider, BatchSpanProcessor,
      an exporter that drops every span; the records carry no traceparent, so
      each span is a root): the cost per message is reported (wall and CPU
      microseconds over c), with no target.

   Throughput = N / (latest wall time of a last message - earliest wall time
   of a first message).  Each measurement runs twice, interleaved
   (a b c d a b c d), and the best run counts.  Targets: c >= 0.8 x baseline,
   d >= 0.5 x baseline.
2. Memory (first run of c): USS (Private_Clean + Private_Dirty of
   /proc/PID/smaps_rollup) and RSS of every worker, found by process title,
   once all workers have handled their first message and again once they have
   handled everything; the supervisor, fork server and broker for context.
3. Graceful hand-over: one partition, ~2000 msgs/s produced throughout, two
   supervisors of one group.  Each round sends SIGTERM to the owner; latency =
   wall time the other's worker handles its first message - ts of the release
   record the stopped owner wrote.  The stopped one is restarted (idle) before
   the next round.  Target: median < 200 ms; the new owner must start at the
   release's offset.

A benchmark, not a test: misses print FAIL, the exit status stays 0 (it is
non-zero only if the benchmark itself could not run).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from checkout import HERE, ROOT  # and the checkout on sys.path
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from processes import child_environment, cmdline, group_command, process_group

TARGET_ALO = 0.8
TARGET_AMO = 0.5
TARGET_METRICS = 0.9  # ALO with metrics on (every handler call timed) against ALO without
TARGET_HOOKS = 0.97  # ALO with one empty before_message hook against ALO without (issue 14: under 3%)
TARGET_TYPED = (
    0.97  # ALO with a typed handler (msgspec Struct) against msg.json(): no slower (issue 28), within 3% noise
)
# A fixed port: one supervisor at a time runs in this benchmark.
METRICS_ENV = {"MARSHAL_WORKERS_METRICS_PORT": "19464", "MARSHAL_WORKERS_METRICS_HOST": "127.0.0.1"}
VARIANT_ENV = {
    "f": {"MW_BENCH_HOOKS": "before"},
    "g": {"MW_BENCH_HOOKS": "both"},
    "h": {"MW_BENCH_TYPED": "1"},
    "i": {"MW_BENCH_TRACING": "1"},
}
TARGET_HANDOVER_MEDIAN_MS = 200.0
HB = "1s"
AMO_BATCH_SIZE = 500
HANDOVER_RATE = 2000  # messages per second
SUPERVISOR_STOP_TIMEOUT_S = 30.0
POLL_S = 0.02

STARTED: list[int] = []  # pids (= process group ids) of every supervisor started, for the final leak check

WORKER_TITLE = "marshal-workers: worker "
SUPERVISOR_TITLE = "marshal-workers: supervisor "
FORK_SERVER_TITLE = "marshal-workers: fork server"


VALUE_BYTES = 26  # --value-bytes: the smallest value, '{"id": N, "amount": 1.5}' with a short N


def value_of(n: int, size: int | None = None) -> bytes:
    """A JSON object of about ``size`` bytes (VALUE_BYTES by default): an id, an amount, padding."""
    value = b'{"id": %d, "amount": 1.5}' % n
    missing = (VALUE_BYTES if size is None else size) - len(value) - len(b', "pad": ""')
    return value if missing <= 0 else value[:-1] + b', "pad": "%s"}' % (b"x" * missing)


def poll_until(condition: Callable[[], Any], timeout: float, what: str, alive: Callable[[], bool] | None = None) -> Any:
    """Call ``condition`` every POLL_S until it is truthy; RuntimeError on timeout or when ``alive()`` says no."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if alive is not None and not alive():
            raise RuntimeError(f"gave up waiting for {what}: the process it depends on has exited")
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {timeout:g}s")
        time.sleep(POLL_S)


# ----------------------------------------------------------------- broker side


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)

    def visible() -> bool:
        found = admin.list_topics(timeout=5).topics.get(topic)
        return found is not None and found.error is None and len(found.partitions) == partitions

    poll_until(visible, 30, f"topic {topic} in the metadata")


# A producer that fills a benchmark topic fast: big batches, a deep local queue.
FAST_PRODUCER = {
    "linger.ms": 20,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
}


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> float:
    """Message n on partition n % partitions, in order; returns the seconds it took."""
    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap} | FAST_PRODUCER)
    send = producer.produce
    for n in range(count):
        try:
            send(topic, value=value_of(n), partition=n % partitions)
        except BufferError:
            producer.poll(0.05)
            send(topic, value=value_of(n), partition=n % partitions)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} messages to {topic} not delivered")
    del producer
    return time.perf_counter() - started


def new_topic(bootstrap: str, name: str, count: int, partitions: int) -> str:
    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    seconds = produce(bootstrap, topic, count, partitions)
    print(f"    produced {count:,} messages to {topic} in {seconds:.1f}s", flush=True)
    return topic


@dataclass
class Timing:
    """Wall times of each partition's first and last message, and the CPU seconds spent between them."""

    count: int
    firsts: list[float]
    lasts: list[float]
    cpu: float | None = None  # every consuming process from its first message to its last (+ the supervisor)

    @property
    def window(self) -> float:
        return max(self.lasts) - min(self.firsts)

    @property
    def rate(self) -> float:
        return self.count / self.window

    @property
    def per_cpu(self) -> float | None:
        """Messages per CPU-second."""
        return self.count / self.cpu if self.cpu else None

    def describe(self) -> str:
        spans = [last - first for first, last in zip(self.firsts, self.lasts)]
        cpu = f"; {self.cpu:.2f} CPU-s, {self.per_cpu:,.0f} msgs per CPU-s" if self.per_cpu else ""
        return (
            f"window {self.window:.3f}s; first messages within {1000 * (max(self.firsts) - min(self.firsts)):.0f} ms; "
            f"each partition took {min(spans):.3f}-{max(spans):.3f}s{cpu}"
        )


def read_stamps(outdir: Path, partitions: int) -> tuple[list[float], list[float], float]:
    """The handler's stamps (bench_app._stamp): wall times of the first and last messages, and the CPU seconds
    the processes spent in between."""
    firsts = [(outdir / f"first-{p}").read_text().split() for p in range(partitions)]
    lasts = [(outdir / f"last-{p}").read_text().split() for p in range(partitions)]
    cpu = sum(float(last[1]) - float(first[1]) for first, last in zip(firsts, lasts))
    return [float(f[0]) for f in firsts], [float(last[0]) for last in lasts], cpu


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu(pid: int) -> float:
    """CPU so far of ``pid`` and every process of its group (a supervisor or server started in a session of its own:
    its fork server and workers stay in it)."""
    return sum(cpu_seconds(p) for p in {pid, *process_group(pid)})


# -------------------------------------------------------- a/b: raw consumers


def baseline_consumer(
    conf: dict[str, Any], topic: str, partition: int, count: int, outdir: str, ready: Any, go: Any, results: Any
) -> None:
    """In a spawned process: consume ``count`` messages of one partition from offset 0 with the bench handler."""
    import bench_app

    from marshal_workers.handlers.app import Message

    bench_app.OUT, bench_app.LAST = outdir, count - 1
    handle = bench_app.handle_throughput
    ready.put(partition)
    go.wait()
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen, first = 0, None
    while seen < count:
        batch = consumer.consume(num_messages=500, timeout=0.5)
        if not batch:
            continue
        if first is None:
            first = time.time()
        for record in batch:
            if record.error() is None:
                handle(Message(record))
                seen += 1
    last = time.time()
    consumer.close()
    results.put((partition, first, last, seen))


def run_baseline(
    bootstrap: str, topic: str, count: int, partitions: int, extra: dict[str, Any], outdir: Path
) -> Timing:
    per_partition = count // partitions
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        **extra,
    }
    processes = [
        context.Process(
            target=baseline_consumer,
            args=(conf, topic, p, per_partition, str(outdir), ready, go, results),
            name=f"bench-raw-{p}",
            daemon=True,
        )
        for p in range(partitions)
    ]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=120)
        go.set()
        timeout = 60 + count / 5000
        got = [results.get(timeout=timeout) for _ in processes]
        for process in processes:
            process.join(30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    if any(seen != per_partition for _, _, _, seen in got):
        raise RuntimeError(f"baseline consumers saw {[g[3] for g in got]} messages, expected {per_partition} each")
    got.sort()
    _, _, cpu = read_stamps(outdir, partitions)
    return Timing(count, [g[1] for g in got], [g[2] for g in got], cpu)


# ------------------------------------------------------------- supervisors


def base_env() -> dict[str, str]:
    """A benchmark's process: as a test's (processes.child_environment), with this folder's apps importable."""
    return child_environment(
        {"PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}
    )


@dataclass
class SupervisorProcess:
    """``python -m marshal_workers run bench_app:app`` in its own session (so killpg reaches all of it)."""

    client_id: str
    log_path: Path
    process: subprocess.Popen[bytes]

    @classmethod
    def start(
        cls,
        bootstrap: str,
        group: str,
        coordination_topic: str,
        client_id: str,
        log_path: Path,
        env: dict[str, str],
        app: str = "bench_app:app",
        heartbeat_interval: str = HB,
    ) -> SupervisorProcess:
        options = ["--heartbeat-interval", heartbeat_interval, "--client-id", client_id]
        command = group_command(
            "run", app, *options, brokers=bootstrap, group=group, coordination_topic=coordination_topic
        )
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                env=base_env() | env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        STARTED.append(process.pid)
        return cls(client_id, log_path, process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_running(self, timeout: float = 60) -> None:
        poll_until(
            lambda: re.search(r"supervisor \S+ running", self.log_text()),
            timeout,
            f"supervisor {self.client_id} to log 'running' ({self.log_path})",
            self.alive,
        )

    def stop(self) -> int | None:
        """SIGTERM and wait (graceful: workers finish, partitions are released); then make sure all of it is gone."""
        code = None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(SUPERVISOR_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(
                    f"    ! supervisor {self.client_id} did not stop within {SUPERVISOR_STOP_TIMEOUT_S:g}s: killing it"
                )
        else:
            code = self.process.returncode
        self.kill()
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group (supervisor, fork server, workers)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for pid in process_group(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def leftovers(grace: float = 5.0) -> list[tuple[int, str]]:
    """Processes still in the process group of a supervisor we started, after ``grace`` seconds to be reaped."""
    groups = set(STARTED)

    def scan() -> list[tuple[int, str]]:
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) in groups:
                        out.append((int(entry.name), cmdline(int(entry.name)) or "(exiting)"))
                except (ProcessLookupError, PermissionError):
                    pass
        return out

    deadline = time.monotonic() + grace
    while (found := scan()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


# ------------------------------------------------------------------- memory


@dataclass
class Memory:
    pid: int
    title: str
    rss_kb: int
    uss_kb: int


def memory_of(pid: int, title: str) -> Memory | None:
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    except OSError:
        return None
    return Memory(pid, title, fields.get("Rss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0))


def memory_snapshot(supervisor: SupervisorProcess) -> list[Memory]:
    out = []
    for pid in sorted(process_group(supervisor.pid)):
        title = cmdline(pid)
        if title.startswith((WORKER_TITLE, SUPERVISOR_TITLE, FORK_SERVER_TITLE)):
            found = memory_of(pid, title)
            if found is not None:
                out.append(found)
    return out


# --------------------------------------------------- c/d: marshal-workers run


@dataclass
class RunResult:
    timing: Timing | None = None
    memory: dict[str, list[Memory]] = field(default_factory=dict)


def run_supervised(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    mode: str,
    workdir: Path,
    sample_memory: bool,
    extra_env: dict[str, str] | None = None,
) -> RunResult:
    per_partition = count // partitions
    outdir = workdir / f"out-{topic}"
    outdir.mkdir()
    tag = uuid.uuid4().hex[:8]
    env = {
        "MW_BENCH_TOPIC": topic,
        "MW_BENCH_KIND": "throughput",
        "MW_BENCH_MODE": mode,
        "MW_BENCH_BATCH_SIZE": str(AMO_BATCH_SIZE),
        "MW_BENCH_OUT": str(outdir),
        "MW_BENCH_LAST_OFFSET": str(per_partition - 1),
    } | (extra_env or {})
    supervisor = SupervisorProcess.start(
        bootstrap,
        f"bench-{mode}-{tag}",
        f"__marshal-bench-{tag}",
        f"bench-{mode}",
        workdir / f"run-{mode}-{tag}.log",
        env,
    )
    result = RunResult()
    try:
        firsts = [outdir / f"first-{p}" for p in range(partitions)]
        lasts = [outdir / f"last-{p}" for p in range(partitions)]
        timeout = 120 + count / 5000
        poll_until(
            lambda: all(f.exists() for f in firsts),
            timeout,
            f"first messages ({supervisor.log_path})",
            supervisor.alive,
        )
        supervisor_cpu = cpu_seconds(supervisor.pid)
        if sample_memory:
            result.memory["after first messages"] = memory_snapshot(supervisor)
        poll_until(
            lambda: all(f.exists() for f in lasts), timeout, f"last messages ({supervisor.log_path})", supervisor.alive
        )
        supervisor_cpu = cpu_seconds(supervisor.pid) - supervisor_cpu  # polled: within POLL_S of the window
        if sample_memory:
            result.memory["after all messages"] = memory_snapshot(supervisor)
        first_times, last_times, workers_cpu = read_stamps(outdir, partitions)
        result.timing = Timing(count, first_times, last_times, workers_cpu + supervisor_cpu)
        code = supervisor.stop()
        if code != 0:
            print(f"    ! supervisor exited with code {code} after SIGTERM (log: {supervisor.log_path})")
    finally:
        supervisor.kill()
    return result


# ----------------------------------------------------------------- hand-over


class RateProducer(threading.Thread):
    """Produces ~rate msgs/s to one partition until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(name="bench-producer", daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.rate = topic, rate
        self.stopping = threading.Event()
        self.sent = 0
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            while not self.stopping.is_set():
                due = int((time.monotonic() - started) * self.rate)
                while self.sent < due:
                    self.producer.produce(self.topic, value=value_of(self.sent), partition=0)
                    self.sent += 1
                self.producer.poll(0)
                self.stopping.wait(0.005)
            self.producer.flush(10)
        except (BufferError, KafkaException) as exc:
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        del self.producer


class ReleaseReader:
    """Reads the coordination topic; collects the release records of one group/topic/partition, in log order."""

    def __init__(self, bootstrap: str, coordination_topic: str, group: str, topic: str, partition: int) -> None:
        from marshal_workers.errors import DecodeError
        from marshal_workers.protocol import codec

        self.codec, self.decode_error = codec, DecodeError
        self.group, self.topic, self.partition = group, topic, partition
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        count = len(self.consumer.list_topics(coordination_topic, timeout=10).topics[coordination_topic].partitions)
        self.consumer.assign([TopicPartition(coordination_topic, p, OFFSET_BEGINNING) for p in range(count)])
        self.releases: list[Any] = []

    def wait_for(self, count: int, timeout: float = 15) -> Any:
        """The count-th release record (1-based) once it has been read."""
        deadline = time.monotonic() + timeout
        while len(self.releases) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.releases)} release records after {timeout:g}s, expected {count}")
            for message in self.consumer.consume(100, 0.1):
                if message.error() is not None:
                    continue
                try:
                    record = self.codec.decode(message.value())
                except self.decode_error:
                    continue  # not a valid record: the fold skips it too
                if isinstance(record, self.codec.Release) and (record.group, record.topic, record.partition) == (
                    self.group,
                    self.topic,
                    self.partition,
                ):
                    self.releases.append(record)
        return self.releases[count - 1]

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Round:
    stopped: str
    started: str
    latency_ms: float
    stop_ms: float  # SIGTERM -> release record ts
    release_offset: int
    first_offset: int
    claimed_ms: float | None  # release ts -> the new owner logs "claimed" (claim and heartbeat written and fenced)
    forked_ms: float | None  # -> its worker logs "worker started" (forked, app loaded, consumer created)
    owner_up_ms: float | None  # how long the new owner had been running (its "running" log line) at the release

    def breakdown(self) -> str:
        if self.claimed_ms is None or self.forked_ms is None:
            return "breakdown n/a"
        up = "" if self.owner_up_ms is None else f"; new owner up for {self.owner_up_ms:.0f} ms"
        return (
            f"claimed +{self.claimed_ms:.0f}, worker started +{self.forked_ms - self.claimed_ms:.0f}, "
            f"first message +{self.latency_ms - self.forked_ms:.0f} ms{up}"
        )


_LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "


def last_log_time(text: str, pattern: str) -> float | None:
    """Wall time (epoch seconds, from the local-time asctime) of the last log line matching ``pattern``."""
    found = None
    for match in re.finditer(_LOG_TIME + ".*" + pattern, text, re.MULTILINE):
        found = match
    if found is None:
        return None
    return time.mktime(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")) + int(found.group(2)) / 1000


def read_starts(path: Path) -> list[tuple[int, int, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), int(parts[1]), float(parts[2])))
    return out


def run_handover(bootstrap: str, rounds: int, workdir: Path) -> list[Round]:
    tag = uuid.uuid4().hex[:8]
    topic, group, coordination_topic = f"bench-handover-{tag}", f"bench-handover-{tag}", f"__marshal-handover-{tag}"
    create_topic(bootstrap, topic, 1)
    outdir = workdir / f"out-{topic}"
    outdir.mkdir()
    starts = outdir / "starts"
    env = {"MW_BENCH_TOPIC": topic, "MW_BENCH_KIND": "handover", "MW_BENCH_MODE": "alo", "MW_BENCH_OUT": str(outdir)}
    incarnations: dict[str, int] = {"A": 0, "B": 0}
    started: list[SupervisorProcess] = []

    def start(name: str) -> SupervisorProcess:
        incarnations[name] += 1
        log_path = workdir / f"handover-{name}-{incarnations[name]}.log"
        supervisor = SupervisorProcess.start(bootstrap, group, coordination_topic, f"bench-{name}", log_path, env)
        started.append(supervisor)
        return supervisor

    producer = RateProducer(bootstrap, topic, HANDOVER_RATE)
    producer.start()
    reader: ReleaseReader | None = None
    results: list[Round] = []
    try:
        owner = start("A")
        poll_until(lambda: read_starts(starts), 60, f"A's worker to handle a message ({owner.log_path})", owner.alive)
        idle = start("B")
        idle.wait_running()
        reader = ReleaseReader(bootstrap, coordination_topic, group, topic, 0)
        for number in range(1, rounds + 1):
            before = len(read_starts(starts))
            term_at = time.time()
            owner.process.send_signal(signal.SIGTERM)
            line = poll_until(
                lambda before=before: read_starts(starts)[before:],
                30,
                f"round {number}: the new owner's first message",
                idle.alive,
            )[0]
            code = owner.process.wait(SUPERVISOR_STOP_TIMEOUT_S)
            if code != 0:
                print(f"    ! round {number}: supervisor {owner.client_id} exited with code {code} ({owner.log_path})")
            owner.kill()
            release = reader.wait_for(number)
            pid, first_offset, first_at = line
            if pid not in process_group(idle.pid):
                print(
                    f"    ! round {number}: the first message was handled by pid {pid}, not a worker of {idle.client_id}"
                )
            if release.client != owner.client_id:
                print(f"    ! round {number}: the release record came from {release.client}, not {owner.client_id}")
            results.append(
                Round(
                    stopped=owner.client_id,
                    started=idle.client_id,
                    latency_ms=(first_at - release.ts / 1000) * 1000,
                    stop_ms=release.ts - term_at * 1000,
                    release_offset=release.offset,
                    first_offset=first_offset,
                    claimed_ms=None,
                    forked_ms=None,
                    owner_up_ms=None,
                )
            )
            r = results[-1]
            text = idle.log_text()
            claimed_at = last_log_time(text, re.escape(f"claimed {topic}[0], resuming"))
            worker_at = last_log_time(text, re.escape(f"{topic}[0]: worker started"))
            running_at = last_log_time(text, r"supervisor \S+ running")
            if claimed_at is not None and worker_at is not None:
                r.claimed_ms = claimed_at * 1000 - release.ts
                r.forked_ms = worker_at * 1000 - release.ts
            if running_at is not None:
                r.owner_up_ms = release.ts - running_at * 1000
            print(
                f"    round {number:2d}: {r.stopped} -> {r.started}  hand-over {r.latency_ms:7.1f} ms"
                f"  (SIGTERM -> release {r.stop_ms:6.1f} ms)  release@{r.release_offset} first@{r.first_offset}"
                f"{'' if r.release_offset == r.first_offset else '  MISMATCH'}  [{r.breakdown()}]",
                flush=True,
            )
            name = owner.client_id.removeprefix("bench-")
            restarted = start(name)
            restarted.wait_running()
            owner, idle = idle, restarted
        if producer.error is not None:
            raise RuntimeError(f"the producer thread failed: {producer.error!r}")
        print(f"    producer sent {producer.sent:,} messages over the measurement", flush=True)
    finally:
        if reader is not None:
            reader.close()
        for supervisor in started:
            if supervisor.alive():
                supervisor.stop()
            supervisor.kill()
        producer.stop()
    return results


# ------------------------------------------------------------------ report


def machine_info() -> list[str]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"python    {platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        f"platform  {platform.platform()}",
        f"cpu       {model}; {os.cpu_count()} logical CPUs, {len(os.sched_getaffinity(0))} usable; load average {load}",
        f"kafka     confluent-kafka {_version(confluent_kafka.version())}, librdkafka {_version(confluent_kafka.libversion())}",
    ]


def _version(found: Any) -> str:
    return str(found[0] if isinstance(found, tuple) else found)


def check_traced(outdir: Path, partitions: int) -> None:
    """i measured tracing only if every worker's handler ran inside a recording span (bench_app.py's stamps)."""
    stamps = [outdir / f"traced-{p}" for p in range(partitions)]
    found = {p: stamp.read_text() if stamp.exists() else "" for p, stamp in enumerate(stamps)}
    if set(found.values()) != {"1"}:
        raise RuntimeError(f"tracing was not on in every worker (partition: recording span?) {found}")


def print_tracing_cost(best: dict[str, float | None], best_cpu: dict[str, float | None]) -> None:
    """i against c: what a span per handler call costs per message (issue 28's measure; no target)."""
    if not best["i"] or not best["c"]:
        return
    wall_us = (1 / best["i"] - 1 / best["c"]) * 1e6
    print(
        f"   tracing on (i) against off (c): i/c = {best['i'] / best['c']:5.2f}; "
        f"cost per message {wall_us:+.2f} us of wall time (all partitions together)"
    )
    if best_cpu["i"] and best_cpu["c"]:
        cpu_us = (1 / best_cpu["i"] - 1 / best_cpu["c"]) * 1e6
        print(f"   tracing on (i) against off (c): {cpu_us:+.2f} CPU-us per message")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def mb(kb: int) -> str:
    return f"{kb / 1024:7.1f} MB"


def print_memory(memory: dict[str, list[Memory]]) -> None:
    for when, rows in memory.items():
        print(f"  {when}:")
        workers = [m for m in rows if m.title.startswith(WORKER_TITLE)]
        for m in rows:
            title = m.title if len(m.title) <= 80 else m.title[:77] + "..."
            print(f"    pid {m.pid:>7}  USS {mb(m.uss_kb)}  RSS {mb(m.rss_kb)}  {title}")
        if workers:
            uss = [m.uss_kb for m in workers]
            rss = [m.rss_kb for m in workers]
            print(
                f"    workers ({len(workers)}): USS mean {mb(int(statistics.mean(uss)))}, max {mb(max(uss))};"
                f"  RSS mean {mb(int(statistics.mean(rss)))}, max {mb(max(rss))}"
            )


def scan_logs(workdir: Path) -> list[str]:
    """Lines of the supervisor logs worth a look: warnings, errors, tracebacks."""
    notes = []
    for log in sorted(workdir.glob("*.log")):
        if log.name == "broker.log":
            continue
        for line in log.read_text(errors="replace").splitlines():
            if any(word in line for word in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback")):
                notes.append(f"{log.name}: {line}")
    return notes


# -------------------------------------------------------------------- main


def main() -> int:
    global VALUE_BYTES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="N, messages per throughput run")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (and processes) per throughput run")
    parser.add_argument("--handover-rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=2, help="runs of each throughput measurement (best counts)")
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES, help="bytes of each JSON value (padded)")
    parser.add_argument(
        "--only", default="abcdefghi", help="the throughput measurements to run, e.g. bd (default abcdefghi)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) even if nothing went wrong")
    args = parser.parse_args()
    VALUE_BYTES = args.value_bytes
    if args.partitions < 1 or args.messages < args.partitions:
        parser.error("need --partitions >= 1 and --messages >= --partitions")
    count = args.messages - args.messages % args.partitions  # evenly spread

    from marshal_workers.core.config import Settings
    from marshal_workers.kafka import client_profiles
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    began = time.monotonic()
    print("marshal-workers run benchmark")
    for line in machine_info():
        print("  " + line)
    print(f'  values: JSON of {len(value_of(0))} bytes, e.g. {value_of(0)[:60]!r}; handler: msg.json()["amount"]')
    print(
        f"  N = {count:,} messages over {args.partitions} partitions, {args.runs} runs each, best counts; "
        f"{args.handover_rounds} hand-over rounds"
    )

    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-run-"))
    print(f"  work directory (supervisor logs): {workdir}", flush=True)

    worker_conf = client_profiles.worker_consumer(Settings(group="g"))
    tuned = {k: worker_conf[k] for k in ("fetch.queue.backoff.ms", "fetch.wait.max.ms")}
    print(f"  tuned baseline (b) settings, from marshal_workers.kafka.client_profiles.worker_consumer(): {tuned}")

    rates: dict[str, list[float]] = {key: [] for key in "abcdefghi"}
    per_cpu: dict[str, list[float]] = {key: [] for key in rates}
    memory: dict[str, list[Memory]] = {}
    rounds: list[Round] = []
    failed: list[str] = []
    broker_pid = None
    with EmbeddedBroker(log_path=str(workdir / "broker.log")) as broker:
        broker_pid = broker.pid
        bootstrap = broker.bootstrap
        print(f"  embedded broker at {bootstrap} (pid {broker_pid})")
        print()
        print("1. Throughput", flush=True)
        for run in range(1, args.runs + 1):
            for key, label in (
                ("a", "raw consumers, default settings"),
                ("b", "raw consumers, tuned settings"),
                ("c", "marshal-workers run, ALO"),
                ("d", f"marshal-workers run, AMO batch_size {AMO_BATCH_SIZE}"),
                ("e", "marshal-workers run, ALO, --metrics-port (every handler call timed)"),
                ("f", "marshal-workers run, ALO, one empty before_message hook"),
                ("g", "marshal-workers run, ALO, an empty before_message and after_message hook"),
                ("h", "marshal-workers run, ALO, a typed handler (Message[Order], a msgspec Struct)"),
                ("i", "marshal-workers run, ALO, tracing on (SDK provider, batch processor, spans dropped)"),
            ):
                if key not in args.only:
                    continue
                print(f"  run {run} {key}: {label}", flush=True)
                try:
                    topic = new_topic(bootstrap, f"bench-{key}{run}", count, args.partitions)
                    if key in "ab":
                        outdir = workdir / f"out-{topic}"
                        outdir.mkdir()
                        extra = tuned if key == "b" else {}
                        timing = run_baseline(bootstrap, topic, count, args.partitions, extra, outdir)
                    else:
                        result = run_supervised(
                            bootstrap,
                            topic,
                            count,
                            args.partitions,
                            "amo" if key == "d" else "alo",
                            workdir,
                            sample_memory=(key == "c" and run == 1),
                            extra_env=METRICS_ENV if key == "e" else VARIANT_ENV.get(key),
                        )
                        assert result.timing is not None
                        timing = result.timing
                        if key == "i":
                            check_traced(workdir / f"out-{topic}", args.partitions)
                        memory |= result.memory
                    rates[key].append(timing.rate)
                    if timing.per_cpu:
                        per_cpu[key].append(timing.per_cpu)
                    print(f"    {timing.rate:12,.0f} msgs/s   ({timing.describe()})", flush=True)
                except Exception as exc:  # noqa: BLE001 - report the failed measurement and go on
                    failed.append(f"throughput run {run} {key}: {exc}")
                    print(f"    ! failed: {exc}", flush=True)
        print()
        print(
            f"3. Graceful hand-over ({args.handover_rounds} rounds, ~{HANDOVER_RATE} msgs/s produced throughout)",
            flush=True,
        )
        try:
            rounds = run_handover(bootstrap, args.handover_rounds, workdir)
        except Exception as exc:  # noqa: BLE001 - report the failed measurement and go on
            failed.append(f"hand-over: {exc}")
            print(f"    ! failed: {exc}", flush=True)
        broker_memory = memory_of(broker_pid, "broker")

    # ------------------------------------------------------------- report
    print()
    print("=" * 78)
    print("REPORT")
    print("=" * 78)
    best = {k: max(v) if v else None for k, v in rates.items()}
    print(f"1. Throughput (msgs/s, best of {args.runs}; all runs in brackets)")
    labels = {
        "a": "a. raw consumers, librdkafka defaults",
        "b": "b. raw consumers, worker fetch settings",
        "c": "c. marshal-workers run, ALO",
        "d": f"d. marshal-workers run, AMO batch {AMO_BATCH_SIZE}",
        "e": "e. marshal-workers run, ALO, metrics on",
        "f": "f. marshal-workers run, ALO, one empty hook",
        "g": "g. marshal-workers run, ALO, before+after",
        "h": "h. marshal-workers run, ALO, typed handler",
        "i": "i. marshal-workers run, ALO, tracing on",
    }
    for key, label in labels.items():
        runs = ", ".join(f"{r:,.0f}" for r in rates[key])
        shown = f"{best[key]:12,.0f}" if best[key] else f"{'-':>12}"
        print(f"   {label:<42} {shown}   [{runs}]")
    for num, den, target in (
        ("c", "b", TARGET_ALO),
        ("c", "a", TARGET_ALO),
        ("d", "b", TARGET_AMO),
        ("d", "a", TARGET_AMO),
        ("e", "c", TARGET_METRICS),
        ("f", "c", TARGET_HOOKS),
        ("g", "c", TARGET_HOOKS),
        ("h", "c", TARGET_TYPED),
    ):
        if best[num] and best[den]:
            ratio = best[num] / best[den]
            print(f"   {num}/{den} = {ratio:5.2f}   target >= {target:.2f}   {verdict(ratio >= target)}")
        else:
            print(f"   {num}/{den} = n/a    target >= {target:.1f}   FAIL (no measurement)")
    print(
        "   Messages per CPU-second (the consuming processes from first to last message, + the supervisor; "
        "not the broker):"
    )
    best_cpu = {k: max(v) if v else None for k, v in per_cpu.items()}
    for key, label in labels.items():
        runs = ", ".join(f"{r:,.0f}" for r in per_cpu[key])
        shown = f"{best_cpu[key]:12,.0f}" if best_cpu[key] else f"{'-':>12}"
        print(f"   {label:<42} {shown}   [{runs}]")
    for num, den, target in (
        ("c", "b", TARGET_ALO),
        ("d", "b", TARGET_AMO),
        ("f", "c", TARGET_HOOKS),
        ("g", "c", TARGET_HOOKS),
        ("h", "c", TARGET_TYPED),
    ):
        if best_cpu[num] and best_cpu[den]:
            ratio = best_cpu[num] / best_cpu[den]
            print(f"   {num}/{den} per CPU-s = {ratio:5.2f}   target >= {target:.2f}   {verdict(ratio >= target)}")
    print_tracing_cost(best, best_cpu)
    print()
    print("2. Memory of `run` (ALO, first run of c): USS = Private_Clean + Private_Dirty")
    if memory:
        print_memory(memory)
    else:
        print("   no sample (c run 1 failed)")
    if broker_memory is not None:
        print(f"   embedded broker (holds every benchmark topic in memory): RSS {mb(broker_memory.rss_kb)}")
    print()
    print("3. Graceful hand-over latency (new owner's first message - release record ts)")
    if rounds:
        latencies = [r.latency_ms for r in rounds]
        for i, r in enumerate(rounds, 1):
            match = "ok" if r.release_offset == r.first_offset else "MISMATCH"
            print(
                f"   round {i:2d}: {r.stopped} -> {r.started}: {r.latency_ms:7.1f} ms "
                f"(SIGTERM -> release ts {r.stop_ms:6.1f} ms); release offset {r.release_offset}, "
                f"first offset {r.first_offset}: {match}"
            )
            print(f"             {r.breakdown()}")
        median = statistics.median(latencies)
        print(f"   median {median:.1f} ms, max {max(latencies):.1f} ms, min {min(latencies):.1f} ms")
        print(f"   median < {TARGET_HANDOVER_MEDIAN_MS:.0f} ms: {verdict(median < TARGET_HANDOVER_MEDIAN_MS)}")
        mismatches = sum(r.release_offset != r.first_offset for r in rounds)
        print(
            f"   new owner starts at the release offset (nothing lost or repeated): "
            f"{verdict(mismatches == 0)} ({len(rounds) - mismatches}/{len(rounds)} rounds)"
        )
        if len(rounds) < args.handover_rounds:
            print(f"   FAIL: only {len(rounds)} of {args.handover_rounds} rounds completed")
    else:
        print("   no rounds completed: FAIL")
    print()
    notes = scan_logs(workdir)
    print(f"Supervisor logs: {len(notes)} warning/error line(s)")
    for note in notes[:20]:
        print("   " + note)
    if len(notes) > 20:
        print(f"   ... {len(notes) - 20} more in {workdir}")
    left = leftovers()
    if left:
        print(f"Left-over processes: {left}")
    for problem in failed:
        print(f"ERROR: {problem}")
    if failed or notes or left or args.keep:
        print(f"Work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Total time {time.monotonic() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
