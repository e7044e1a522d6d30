"""Audit a group's coordination log on Spark: who owned what when, hand-overs and their gaps, zombies.

1. Plan the whole coordination topic (every partition, its start to its end
   as a fetch reports it) into splits, and read them in parallel with the
   split reader.  Each task decodes its records with the project's codec and
   keeps the group's (and the garbage): a DataFrame, cached, since several
   actions use it.
2. Fold: the records of each coordination partition go to one task, in log
   order (repartition + sort within partitions), where ownership.OwnershipAudit
   feeds them to WorldState.apply, the rules every member folds by.
3. Tables (Parquet under ``--out DIR``): records, garbage, ownership (the
   timeline: one row per tenure), handoffs, zombies, clients; and the figures
   of ``--json``.

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

from marshal_workers import codec
from marshal_workers.config import Settings
from marshal_workers.errors import DecodeError, UnknownGroupError
from marshal_workers.kafka_clients import admin_client, topic_partition_count
from marshal_workers.positions import partition_bounds, position_consumer
from marshal_workers.spark import ownership
from marshal_workers.spark.jobs import run_job
from marshal_workers.spark.planner import Split, plan_splits
from marshal_workers.spark.split_reader import SplitReader
from marshal_workers.world_state import record_time

if TYPE_CHECKING:
    from pyspark.rdd import RDD
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

READ_BATCH = 5000
TIMELINE_SHOWN = 60  # the text report lists the timeline when it has at most this many tenures

# Columns of the decoded log (the records table); a row is either a record of the group or garbage.
LOG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("log_partition", "long"),  # where it is in the coordination topic
    ("log_offset", "long"),
    ("at_ms", "long"),  # the time the fold uses: LogAppendTime if the broker stamped one, else ts
    ("type", "string"),  # claim, heartbeat, release, claim_messages, release_group; null: garbage
    ("ts", "long"),
    ("client", "string"),
    ("instance", "string"),
    ("topic", "string"),
    ("partition", "long"),
    ("offset", "long"),
    ("expires", "long"),
    ("key", "string"),  # garbage only: its Kafka key, the one hint of whose it was
    ("error", "string"),  # garbage only: why it is not a record
)
RECORD_COLUMNS = [name for name, _ in LOG_COLUMNS if name not in ("key", "error")]
GARBAGE_COLUMNS = ["log_partition", "log_offset", "key", "error"]
_TAGS = {ownership.Tenure: 0, ownership.Handoff: 1, ownership.Zombie: 2, ownership.ClientCounts: 3}
_SUMMARY = 4


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


class _Frames(NamedTuple):
    log: DataFrame
    events: RDD[Any]  # the fold's output, tagged by table (persisted: every table below reads it)
    tenures: DataFrame
    handoffs: DataFrame
    zombies: DataFrame
    clients: DataFrame


# ------------------------------------------------------------------ driver


def plan_log(settings: Settings, max_split: int) -> tuple[int, list[Split]]:
    """The coordination topic's partition count and the splits that cover all of it, now."""
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
    return count, plan_splits([Split(topic, p, low, high) for p, (low, high) in bounds.items()], max_split)


def audit(
    spark: SparkSession,
    settings: Settings,
    coordination_partitions: int,
    splits: list[Split],
    out: Path | None = None,
) -> AuditReport:
    """Read, decode and fold the group's coordination log; write the tables under ``out`` if given."""
    group = settings.require_group()
    started = time.monotonic()
    spark.sparkContext.setJobDescription(f"marshal-workers audit {group}")
    frames = _frames(spark, settings, group, coordination_partitions, splits)
    try:
        summaries = run_job("audit (read and fold)", lambda: _summaries(frames))
        records = sum(s.records for s in summaries)
        garbage = run_job("audit (garbage)", frames.log.where("type IS NULL").count)
        if records == 0:
            raise UnknownGroupError(
                f"group {group!r} has no record in {settings.coordination_topic} on {settings.brokers} "
                f"({garbage} garbage values); check --group and --coordination-topic"
            )
        gaps = run_job("audit (hand-overs)", lambda: _gap_figures(frames.handoffs))
        tenures = sum(s.tenures for s in summaries)
        timeline = run_job("audit (timeline)", lambda: _timeline(frames.tenures)) if tenures <= TIMELINE_SHOWN else []
        clients = run_job("audit (clients)", lambda: [row.asDict() for row in _client_table(frames.clients).collect()])
        tables = run_job("audit (tables)", lambda: _write_tables(frames, out)) if out is not None else {}
    finally:
        frames.events.unpersist()
        frames.log.unpersist()
    return AuditReport(
        group=group,
        coordination_topic=settings.coordination_topic,
        coordination_partitions=coordination_partitions,
        records=records,
        garbage=garbage,
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
        tables=tables,
    )


def _frames(
    spark: SparkSession, settings: Settings, group: str, coordination_partitions: int, splits: list[Split]
) -> _Frames:
    """The lazy plan: the decoded log (cached), and the fold's tables over it."""
    sc = spark.sparkContext
    rows = sc.parallelize(splits, max(1, len(splits))).flatMap(functools.partial(read_log_split, settings, group))
    log = spark.createDataFrame(rows, _schema(LOG_COLUMNS), verifySchema=False).cache()
    ordered = (
        log.where("type IS NOT NULL")
        .select(*RECORD_COLUMNS)
        .repartition(max(1, coordination_partitions), "log_partition")
        .sortWithinPartitions("log_partition", "log_offset")
    )
    fold = functools.partial(fold_rows, group, settings.heartbeat_ms, coordination_partitions)
    events = ordered.rdd.mapPartitions(fold).persist()

    def table(tag: int, kind: type) -> DataFrame:
        return spark.createDataFrame(
            events.filter(lambda event: event[0] == tag).map(operator.itemgetter(1)), _schema_of(kind)
        )

    return _Frames(
        log=log,
        events=events,
        tenures=table(_TAGS[ownership.Tenure], ownership.Tenure),
        handoffs=table(_TAGS[ownership.Handoff], ownership.Handoff),
        zombies=table(_TAGS[ownership.Zombie], ownership.Zombie),
        clients=table(_TAGS[ownership.ClientCounts], ownership.ClientCounts),
    )


def _summaries(frames: _Frames) -> list[ownership.LogSummary]:
    return frames.events.filter(lambda event: event[0] == _SUMMARY).map(operator.itemgetter(1)).collect()


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


def _write_tables(frames: _Frames, out: Path) -> dict[str, str]:
    tables = {
        "records": frames.log.where("type IS NOT NULL").select(*RECORD_COLUMNS),
        "garbage": frames.log.where("type IS NULL").select(*GARBAGE_COLUMNS),
        "ownership": frames.tenures,
        "handoffs": frames.handoffs,
        "zombies": frames.zombies,
        "clients": _client_table(frames.clients),
    }
    written = {}
    for name, frame in tables.items():
        path = out / name
        frame.write.mode("overwrite").parquet(str(path))
        written[name] = str(path)
    return written


# ---------------------------------------------------------------- executors


def read_log_split(settings: Settings, group: str, split: Split) -> Iterator[tuple[Any, ...]]:
    """In a task: the rows of one split of the coordination log: the group's records, and every garbage value."""
    decode, group_rows = codec.decode, _row
    with SplitReader(settings, split) as reader:
        for messages in reader.batches(READ_BATCH):
            for message in messages:
                try:
                    record = decode(message.value())
                except DecodeError as exc:
                    key = message.key()
                    yield (
                        message.partition(), message.offset(), None, None, None, None, None, None, None, None, None,
                        None if key is None else key.decode("utf-8", "replace"), str(exc),
                    )  # fmt: skip
                    continue
                if record.group == group:
                    kind, stamp = message.timestamp()
                    at = record_time(record, stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None)
                    yield group_rows(record, message.partition(), message.offset(), at)


def _row(record: codec.Record, log_partition: int, log_offset: int, at: int) -> tuple[Any, ...]:
    tag = record.__struct_config__.tag
    head = (log_partition, log_offset, at, tag, record.ts, record.client, record.instance)
    if isinstance(record, codec.ReleaseGroup):
        return (*head, None, None, None, record.expires, None, None)
    offset = None if isinstance(record, codec.Claim) else record.offset
    return (*head, record.topic, record.partition, offset, None, None, None)


def fold_rows(
    group: str, heartbeat_ms: int, coordination_partitions: int, rows: Iterable[Any]
) -> Iterator[tuple[int, Any]]:
    """In a task: rows sorted by (log_partition, log_offset) -> the audit's events, tagged by table."""
    audit: ownership.OwnershipAudit | None = None
    build = functools.partial(_record, group)
    for row in rows:
        log_partition = row[0]
        if audit is None or audit.log_partition != log_partition:
            if audit is not None:
                yield from _tagged(audit.finish())
            audit = ownership.OwnershipAudit(group, heartbeat_ms, coordination_partitions, log_partition)
        events = audit.feed(build(row), row[2], row[1])
        if events:
            yield from _tagged(events)
    if audit is not None:
        yield from _tagged(audit.finish())


def _tagged(events: Iterable[ownership.Event]) -> Iterator[tuple[int, Any]]:
    for event in events:
        yield _TAGS.get(type(event), _SUMMARY), event


def _record(group: str, row: Any) -> codec.Record:
    """A record struct again from its row (RECORD_COLUMNS order): what the codec decoded, field for field."""
    _, _, _, tag, ts, client, instance, topic, partition, offset, expires = row
    if tag == "heartbeat":
        return codec.Heartbeat(
            v=1, ts=ts, group=group, client=client, instance=instance, topic=topic, partition=partition, offset=offset
        )
    if tag == "claim":
        return codec.Claim(v=1, ts=ts, group=group, client=client, instance=instance, topic=topic, partition=partition)
    if tag == "release":
        return codec.Release(
            v=1, ts=ts, group=group, client=client, instance=instance, topic=topic, partition=partition, offset=offset
        )
    if tag == "claim_messages":
        return codec.ClaimMessages(
            v=1, ts=ts, group=group, client=client, instance=instance, topic=topic, partition=partition, offset=offset
        )
    return codec.ReleaseGroup(v=1, ts=ts, group=group, client=client, instance=instance, expires=expires)


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
    }


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
            until = "end of the log (still the owner)" if t.end_ms is None else f"{_utc(t.end_ms)} ({t.end_reason})"
            lines.append(f"  {t.topic}[{t.partition}] {t.client}/{t.instance}: {_utc(t.start_ms)} -> {until}")
    elif report.tenures:
        lines.append(
            f"\n{report.tenures:,} tenures in the ownership timeline: --out DIR writes it (and more) as Parquet"
        )
    if report.tables:
        lines += ["", "tables written (Parquet): " + ", ".join(report.tables.values())]
    return lines


def _utc(ms: int) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"
    except (ValueError, OverflowError, OSError):
        return f"{ms}ms"


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
