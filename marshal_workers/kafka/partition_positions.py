"""Positions in a topic's partitions: where each log starts and ends, and the offset for a time.

The thin Kafka shell shared by ``admin set-position`` and ``replay``.  Two
broker differences (docs/brokers.md) shape it:

* The end of a partition (its high watermark) is taken from a fetch
  response: Tansu's ListOffsets "latest" under-reports it.
* The offset for a time is asked of Kafka (ListOffsets by timestamp: the first
  offset whose record time is at or after it) and then checked against the
  records on either side of it, because Tansu answers the start of the log
  whatever the time.  When the check fails, the offset is found by a binary
  search over the records' times, which assumes they grow with the offsets
  (LogAppendTime, or producers whose clocks agree), and a warning says so.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.errors import KafkaUnavailable
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import take_fetched
from marshal_workers.protocol.partition_end import partition_end

log = logging.getLogger(__name__)


class Bounds(NamedTuple):
    """The offsets a partition holds: ``low`` (its first) up to, not including, ``high`` (its end)."""

    low: int
    high: int


BoundKind = Literal["earliest", "latest", "offset", "time"]


@dataclass(frozen=True)
class Bound:
    """A position asked for in each chosen partition: its start, its end, an offset, or a time."""

    kind: BoundKind
    value: int = 0  # the offset, or the time in ms since the epoch

    def __str__(self) -> str:
        if self.kind == "offset":
            return str(self.value)
        if self.kind == "time":
            return f"@{self.value}"
        return self.kind


def iso_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 time, UTC if it has no zone; ValueError if it is not one."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def chosen_partitions(count: int, topic: str, partitions: Sequence[int] | None, error: type[Exception]) -> list[int]:
    """The partitions asked for (all ``count`` of them if none are given), each one that exists, or ``error``."""
    chosen = sorted(set(range(count) if not partitions else partitions))
    missing = [p for p in chosen if not 0 <= p < count]
    if missing:
        raise error(f"topic {topic!r} has partitions 0..{count - 1}; there is no partition {missing[0]}")
    return chosen


def offsets_at(
    consumer: GuardedConsumer,
    settings: Settings,
    topic: str,
    bounds: Mapping[int, Bounds],
    bound: Bound,
    option: str,
    error: type[Exception],
    hint: str,
) -> dict[int, int]:
    """The offset ``bound`` names in each partition of ``bounds``; an offset outside a log is ``error``."""
    if bound.kind == "earliest":
        return {p: b.low for p, b in bounds.items()}
    if bound.kind == "latest":
        return {p: b.high for p, b in bounds.items()}
    if bound.kind == "time":
        return offsets_for_time(consumer, settings, topic, bounds, bound.value)
    for partition, (low, high) in bounds.items():
        if not low <= bound.value <= high:
            held = f"offsets {low}..{high - 1}" if high > low else f"no offsets (it is empty at {high})"
            raise error(f"{option} {bound.value} is outside {topic}[{partition}], which holds {held}; {hint}")
    return {p: bound.value for p in bounds}


class Stamped(NamedTuple):
    """A record's offset and time (ms since epoch), as a probe of the log found it."""

    offset: int
    timestamp: int


def position_consumer(settings: Settings) -> GuardedConsumer:
    """A consumer for looking things up: assign() only, a throwaway group id, never a commit."""
    # Look-ups read records that are there (up to ends they know): with the catch-up's long wait, which gets through
    # the embedded broker's listing of a long partition at once (docs/brokers.md).
    return GuardedConsumer(
        client_profiles.position_reader(settings), "a look-up of positions", settings.heartbeat_interval, catch_up=True
    )


def partition_bounds(
    consumer: GuardedConsumer, settings: Settings, topic: str, partitions: Sequence[int]
) -> dict[int, Bounds]:
    """(low, high) of each partition.  ``high`` comes from a fetch response, all partitions at once."""
    listed: dict[int, Bounds] = {}
    for partition, answer in consumer.listed_watermarks(topic, partitions, settings.connect_timeout).items():
        if isinstance(answer, KafkaException):
            raise KafkaUnavailable(f"cannot read the offsets of {topic}[{partition}] on {settings.brokers}: {answer}")
        listed[partition] = Bounds(*answer)
    fetched = _fetched_highs(consumer, settings, topic, {p: listed[p].low for p in partitions})
    return {p: Bounds(listed[p].low, partition_end(listed[p].high, fetched.get(p, -1))) for p in partitions}


def _fetched_highs(
    consumer: GuardedConsumer, settings: Settings, topic: str, lows: Mapping[int, int]
) -> dict[int, int]:
    """The high watermarks the first fetch responses carry (what is cached once a fetch came back), each partition
    fetched from its first offset ``lows[p]`` (a number: no look-up of a logical offset first)."""
    partitions = list(lows)
    consumer.assign([TopicPartition(topic, p, low) for p, low in lows.items()])
    highs: dict[int, int] = {}
    deadline = time.monotonic() + settings.connect_timeout
    try:
        while len(highs) < len(partitions) and time.monotonic() < deadline:
            consumer.consume(1000, 0.05)  # the records are not wanted; the fetches bring the watermarks
            for partition in partitions:
                if partition not in highs:
                    high = consumer.fetched_end(topic, partition)
                    if high >= 0:
                        highs[partition] = high
    finally:
        consumer.unassign()
    return highs


def first_records(
    consumer: GuardedConsumer, settings: Settings, topic: str, starts: Mapping[int, int], count: int
) -> dict[int, list[Stamped]]:
    """Up to ``count`` records of each partition from its start offset, all partitions at once.

    Fewer than ``count`` means the partition ended first.  KafkaUnavailable if the records do not come
    within the connect timeout.
    """
    found: dict[int, list[Stamped]] = {p: [] for p in starts}
    pending = set(starts)
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])
    deadline = time.monotonic() + settings.connect_timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                where = ", ".join(f"{topic}[{p}]@{starts[p]}" for p in sorted(pending))
                raise KafkaUnavailable(
                    f"no answer from {settings.brokers} within {settings.connect_timeout:g}s reading {where}"
                )
            for message in take_fetched(consumer, max(1, count * len(pending)), 0.1):
                partition, offset = message.partition(), message.offset()
                if partition not in pending or (offset is not None and offset < starts[partition]):
                    continue  # not asked for, or left over from an earlier assignment
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(partition)
                    continue
                assert offset is not None  # a record, not an error event
                stamped = found[partition]
                stamped.append(Stamped(offset, message.timestamp()[1]))
                if len(stamped) >= count:
                    pending.discard(partition)
    finally:
        consumer.unassign()
    return found


def offsets_for_time(
    consumer: GuardedConsumer, settings: Settings, topic: str, bounds: Mapping[int, Bounds], timestamp_ms: int
) -> dict[int, int]:
    """Per partition, the first offset whose record time is at or after ``timestamp_ms`` (its end if none)."""
    asked = _asked_offsets(consumer, settings, topic, bounds, timestamp_ms)
    wrong = [p for p in _unconfirmed(consumer, settings, topic, bounds, asked, timestamp_ms)]
    if wrong:
        log.warning(
            "the broker at %s gave offsets for time %d on %s that its records contradict (Tansu ignores the time); "
            "searching the records instead, which assumes their times grow with their offsets",
            settings.brokers,
            timestamp_ms,
            topic,
        )
        asked |= _search(consumer, settings, topic, {p: bounds[p] for p in wrong}, timestamp_ms)
    return asked


def _asked_offsets(
    consumer: GuardedConsumer, settings: Settings, topic: str, bounds: Mapping[int, Bounds], timestamp_ms: int
) -> dict[int, int]:
    wanted = [TopicPartition(topic, p, timestamp_ms) for p in bounds]
    try:
        answers = consumer.offsets_for_times(wanted, timeout=settings.connect_timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot look up {topic} at time {timestamp_ms} on {settings.brokers}: {exc}") from None
    offsets = {}
    for answer in answers:
        low, high = bounds[answer.partition]
        # -1: no record at or after that time, so the end.  Clamped: a lookup may race with retention or appends.
        offsets[answer.partition] = high if answer.offset < 0 else min(max(answer.offset, low), high)
    return offsets


def _unconfirmed(
    consumer: GuardedConsumer,
    settings: Settings,
    topic: str,
    bounds: Mapping[int, Bounds],
    offsets: Mapping[int, int],
    timestamp_ms: int,
) -> Iterable[int]:
    """Partitions whose answer the records around it contradict: one before it at or after the time, or the
    first one from it before the time."""
    starts = {p: max(offset - 1, bounds[p].low) for p, offset in offsets.items()}
    around = first_records(consumer, settings, topic, starts, count=2)
    for partition, records in around.items():
        offset = offsets[partition]
        before = [r for r in records if r.offset < offset]
        after = [r for r in records if r.offset >= offset and r.offset < bounds[partition].high]
        if any(r.timestamp >= timestamp_ms for r in before) or (after and after[0].timestamp < timestamp_ms):
            yield partition


def _search(
    consumer: GuardedConsumer, settings: Settings, topic: str, bounds: Mapping[int, Bounds], timestamp_ms: int
) -> dict[int, int]:
    """Binary search, all partitions in step: the smallest offset whose next record is at or after the time.

    Invariant: the answer lies in [lo, hi]; ``hi`` starts at the end, where no record follows.
    """
    ranges = {p: [b.low, b.high] for p, b in bounds.items()}
    while unresolved := {p: (lo + hi) // 2 for p, (lo, hi) in ranges.items() if lo < hi}:
        probes = first_records(consumer, settings, topic, unresolved, count=1)
        for partition, middle in unresolved.items():
            lo_hi = ranges[partition]
            found = [r for r in probes[partition] if r.offset < lo_hi[1]]
            if not found or found[0].timestamp >= timestamp_ms:
                lo_hi[1] = middle  # the next record from the middle is late enough (or there is none before hi)
            else:
                lo_hi[0] = found[0].offset + 1  # every record up to the one found is too early
    return {p: lo for p, (lo, _) in ranges.items()}
