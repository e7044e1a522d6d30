"""Dead-letter topics: what is in one (``dlq list``) and sending its messages back (``dlq redrive``).

A dead letter is the original message (value, key, headers, timestamp) with the
headers our workers add (``error``, ``error_type``, ``traceback`` when the
handler raised the error, ``handler``, ``original_topic``,
``original_partition``, ``original_offset``, and ``deliveries`` for shared
handlers).  Both commands read the dead-letter topic
from its start to its end as it is when they begin; a redrive checks
everything it can before it writes anything (the topics exist, each chosen
letter has somewhere to go), then sends each chosen letter once, through an
idempotent producer, without our headers.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Producer, TopicPartition

from marshal_workers.config import Settings
from marshal_workers.dead_letters import TRACEBACK_HEADER
from marshal_workers.errors import ConfigError, UnknownTopicError
from marshal_workers.kafka_clients import admin_client, client_config, topic_partition_count
from marshal_workers.positions import partition_bounds, position_consumer

# The headers a worker adds to a dead letter: dropped when it is sent back.
ADDED_HEADERS = frozenset(
    {"error", "error_type", "handler", "original_topic", "original_partition", "original_offset", "deliveries"}
) | {TRACEBACK_HEADER}


@dataclass(frozen=True)
class DeadLetter:
    partition: int  # in the dead-letter topic
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str | None:
        found = [value for key, value in self.headers if key == name]
        return found[-1].decode("utf-8", "replace") if found else None  # ours come last

    @property
    def error_type(self) -> str:
        return self.header("error_type") or "unknown"

    @property
    def original_headers(self) -> list[tuple[str, bytes]]:
        return [(key, value) for key, value in self.headers if key not in ADDED_HEADERS]


def read_dead_letters(
    settings: Settings, dlq_topic: str, after: Mapping[int, int] | None = None
) -> Iterator[DeadLetter]:
    """Every message of ``dlq_topic`` up to its end as it is now, partition by partition; with ``after``
    (partition -> next offset), only those from there on (what a reader that keeps a tally has not seen)."""
    count = topic_partition_count(admin_client(settings), settings, dlq_topic)
    if count is None:
        raise UnknownTopicError(f"the dead-letter topic {dlq_topic!r} does not exist on {settings.brokers}")
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, dlq_topic, range(count))
        for partition, (low, high) in sorted(bounds.items()):
            low = max(low, (after or {}).get(partition, low))
            if high <= low:
                continue
            consumer.assign([TopicPartition(dlq_topic, partition, low)])
            next_offset = low
            while next_offset < high:
                for message in consumer.consume(500, 1.0):
                    if message.error() is not None or message.offset() >= high:
                        continue
                    next_offset = message.offset() + 1
                    kind, stamp = message.timestamp()
                    yield DeadLetter(partition, message.offset(), None if kind == 0 else stamp, message.key(),
                                     message.value(), list(message.headers() or []))  # fmt: skip
            consumer.unassign()
    finally:
        consumer.close()


@dataclass
class _TypeTally:
    count: int = 0
    oldest_ms: int | None = None
    newest_ms: int | None = None
    from_topics: set[str] = field(default_factory=set)


class Tally:
    """Dead letters counted by error type as they are read, so a reader that comes back (the dashboard) reads only
    what is new: ``positions`` is where it goes on (partition -> next offset)."""

    def __init__(self) -> None:
        self._by_type: dict[str, _TypeTally] = collections.defaultdict(_TypeTally)
        self.positions: dict[int, int] = {}

    def add(self, letter: DeadLetter) -> None:
        row = self._by_type[letter.error_type]
        row.count += 1
        if letter.timestamp is not None:
            row.oldest_ms = letter.timestamp if row.oldest_ms is None else min(row.oldest_ms, letter.timestamp)
            row.newest_ms = letter.timestamp if row.newest_ms is None else max(row.newest_ms, letter.timestamp)
        row.from_topics.add(letter.header("original_topic") or "?")
        self.positions[letter.partition] = max(self.positions.get(letter.partition, 0), letter.offset + 1)

    def rows(self) -> list[dict[str, Any]]:
        """``dlq list``: per error type, how many, the oldest and newest time, and the topics they came from."""
        return [
            {"error_type": error_type, "count": row.count, "oldest_ms": row.oldest_ms, "newest_ms": row.newest_ms,
             "from_topics": sorted(row.from_topics)}
            for error_type, row in sorted(self._by_type.items(), key=lambda item: (-item[1].count, item[0]))
        ]  # fmt: skip


def summary(letters: Iterable[DeadLetter]) -> list[dict[str, Any]]:
    """``dlq list``: per error type, how many, the oldest and newest time, and the topics they came from."""
    tally = Tally()
    for letter in letters:
        tally.add(letter)
    return tally.rows()


def choose(letters: list[DeadLetter], error_type: str | None, since_ms: int | None) -> list[DeadLetter]:
    """The letters a redrive sends: of this error type, and written at or after ``since_ms``, if given."""
    return [
        letter
        for letter in letters
        if (error_type is None or letter.error_type == error_type)
        and (since_ms is None or (letter.timestamp is not None and letter.timestamp >= since_ms))
    ]


def redrive(
    settings: Settings, dlq_topic: str, chosen: list[DeadLetter], to_topic: str | None, report: Callable[[str], None]
) -> int:
    """Send ``chosen`` back to ``to_topic``, or each to its original topic; return how many were sent.

    Refused before anything is written: a letter with no original topic when no ``to_topic`` is given, or a
    target topic that does not exist.
    """
    targets = [(letter, to_topic or letter.header("original_topic")) for letter in chosen]
    nowhere = [letter for letter, target in targets if not target]
    if nowhere:
        raise ConfigError(f"{len(nowhere)} dead letters of {dlq_topic} name no original topic (first at "
                          f"{nowhere[0].partition}@{nowhere[0].offset}): give --to TOPIC")  # fmt: skip
    admin = admin_client(settings)
    missing = sorted({t for _, t in targets if t and topic_partition_count(admin, settings, t) is None})
    if missing:
        raise UnknownTopicError(f"nothing sent: {', '.join(missing)} does not exist on {settings.brokers}")
    producer = Producer(client_config(settings, "producer", **{"acks": "all", "enable.idempotence": True}))
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    for letter, target in targets:
        headers = letter.original_headers + [("redriven_from", f"{dlq_topic}/{letter.partition}/{letter.offset}".encode())]
        while True:
            try:
                producer.produce(target, value=letter.value, key=letter.key, headers=headers, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    left = producer.flush(settings.write_timeout * 3)
    if left or failures:
        raise ConfigError(f"{left + len(failures)} of {len(targets)} dead letters were not confirmed by Kafka "
                          f"({failures[0] if failures else 'timed out'}); the others were sent")  # fmt: skip
    for target, count in sorted(collections.Counter(t for _, t in targets).items()):
        report(f"sent {count} dead letters of {dlq_topic} to {target}")
    return len(targets)
