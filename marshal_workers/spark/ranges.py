"""Where a replay starts and ends: ``--from``/``--to`` -> a checked offset range per partition.

A bound is ``earliest``, ``latest``, an offset (the same for every partition),
or a time: ISO 8601 (UTC if it has no zone) or ``@`` and milliseconds since
the epoch.  ``--from`` is the first offset replayed; ``--to`` is the first one
not replayed (as in Kafka and in Spark's endingOffsets), so a time range is
[from, to) in record time.  Every check happens here, on the driver, before
any Spark job: an unknown topic or partition, an offset outside the log, a
start after the end.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import Consumer

from marshal_workers.config import Settings
from marshal_workers.errors import OffsetRangeError
from marshal_workers.kafka_clients import admin_client, require_topic
from marshal_workers.positions import Bounds, offsets_for_time, partition_bounds, position_consumer
from marshal_workers.spark.planner import Split

BoundKind = Literal["earliest", "latest", "offset", "time"]
FORMS = "earliest, latest, an offset (1234), or a time (2026-11-22T10:00:00, UTC if no zone; or @<ms since epoch>)"


@dataclass(frozen=True)
class Bound:
    kind: BoundKind
    value: int = 0  # the offset, or the time in ms since the epoch

    def __str__(self) -> str:
        if self.kind == "offset":
            return str(self.value)
        if self.kind == "time":
            return f"@{self.value}"
        return self.kind


EARLIEST = Bound("earliest")
LATEST = Bound("latest")


def parse_bound(text: str, option: str = "--from") -> Bound:
    """``earliest``, ``latest``, an offset, ``@<ms>`` or an ISO 8601 time."""
    cleaned = text.strip()
    if cleaned.lower() in ("earliest", "latest"):
        return Bound(cleaned.lower())  # type: ignore[arg-type]
    if cleaned.isdigit():
        return Bound("offset", int(cleaned))
    if cleaned.startswith("@") and cleaned[1:].isdigit():
        return Bound("time", int(cleaned[1:]))
    try:
        moment = datetime.datetime.fromisoformat(cleaned)
    except ValueError:
        raise OffsetRangeError(f"{option} {text!r}: expected {FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return Bound("time", int(moment.timestamp() * 1000))


def check_order(start: Bound, end: Bound) -> None:
    """Refuse what is backwards whatever the log holds: a later time or offset first."""
    if start.kind == end.kind and start.kind in ("offset", "time") and start.value > end.value:
        raise OffsetRangeError(f"--from {start} is after --to {end}: nothing lies between them")
    if start.kind == "latest" and end.kind == "earliest":
        raise OffsetRangeError("--from latest is after --to earliest: nothing lies between them")


def resolve_ranges(
    settings: Settings, topic: str, partitions: Sequence[int] | None, start: Bound, end: Bound
) -> list[Split]:
    """One range per partition (all of the topic's, or those given), each checked against its log."""
    check_order(start, end)
    count = require_topic(admin_client(settings), settings, topic)
    chosen = sorted(set(range(count) if not partitions else partitions))
    missing = [p for p in chosen if not 0 <= p < count]
    if missing:
        raise OffsetRangeError(f"topic {topic!r} has partitions 0..{count - 1}; there is no partition {missing[0]}")
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, topic, chosen)
        starts = _offsets(consumer, settings, topic, bounds, start, "--from")
        ends = _offsets(consumer, settings, topic, bounds, end, "--to")
    finally:
        consumer.close()
    for partition in chosen:
        if starts[partition] > ends[partition]:
            low, high = bounds[partition]
            raise OffsetRangeError(
                f"--from {start} is offset {starts[partition]} of {topic}[{partition}], after --to {end} "
                f"(offset {ends[partition]}); the partition holds offsets {low}..{high - 1}"
            )
    return [Split(topic, p, starts[p], ends[p]) for p in chosen]


def _offsets(
    consumer: Consumer, settings: Settings, topic: str, bounds: Mapping[int, Bounds], bound: Bound, option: str
) -> dict[int, int]:
    if bound.kind == "earliest":
        return {p: b.low for p, b in bounds.items()}
    if bound.kind == "latest":
        return {p: b.high for p, b in bounds.items()}
    if bound.kind == "time":
        return offsets_for_time(consumer, settings, topic, bounds, bound.value)
    for partition, (low, high) in bounds.items():
        if not low <= bound.value <= high:
            held = f"offsets {low}..{high - 1}" if high > low else f"no offsets (it is empty at {high})"
            raise OffsetRangeError(
                f"{option} {bound.value} is outside {topic}[{partition}], which holds {held}; "
                f"use earliest/latest, a time, or --partition to pick partitions"
            )
    return {p: bound.value for p in bounds}
