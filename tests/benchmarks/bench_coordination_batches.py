"""Benchmark: coordination records, produce batches and produce requests per member per minute, this checkout
against another, in one sitting.

    python tests/benchmarks/bench_coordination_batches.py [--seconds 60] [--warmup 15] [--rate 150]
        [--baseline /path/to/another/checkout] [--rounds 1]

Starts its own embedded broker behind a counting proxy (tests/kafka_proxy.py; the broker advertises the proxy,
so every request of every client passes through it).  The proxy reads every Produce request on its way: which
client sent it (the request header's client id, ``marshal-workers-<client id>``), and for each partition of the
coordination topic the record batches it carries and the records in each (the record batch header's count).
Nothing in the product is asked or changed, so the same count holds for a checkout that has no counters of its
own.

For each checkout (``--baseline`` first, e.g. ``git worktree add /tmp/base <commit>``, then this one; the
supervisors run with that checkout first on PYTHONPATH and as their working directory), a fresh fleet: a group
and coordination topic of its own, three fresh topics (8 partitions handled at least once, 2 at most once with
50-message batch claims, 2 shared with 50-offset ranges), ``--rate`` messages/s produced across them throughout,
two supervisors (``--balance fair``, HB 1 s, one shared worker each, ``coordination_batches_app.py``).  After
``--warmup`` seconds (claims settled) the counts are taken over ``--seconds``, then the fleet is stopped.

Printed per checkout and member, per minute: records, batches, records per batch, produce requests; the
messages handled in the window (both fleets did the same work); and for a checkout that has them, the
``marshal_workers_coordination_*_total`` metrics of its supervisors over the same window (librdkafka's own
statistics, every 5 s: a cross-check of the proxy's count).  ``--rounds N`` runs the pair N times, alternating.

A benchmark, not a test: the exit status is 0 unless the benchmark could not run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench_run import create_topic, machine_info, poll_until
from checkout import HERE, ROOT
from confluent_kafka import Producer
from kafka_proxy import PRODUCE, KafkaProxy
from processes import child_environment, group_command
from prometheus_client.parser import text_string_to_metric_families

from marshal_workers.kafka.embedded_broker import EmbeddedBroker, free_port

HB = "1s"
MEMBERS = 2
TOPICS = {"alo": 8, "amo": 2, "shared": 2}  # kind -> partitions
STOP_TIMEOUT_S = 40


# ------------------------------------------------------------------ Produce requests, as the proxy sees them


class _Reader:
    """Kafka's primitive types, read from the front of a request."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def fixed(self, size: int) -> int:
        value = int.from_bytes(self.data[self.at : self.at + size], "big", signed=True)
        self.at += size
        return value

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def raw(self, size: int) -> bytes:
        value = self.data[self.at : self.at + max(size, 0)]
        self.at += max(size, 0)
        return value

    def string(self, flexible: bool) -> str:
        size = self.uvarint() - 1 if flexible else self.fixed(2)
        return self.raw(size).decode()

    def records(self, flexible: bool) -> bytes:
        return self.raw(self.uvarint() - 1 if flexible else self.fixed(4))

    def count(self, flexible: bool) -> int:
        return self.uvarint() - 1 if flexible else self.fixed(4)

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.raw(self.uvarint())


def zigzag(reader: _Reader) -> int:
    value = reader.uvarint()
    return (value >> 1) ^ -(value & 1)


def record_types(batch: bytes, count: int) -> tuple[str, ...]:
    """The ``type`` of each coordination record in an uncompressed record batch (its values are JSON)."""
    if int.from_bytes(batch[21:23], "big") & 0x07:
        return ("?",) * count  # compressed: the coordinator's producer does not compress, others may
    reader, types = _Reader(batch), []
    reader.at = 61
    for _ in range(count):
        end = zigzag(reader)
        end += reader.at
        reader.raw(1)  # attributes
        zigzag(reader), zigzag(reader)  # timestamp delta, offset delta
        reader.raw(zigzag(reader))  # key
        value = reader.raw(zigzag(reader))
        try:
            types.append(str(json.loads(value).get("type", "?")))
        except ValueError:
            types.append("?")
        reader.at = end
    return tuple(types)


def batches_of(records: bytes) -> list[tuple[str, ...]]:
    """Each record batch (magic 2) in a partition's records, as the types of its records."""
    batches, at = [], 0
    while at + 61 <= len(records):
        length = int.from_bytes(records[at + 8 : at + 12], "big", signed=True)
        count = int.from_bytes(records[at + 57 : at + 61], "big", signed=True)  # the batch header's count
        batches.append(record_types(records[at : at + 12 + length], count))
        at += 12 + length
    return batches


def produce_request(body: bytes) -> tuple[str, dict[str, list[tuple[str, ...]]]] | None:
    """A Produce request's client id, and per topic each batch it carries, as its records' types (None: another
    request).  Versions 3 to 12 (9 and on: flexible); 13 names topics by id, which a count by name cannot use."""
    reader = _Reader(body)
    if reader.fixed(2) != PRODUCE:
        return None
    version = reader.fixed(2)
    if not 3 <= version <= 12:
        raise SystemExit(f"Produce request version {version}: this benchmark reads versions 3 to 12")
    flexible = version >= 9
    reader.fixed(4)  # correlation id
    client = reader.raw(reader.fixed(2)).decode()  # the header's client id is never a compact string
    if flexible:
        reader.tagged_fields()
    reader.string(flexible)  # transactional id
    reader.fixed(2), reader.fixed(4)  # acks, timeout
    batches: dict[str, list[tuple[str, ...]]] = {}
    for _ in range(reader.count(flexible)):
        topic = reader.string(flexible)
        for _ in range(reader.count(flexible)):
            reader.fixed(4)  # partition
            batches.setdefault(topic, []).extend(batches_of(reader.records(flexible)))
            if flexible:
                reader.tagged_fields()
        if flexible:
            reader.tagged_fields()
    return client, batches


@dataclass
class Sent:
    """What one client produced to one topic: Produce requests, record batches, records."""

    requests: int = 0
    batches: int = 0
    records: int = 0
    kinds: collections.Counter[tuple[str, ...]] = field(default_factory=collections.Counter)  # batches by records

    def copy(self) -> Sent:
        return Sent(self.requests, self.batches, self.records, collections.Counter(self.kinds))

    def minus(self, earlier: Sent) -> Sent:
        return Sent(
            self.requests - earlier.requests,
            self.batches - earlier.batches,
            self.records - earlier.records,
            self.kinds - earlier.kinds,
        )


@dataclass
class ProduceCounts:
    """The proxy's observer: per (client id, topic), what was produced."""

    sent: dict[tuple[str, str], Sent] = field(default_factory=lambda: collections.defaultdict(Sent))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: bytes) -> None:
        found = produce_request(body)
        if found is None:
            return
        client, topics = found
        with self.lock:
            for topic, batches in topics.items():
                sent = self.sent[(client, topic)]
                sent.requests += 1
                sent.batches += len(batches)
                sent.records += sum(len(types) for types in batches)
                sent.kinds.update(tuple(sorted(types)) for types in batches)

    def of(self, client: str, topic: str) -> Sent:
        with self.lock:
            return self.sent.get((client, topic), Sent()).copy()


# ------------------------------------------------------------------------------------------------ the fleet


class SteadyProducer:
    """``rate`` messages/s spread over the fleet's topics (each partition in turn), from a thread."""

    def __init__(self, bootstrap: str, partitions: dict[str, int], rate: float) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._targets = [(topic, p) for topic, count in partitions.items() for p in range(count)]
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        began, sent = time.monotonic(), 0
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * self._rate)
            while sent < due:
                topic, partition = self._targets[sent % len(self._targets)]
                self._producer.produce(topic, json.dumps({"amount": sent}).encode(), partition=partition)
                sent += 1
            self._producer.poll(0)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(10)


@dataclass
class Member:
    client_id: str
    metrics_port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def running(self) -> bool:
        return "running" in self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"    ! {self.client_id} did not stop within {STOP_TIMEOUT_S}s: killing it")
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its workers and fork server too
        except ProcessLookupError:
            pass
        self.process.wait()


def start_member(
    tree: Path, bootstrap: str, group: str, coordination: str, client_id: str, topics: dict[str, str], log_path: Path
) -> Member:
    """``marshal-workers run coordination_batches_app:app`` of ``tree`` (its package first on the path)."""
    port = free_port()
    env = child_environment(
        {
            "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)]),
            "MARSHAL_WORKERS_BALANCE": "fair",
            "MARSHAL_WORKERS_PROCESSES": "1",
            **{f"MW_BENCH_{kind.upper()}_TOPIC": topic for kind, topic in topics.items()},
        }
    )
    options = ["--heartbeat-interval", HB, "--client-id", client_id, "--metrics-port", str(port)]
    command = group_command(
        "run", "coordination_batches_app:app", *options, brokers=bootstrap, group=group, coordination_topic=coordination
    )
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, env=env, cwd=tree, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return Member(client_id, port, process, log_path)


def scrape(port: int) -> dict[str, float]:
    """A supervisor's metrics, summed over labels, by sample name (empty if it does not answer)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    sums: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] += sample.value
    return sums


HANDLED = ("marshal_workers_messages_handled_total", "marshal_workers_shared_messages_total")
STATS = ("records", "batches", "produce_requests")


@dataclass
class Row:
    """One member's window: what the proxy counted, its metrics' differences, the seconds."""

    checkout: str
    member: str
    sent: Sent
    metrics: dict[str, float]
    seconds: float

    def per_minute(self, count: float) -> float:
        return count * 60 / self.seconds


def run_fleet(
    label: str,
    tree: Path,
    broker: EmbeddedBroker,
    proxy_bootstrap: str,
    counts: ProduceCounts,
    args: argparse.Namespace,
    workdir: Path,
) -> list[Row]:
    name = uuid.uuid4().hex[:8]
    topics = {kind: f"{kind}-{name}" for kind in TOPICS}
    for kind, topic in topics.items():
        create_topic(broker.bootstrap, topic, TOPICS[kind])
    group, coordination = f"g-{name}", f"__marshal-{name}"
    producer = SteadyProducer(broker.bootstrap, {topics[k]: n for k, n in TOPICS.items()}, args.rate).start()
    members = [
        start_member(tree, proxy_bootstrap, group, coordination, f"member-{n}", topics, workdir / f"{label}-{n}.log")
        for n in range(MEMBERS)
    ]
    try:
        for member in members:
            poll_until(member.running, 90, f"{label} {member.client_id} to run ({member.log_path})", member.alive)
        time.sleep(args.warmup)
        clients = {m.client_id: f"marshal-workers-{m.client_id}" for m in members}
        before = {m.client_id: (counts.of(clients[m.client_id], coordination), scrape(m.metrics_port)) for m in members}
        began = time.monotonic()
        time.sleep(args.seconds)
        seconds = time.monotonic() - began
        rows = []
        for member in members:
            sent, metrics = counts.of(clients[member.client_id], coordination), scrape(member.metrics_port)
            earlier_sent, earlier_metrics = before[member.client_id]
            moved = {key: value - earlier_metrics.get(key, 0.0) for key, value in metrics.items()}
            rows.append(Row(label, member.client_id, sent.minus(earlier_sent), moved, seconds))
        return rows
    finally:
        for member in members:
            member.stop()
        producer.stop()


# ------------------------------------------------------------------------------------------------- the report


def print_rows(rows: list[Row]) -> None:
    print(
        f"  {'checkout':<9} {'member':<9} {'records/min':>11} {'batches/min':>11} {'records/batch':>13} "
        f"{'requests/min':>12} {'handled/s':>9}   librdkafka's statistics (records, batches, requests /min)"
    )
    for row in rows:
        sent, metrics = row.sent, row.metrics
        handled = sum(metrics.get(name, 0.0) for name in HANDLED) / row.seconds
        stats = [metrics.get(f"marshal_workers_coordination_{name}_total") for name in STATS]
        own = "n/a (no such metrics)" if None in stats else ", ".join(f"{row.per_minute(v):.0f}" for v in stats)  # type: ignore[arg-type]
        print(
            f"  {row.checkout:<9} {row.member:<9} {row.per_minute(sent.records):>11.0f} "
            f"{row.per_minute(sent.batches):>11.0f} {sent.records / max(sent.batches, 1):>13.2f} "
            f"{row.per_minute(sent.requests):>12.0f} {handled:>9.0f}   {own}"
        )


def print_kinds(rows: list[Row], top: int = 8) -> None:
    """The most frequent batches (by the types of their records), per checkout, per member per minute."""
    by_checkout: dict[str, collections.Counter[tuple[str, ...]]] = collections.defaultdict(collections.Counter)
    minutes: dict[str, float] = collections.defaultdict(float)
    for row in rows:
        by_checkout[row.checkout].update(row.sent.kinds)
        minutes[row.checkout] += row.seconds / 60
    for label, kinds in by_checkout.items():
        shown = ", ".join(f"{'+'.join(_runs(kind))} {n / minutes[label]:.0f}" for kind, n in kinds.most_common(top))
        print(f"  {label:<9} batches/member/min by content: {shown}")


def _runs(kind: tuple[str, ...]) -> list[str]:
    """("heartbeats", "heartbeats", "claim") as ["claim", "2 heartbeats"]."""
    return [f"{n} {t}" if n > 1 else t for t, n in sorted(collections.Counter(kind).items())]


def print_summary(rows: list[Row]) -> None:
    by_checkout: dict[str, list[Row]] = collections.defaultdict(list)
    for row in rows:
        by_checkout[row.checkout].append(row)
    totals = {}
    for label, found in by_checkout.items():
        members = len(found)
        totals[label] = {
            "records": sum(r.per_minute(r.sent.records) for r in found) / members,
            "batches": sum(r.per_minute(r.sent.batches) for r in found) / members,
            "requests": sum(r.per_minute(r.sent.requests) for r in found) / members,
        }
        t = totals[label]
        print(
            f"  {label:<9} per member per minute: {t['records']:.0f} records in {t['batches']:.0f} batches "
            f"({t['records'] / max(t['batches'], 1):.2f} records/batch), {t['requests']:.0f} produce requests"
        )
    if "baseline" in totals and "this" in totals:
        base, this = totals["baseline"], totals["this"]
        print(
            "  this / baseline: "
            + ", ".join(
                f"{what} x{this[what] / base[what]:.2f}" for what in ("records", "batches", "requests") if base[what]
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the window counted, per fleet")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after both members run, before it")
    parser.add_argument("--rate", type=float, default=150.0, help="messages/s produced across the fleet's topics")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, run first")
    parser.add_argument("--rounds", type=int, default=1, help="fleets per checkout, alternating")
    args = parser.parse_args()

    trees = ([("baseline", args.baseline.resolve())] if args.baseline else []) + [("this", ROOT)]
    print(
        f"{MEMBERS} supervisors (--balance fair, HB {HB}) on topics of {TOPICS['alo']} (ALO), {TOPICS['amo']} (AMO) "
        f"and {TOPICS['shared']} (shared) partitions, {args.rate:g} messages/s; {args.seconds:g}s counted after "
        f"{args.warmup:g}s; Produce requests read by a proxy in front of the embedded broker"
    )
    for line in machine_info():
        print("  " + line)
    for label, tree in trees:
        head = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
        )
        print(f"  {label:<9} {tree} {head.stdout.strip()[:90] or '(not a git checkout)'}")
    workdir = Path(tempfile.mkdtemp(prefix="mw-bench-batches-"))
    counts = ProduceCounts()
    proxy_port = free_port()
    rows: list[Row] = []
    with EmbeddedBroker(advertised=f"127.0.0.1:{proxy_port}", log_path=str(workdir / "broker.log")) as broker:
        proxy = KafkaProxy(proxy_port, broker.port, observe=counts).start()
        try:
            for round_ in range(args.rounds):
                for label, tree in trees:
                    print(f"\nround {round_ + 1}: {label} ...", flush=True)
                    found = run_fleet(label, tree, broker, f"127.0.0.1:{proxy_port}", counts, args, workdir)
                    print_rows(found)
                    rows += found
        finally:
            proxy.close()
    print("\nsummary (means over members and rounds):")
    print_summary(rows)
    print_kinds(rows)
    print(f"(logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
