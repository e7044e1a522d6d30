"""Audit a group's coordination log on Spark: who owned what when, hand-overs and their gaps, zombies.

One task per coordination partition reads it whole with the split reader,
decodes each record with the project's codec, and folds the group's records,
in log order, with ownership.OwnershipAudit, which feeds them to
WorldState.apply: the rules every member folds by.  Ownership of a topic is
totally ordered within its one coordination partition (md5 routing), so the
partitions are folded independently, in parallel, and the fold needs no
shuffle: it must see a partition's records in order in one task anyway, and
reading them there (~400,000 records/s per core) is faster than moving them
(a first version read splits in parallel, then repartitioned and sorted the
decoded log by coordination partition: 70,000 records/s on local[2]).

What the tasks emit (tenures, hand-overs, zombies, per-client counts, the
garbage, and with ``--out`` every decoded record) becomes DataFrames: the
figures of ``--json`` are aggregations over them, and ``--out DIR`` writes
them as Parquet tables: records (the group's decoded log), garbage, ownership
(the timeline: one row per tenure), handoffs, zombies, clients.

Garbage is counted over the whole coordination topic: a value that does not
decode names no group it could be trusted for (its key, kept in the garbage
table, may tell a person).
"""

from __future__ import annotations

import functools
import operator
import time
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from marshal_workers.core.config import Settings
from marshal_workers.errors import DecodeError, UnknownGroupError
from marshal_workers.kafka.kafka_clients import admin_client, topic_partition_count
from marshal_workers.kafka.partition_positions import partition_bounds, position_consumer
from marshal_workers.kafka.reader_start import find_checkpoints
from marshal_workers.observe.status import utc_iso
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import record_time
from marshal_workers.spark import ownership
from marshal_workers.spark.jobs import run_job
from marshal_workers.spark.lease_audit import RangeLease
from marshal_workers.spark.planner import Split, plan_splits
from marshal_workers.spark.split_reader import SplitReader

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

READ_BATCH = 5000
TIMELINE_SHOWN = 60  # the text report lists the timeline when it has at most this many tenures

# The records table: the group's decoded log, one row per record.
RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("log_partition", "long"),  # where it is in the coordination topic
    ("log_offset", "long"),
    ("at_ms", "long"),  # the time the fold uses: LogAppendTime if the broker stamped one, else ts
    ("type", "string"),  # the record type (docs/protocol.md); multi-partition records one row per entry
    ("ts", "long"),
    ("client", "string"),
    ("instance", "string"),
    ("topic", "string"),
    ("partition", "long"),
    ("offset", "long"),
    ("expires", "long"),  # release_group, pause_topic
    ("command", "string"),  # control: an operator's order, "drain|resume|shutdown <client>"
)
GARBAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("log_partition", "long"),
    ("log_offset", "long"),
    ("key", "string"),  # its Kafka key, the one hint of whose it was
    ("error", "string"),  # why it is not a record
)
_TAGS = {ownership.Tenure: 0, ownership.Handoff: 1, ownership.Zombie: 2, ownership.ClientCounts: 3, RangeLease: 7}
_SUMMARY, _GARBAGE, _RECORD = 4, 5, 6


@dataclass(frozen=True)
class AuditReport:
    group: str
    coordination_topic: str
    coordination_partitions: int
    records: int
    garbage: int
    partitions: int
    handoffs: int  # measured kinds only (release, stale, reclaim)
    handoffs_after_pause: int
    handoff_p50_ms: float | None
    handoff_max_ms: int | None
    zombie_records: int
    tenures: int
    seconds: float
    clients: list[dict[str, Any]] = field(default_factory=list)  # per client, most records first
    timeline: list[ownership.Tenure] = field(default_factory=list)  # when it is short enough to print
    tables: dict[str, str] = field(default_factory=dict)  # name -> Parquet directory written
    shared: list[dict[str, Any]] = field(default_factory=list)  # per shared topic: its range leases (lease_audit)


class _Tables(NamedTuple):
    """The task's output as DataFrames (lazy: each action runs on the persisted events)."""

    tenures: DataFrame
    handoffs: DataFrame
    zombies: DataFrame
    clients: DataFrame
    garbage: DataFrame
    leases: DataFrame
    records: DataFrame | None  # only when the tables are written: 1M rows cost seconds to move


# ------------------------------------------------------------------ driver


Seeds = dict[int, list[codec.Checkpoint]]  # coordination partition -> the checkpoint its split starts at


def plan_log(settings: Settings, from_beginning: bool = False) -> tuple[int, list[Split], Seeds]:
    """The coordination topic's partition count, one split per partition from its latest checkpoint of the
    group (from its beginning if it has none, or if asked) to its end as it is now, and those checkpoints.

    UnknownGroupError if the topic is missing or empty: there is nothing to audit, so Spark need not start.
    """
    topic = settings.coordination_topic
    count = topic_partition_count(admin_client(settings), settings, topic)
    if count is None:
        raise UnknownGroupError(
            f"the coordination topic {topic!r} does not exist on {settings.brokers}, so no group has a record "
            "there; check --coordination-topic and --brokers"
        )
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, topic, list(range(count)))
    finally:
        consumer.close()
    if not any(high > low for low, high in bounds.values()):
        raise UnknownGroupError(
            f"the coordination topic {topic} on {settings.brokers} is empty: "
            f"group {settings.require_group()!r} has no record there"
        )
    seeds: Seeds = {}
    if not from_beginning:
        found = find_checkpoints(settings, topic, count, settings.require_group())
        seeds = {p: parts for p, parts in enumerate(found) if parts is not None}
    # Never cut: the fold needs each partition in order, in one task.  A partition with nothing to read and
    # no checkpoint makes no task.
    whole = [
        Split(topic, p, max(low, seeds[p][0].as_of) if p in seeds else low, high) for p, (low, high) in bounds.items()
    ]
    splits = plan_splits(whole, max_split=2**62)
    splits += [split for split in whole if split.start == split.end and split.partition in seeds]
    return count, splits, seeds


def audit(
    spark: SparkSession,
    settings: Settings,
    coordination_partitions: int,
    splits: list[Split],
    out: str | Path | None = None,
    seeds: Seeds | None = None,
) -> AuditReport:
    """Read, decode and fold the group's coordination log; write the tables under ``out`` if given.

    ``out`` is a directory, or any URL Spark writes to (hdfs://, s3a://, ... on a cluster).
    """
    group = settings.require_group()
    started = time.monotonic()
    sc = spark.sparkContext
    sc.setJobDescription(f"marshal-workers audit {group}")
    task = functools.partial(
        audit_split, settings, group, settings.heartbeat_ms, coordination_partitions, out is not None, seeds or {}
    )
    events = sc.parallelize(splits, max(1, len(splits))).flatMap(task).persist()
    small = events.filter(lambda event: event[0] != _RECORD).persist() if out is not None else events
    try:
        summaries = run_job("audit (read and fold)", lambda: _select(small, _SUMMARY).collect())
        records = sum(s.records for s in summaries)
        if records == 0 and not seeds:
            raise UnknownGroupError(
                f"group {group!r} has no record in {settings.coordination_topic} on {settings.brokers} "
                f"({sum(s.garbage for s in summaries)} garbage values); check --group and --coordination-topic"
            )
        tables = _tables(spark, events, small, with_records=out is not None)
        gaps = run_job("audit (hand-overs)", lambda: _gap_figures(tables.handoffs))
        tenures = sum(s.tenures for s in summaries)
        timeline = run_job("audit (timeline)", lambda: _timeline(tables.tenures)) if tenures <= TIMELINE_SHOWN else []
        clients = run_job("audit (clients)", lambda: [row.asDict() for row in _client_table(tables.clients).collect()])
        shared = run_job(
            "audit (range leases)", lambda: [row.asDict() for row in _lease_table(tables.leases).collect()]
        )
        written = run_job("audit (tables)", lambda: _write_tables(tables, out)) if out is not None else {}
    finally:
        small.unpersist()
        events.unpersist()
    return AuditReport(
        group=group,
        coordination_topic=settings.coordination_topic,
        coordination_partitions=coordination_partitions,
        records=records,
        garbage=sum(s.garbage for s in summaries),
        partitions=sum(s.partitions for s in summaries),
        handoffs=gaps["count"],
        handoffs_after_pause=gaps["after_pause"],
        handoff_p50_ms=gaps["p50"],
        handoff_max_ms=gaps["max"],
        zombie_records=sum(s.zombie_records for s in summaries),
        tenures=tenures,
        seconds=time.monotonic() - started,
        clients=clients,
        timeline=timeline,
        tables=written,
        shared=shared,
    )


def _select(events: RDD[Any], tag: int) -> RDD[Any]:
    return events.filter(lambda event: event[0] == tag).map(operator.itemgetter(1))


def _tables(spark: SparkSession, events: RDD[Any], small: RDD[Any], with_records: bool) -> _Tables:
    def frame(tag: int, schema: StructType, source: RDD[Any] = small) -> DataFrame:
        return spark.createDataFrame(_select(source, tag), schema, verifySchema=False)

    return _Tables(
        tenures=frame(_TAGS[ownership.Tenure], _schema_of(ownership.Tenure)),
        handoffs=frame(_TAGS[ownership.Handoff], _schema_of(ownership.Handoff)),
        zombies=frame(_TAGS[ownership.Zombie], _schema_of(ownership.Zombie)),
        clients=frame(_TAGS[ownership.ClientCounts], _schema_of(ownership.ClientCounts)),
        garbage=frame(_GARBAGE, _schema(GARBAGE_COLUMNS)),
        leases=frame(_TAGS[RangeLease], _schema_of(RangeLease)),
        records=frame(_RECORD, _schema(RECORD_COLUMNS), events) if with_records else None,
    )


def _gap_figures(handoffs: DataFrame) -> dict[str, Any]:
    from pyspark.sql import functions as F

    measured = F.col("kind").isin(*ownership.HANDOFF_KINDS_MEASURED)
    row = handoffs.agg(
        F.sum(measured.cast("long")).alias("count"),
        F.sum((~measured).cast("long")).alias("after_pause"),
        F.percentile(F.when(measured, F.col("gap_ms")), F.lit(0.5)).alias("p50"),
        F.max(F.when(measured, F.col("gap_ms"))).alias("max"),
    ).first()
    assert row is not None
    return {"count": row["count"] or 0, "after_pause": row["after_pause"] or 0, "p50": row["p50"], "max": row["max"]}


def _timeline(tenures: DataFrame) -> list[ownership.Tenure]:
    rows = tenures.orderBy("topic", "partition", "start_ms", "log_offset").collect()
    return [ownership.Tenure(*row) for row in rows]


def _client_table(counts: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    summed = [F.sum(name).alias(name) for name in ownership.ClientCounts._fields[2:-2]]
    return (
        counts.groupBy("client")
        .agg(
            F.countDistinct("instance").alias("instances"),
            *summed,
            F.min("first_ms").alias("first_ms"),
            F.max("last_ms").alias("last_ms"),
        )
        .orderBy(F.desc("records"), "client")
    )


def _lease_table(leases: DataFrame) -> DataFrame:
    """Per shared topic: leases by outcome, offsets handed out again, lost and dead-lettered, claim-to-ack times."""
    from pyspark.sql import functions as F

    size = F.col("end") - F.col("start")
    acked, amo = F.col("outcome") == "acked", F.col("amo") == 1
    return (
        leases.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("leases"),
            *(
                F.sum((F.col("outcome") == name).cast("long")).alias(name)
                for name in ("acked", "cancelled", "lapsed", "open")
            ),
            F.sum(F.when(F.col("deliveries") > 1, size).otherwise(0)).alias("offsets_delivered_again"),
            F.sum(
                F.when(amo & (F.col("outcome") == "lapsed"), size).when(amo & acked, F.col("failed")).otherwise(0)
            ).alias("offsets_lost"),
            F.sum("dead").alias("dead_letters"),
            F.percentile(F.when(acked, F.col("claim_to_end_ms")), F.lit(0.5)).alias("claim_to_ack_p50_ms"),
            F.percentile(F.when(acked, F.col("claim_to_end_ms")), F.lit(0.99)).alias("claim_to_ack_p99_ms"),
        )
        .orderBy("topic")
    )


def _write_tables(tables: _Tables, out: str | Path) -> dict[str, str]:
    assert tables.records is not None
    frames = {
        "records": tables.records,
        "garbage": tables.garbage,
        "ownership": tables.tenures,
        "handoffs": tables.handoffs,
        "zombies": tables.zombies,
        "clients": _client_table(tables.clients),
        "leases": tables.leases,
    }
    written = {}
    for name, frame in frames.items():
        path = f"{str(out).rstrip('/')}/{name}"  # not Path: a URL's // must survive
        frame.write.mode("overwrite").parquet(path)
        written[name] = path
    return written


# ---------------------------------------------------------------- executors


def audit_split(
    settings: Settings,
    group: str,
    heartbeat_ms: int,
    coordination_partitions: int,
    with_records: bool,
    seeds: Seeds,
    split: Split,
) -> Iterator[tuple[int, Any]]:
    """In a task: read one coordination partition from its checkpoint (seeds) or its start, decode it, fold the
    group's records in log order.

    Yields (tag, row): the audit's events as they happen, the garbage, every record of the group if asked,
    and at the end the open tenures, the counts and the partition's summary.
    """
    log_partition = split.partition
    audit = ownership.OwnershipAudit(group, heartbeat_ms, coordination_partitions, log_partition)
    if log_partition in seeds:
        audit.seed(seeds[log_partition])
    if split.start == split.end:  # nothing since the checkpoint
        yield from _tagged(audit.finish())
        return
    stats, feed, decode, expand = audit.state.stats, audit.feed, codec.decode, codec.expand
    with SplitReader(settings, split) as reader:
        for messages in reader.batches(READ_BATCH):
            for message in messages:
                try:
                    record = decode(message.value())
                except DecodeError as exc:
                    stats.garbage += 1  # as WorldState.apply_value counts it
                    key = message.key()
                    text = None if key is None else key.decode("utf-8", "replace")
                    yield _GARBAGE, (log_partition, message.offset(), text, str(exc))
                    continue
                if record.group != group or isinstance(record, codec.Checkpoint):
                    continue  # another group's; or a checkpoint, which tells a reader of the whole log nothing
                kind, stamp = message.timestamp()
                at = record_time(record, stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None)
                log_offset = message.offset()
                for single in expand(record):  # Heartbeats, MessageClaims: audited as the records they hold
                    if with_records:
                        yield _RECORD, _row(single, log_partition, log_offset, at)
                    events = feed(single, at, log_offset)
                    if events:
                        yield from _tagged(events)
    yield from _tagged(audit.finish())


def _row(record: codec.Record, log_partition: int, log_offset: int, at: int) -> tuple[Any, ...]:
    """A record as a row of the records table (RECORD_COLUMNS)."""
    tag = record.__struct_config__.tag
    head = (log_partition, log_offset, at, tag, record.ts, record.client, record.instance)
    if isinstance(record, codec.ReleaseGroup):
        return (*head, None, None, None, record.expires, None)
    if isinstance(record, codec.Control):
        return (*head, None, None, None, None, f"{record.action} {record.target}")
    if isinstance(record, codec.PauseTopic):
        return (*head, record.topic, None, None, record.expires, None)
    if isinstance(
        record, (*codec.RANGE_RECORD_TYPES, *codec.MESSAGE_RECORD_TYPES)
    ):  # several partitions: the leases table has them one by one
        return (*head, record.topic, None, None, None, None)
    # Ignored: the records left are about one partition each (expand() split the others); mypy cannot tell.
    offset = None if isinstance(record, (codec.Claim, codec.ReleasePartition)) else record.offset  # type: ignore[union-attr]
    return (*head, record.topic, record.partition, offset, None, None)  # type: ignore[union-attr]


def _tagged(events: Iterable[ownership.Event]) -> Iterator[tuple[int, Any]]:
    for event in events:
        yield _TAGS.get(type(event), _SUMMARY), event


# ------------------------------------------------------------------ output


def document(report: AuditReport) -> dict[str, Any]:
    """``audit --json``."""
    return {
        "group": report.group,
        "records": report.records,
        "garbage": report.garbage,
        "partitions": report.partitions,
        "handoffs": {"count": report.handoffs, "p50_ms": report.handoff_p50_ms, "max_ms": report.handoff_max_ms},
        "zombie_records": report.zombie_records,
    } | ({"shared": report.shared} if report.shared else {})  # only for a group that shares partitions


def render(report: AuditReport) -> list[str]:
    """The report for people: figures, clients, the timeline if short, the tables written."""
    p50 = "-" if report.handoff_p50_ms is None else f"{report.handoff_p50_ms:,.0f} ms"
    peak = "-" if report.handoff_max_ms is None else f"{report.handoff_max_ms:,} ms"
    where = f"group {report.group} in {report.coordination_topic} ({report.coordination_partitions} partitions)"
    lines = [
        f"{where}: {report.records:,} records, {report.garbage:,} garbage values, "
        + f"{report.partitions:,} partitions held; audited in {report.seconds:.1f} s",
        f"hand-overs: {report.handoffs:,} (gap p50 {p50}, max {peak})"
        + (f"; {report.handoffs_after_pause:,} more after operator pauses" if report.handoffs_after_pause else ""),
        f"zombie records: {report.zombie_records:,} (heartbeats and message claims from non-owners, ignored)",
        "",
        f"{'client':<32}{'instances':>10}{'records':>12}{'claims won':>18}{'zombie records':>16}",
    ]
    for c in report.clients:
        claims = f"{c['claims_accepted']:,}/{c['claims']:,}"
        lines.append(f"{c['client']:<32}{c['instances']:>10,}{c['records']:>12,}{claims:>18}{c['zombie_records']:>16,}")
    if report.timeline:
        lines += ["", "ownership timeline:"]
        for t in report.timeline:
            until = "end of the log (still the owner)" if t.end_ms is None else f"{utc_iso(t.end_ms)} ({t.end_reason})"
            lines.append(f"  {t.topic}[{t.partition}] {t.client}/{t.instance}: {utc_iso(t.start_ms)} -> {until}")
    elif report.tenures:
        lines.append(
            f"\n{report.tenures:,} tenures in the ownership timeline: --out DIR writes it (and more) as Parquet"
        )
    if report.shared:
        lines += ["", "shared partitions (range leases):"]
        for s in report.shared:
            p50, p99 = s["claim_to_ack_p50_ms"], s["claim_to_ack_p99_ms"]
            times = "-" if p50 is None else f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"
            lines.append(
                f"  {s['topic']}: {s['leases']:,} leases ({s['acked']:,} acked, {s['cancelled']:,} cancelled, "
                f"{s['lapsed']:,} lapsed, {s['open']:,} open); {s['offsets_delivered_again']:,} offsets delivered "
                f"again, {s['offsets_lost']:,} lost, {s['dead_letters']:,} dead letters; claim to ack {times}"
            )
    if report.tables:
        lines += ["", "tables written (Parquet): " + ", ".join(report.tables.values())]
    return lines


# ------------------------------------------------------------------ schemas


def _schema(columns: Iterable[tuple[str, str]]) -> StructType:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {"long": LongType(), "string": StringType()}
    return StructType([StructField(name, types[kind], True) for name, kind in columns])


def _schema_of(kind: type) -> StructType:
    """A NamedTuple's Spark schema from its type hints: int -> long, str -> string (every column nullable)."""
    hints = typing.get_type_hints(kind)
    columns = []
    for name in kind._fields:  # type: ignore[attr-defined]
        types = set(typing.get_args(hints[name])) or {hints[name]}
        columns.append((name, "string" if str in types else "long"))
    return _schema(columns)
