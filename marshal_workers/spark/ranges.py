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

from collections.abc import Sequence

from marshal_workers.core.config import Settings
from marshal_workers.errors import OffsetRangeError
from marshal_workers.kafka.kafka_clients import admin_client, require_topic
from marshal_workers.kafka.partition_positions import (
    Bound,
    chosen_partitions,
    iso_time_ms,
    offsets_at,
    partition_bounds,
    position_consumer,
)
from marshal_workers.spark.planner import Split

__all__ = ["Bound", "check_order", "parse_bound", "resolve_ranges"]

FORMS = "earliest, latest, an offset (1234), or a time (2026-11-22T10:00:00, UTC if no zone; or @<ms since epoch>)"
_HINT = "use earliest/latest, a time, or --partition to pick partitions"


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
        return Bound("time", iso_time_ms(cleaned))
    except ValueError:
        raise OffsetRangeError(f"{option} {text!r}: expected {FORMS}") from None


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
    chosen = chosen_partitions(count, topic, partitions, OffsetRangeError)
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, topic, chosen)
        starts = offsets_at(consumer, settings, topic, bounds, start, "--from", OffsetRangeError, _HINT)
        ends = offsets_at(consumer, settings, topic, bounds, end, "--to", OffsetRangeError, _HINT)
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
