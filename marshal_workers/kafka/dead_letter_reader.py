"""What is in a dead-letter topic: its letters (DeadLetter: the original message and the headers our workers
added, kafka/dead_letter_writer.py), read from the topic's start to its end as it is when the reading begins, and tallied
per error type and per group (Tally).  ``dlq list``, ``dlq redrive`` (ops/dlq.py) and the dashboard read them here.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.errors import UnknownTopicError
from marshal_workers.kafka.dead_letter_writer import TRACEBACK_HEADER, WRITTEN_AT_HEADER
from marshal_workers.kafka.kafka_clients import admin_client, take_fetched, topic_partition_count
from marshal_workers.kafka.partition_positions import partition_bounds, position_consumer
from marshal_workers.protocol.dead_letter_groups import CLIENT_ID_HEADER, GROUP_HEADER, REDRIVEN_FOR_HEADER, last_header

# The headers a worker adds to a dead letter, and a redrive's address (it is addressed anew): dropped when it is
# sent back.
ADDED_HEADERS = frozenset(
    {
        "error",
        "error_type",
        "handler",
        "original_topic",
        "original_partition",
        "original_offset",
        "deliveries",
        GROUP_HEADER,
        CLIENT_ID_HEADER,
        REDRIVEN_FOR_HEADER,
        TRACEBACK_HEADER,
        WRITTEN_AT_HEADER,
    }
)


@dataclass(frozen=True)
class DeadLetter:
    partition: int  # in the dead-letter topic
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str | None:
        """The last header called ``name`` (ours come last), as text; None if it has none, or an empty one."""
        found = last_header(self.headers, name)
        return None if found is None else found.decode("utf-8", "replace")

    @property
    def error_type(self) -> str:
        return self.header("error_type") or "unknown"

    @property
    def group(self) -> str | None:
        """The group whose worker wrote it; None if it does not say (written before letters named their group)."""
        return self.header(GROUP_HEADER)

    @property
    def client_id(self) -> str | None:
        return self.header(CLIENT_ID_HEADER)

    def redrive_headers(self, dlq_topic: str) -> list[tuple[str, bytes]]:
        """What it carries back: its original headers, where it was in ``dlq_topic``, and (if it names one) the
        group it is for, as that group's name was written (compared as bytes by the runners)."""
        headers = self.original_headers + [("redriven_from", f"{dlq_topic}/{self.partition}/{self.offset}".encode())]
        group = last_header(self.headers, GROUP_HEADER)
        return headers + ([(REDRIVEN_FOR_HEADER, group)] if group is not None else [])

    @property
    def written_ms(self) -> int | None:
        """When it was dead-lettered (ms since the epoch); None for a letter written before letters said so."""
        text = self.header(WRITTEN_AT_HEADER)
        return int(text) if text is not None and text.isdigit() else None

    @property
    def original_headers(self) -> list[tuple[str, bytes]]:
        return [(key, value) for key, value in self.headers if key not in ADDED_HEADERS]


def read_dead_letters(
    settings: Settings, dlq_topic: str, after: Mapping[int, int] | None = None
) -> Iterator[DeadLetter]:
    """Every message of ``dlq_topic`` up to its end as it is now, in order within each partition; with ``after``
    (partition -> next offset), only those from there on (what a reader that keeps a tally has not seen).

    Every partition is read at once.  One after another, each paid a fetch the embedded broker held for the
    whole wait (the one sent at the end of the partition before it): a third of a second a partition, 12 s for
    a topic of 12 partitions before the reader stopped waiting for a full batch too."""
    count = topic_partition_count(admin_client(settings), settings, dlq_topic)
    if count is None:
        raise UnknownTopicError(f"the dead-letter topic {dlq_topic!r} does not exist on {settings.brokers}")
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, dlq_topic, range(count))
        starts = {p: max(low, (after or {}).get(p, low)) for p, (low, _) in bounds.items()}
        ends = {p: high for p, (_, high) in bounds.items() if high > starts[p]}  # those with something to read
        consumer.assign([TopicPartition(dlq_topic, p, starts[p]) for p in ends])
        while ends:
            for message in take_fetched(consumer, 500, 1.0):
                partition, offset = message.partition(), message.offset()
                if partition not in ends or offset is None or message.error() is not None:
                    continue
                end = ends[partition]
                if offset >= end:
                    continue
                if offset + 1 >= end:  # its last one: fetched no more (a fetch at its end would be held)
                    del ends[partition]
                    consumer.read_up_to_end(dlq_topic, partition)
                kind, stamp = message.timestamp()
                # Ignored: the stub's headers() may be a dict (which goes only to the producer); a consumed
                # record's are a list of (name, bytes).
                yield DeadLetter(
                    partition,
                    offset,
                    None if kind == 0 else stamp,
                    message.key(),
                    message.value(),
                    list(message.headers() or []),  # type: ignore[arg-type]
                )
        consumer.unassign()
    finally:
        consumer.close()


@dataclass
class _TypeTally:
    count: int = 0
    oldest_ms: int | None = None  # the original messages' times
    newest_ms: int | None = None
    from_topics: set[str] = field(default_factory=set)
    written_oldest_ms: int | None = None  # when they were dead-lettered (letters that say so)
    written_newest_ms: int | None = None

    def add(self, letter: DeadLetter) -> None:
        stamp, written = letter.timestamp, letter.written_ms
        self.merge(_TypeTally(1, stamp, stamp, {letter.header("original_topic") or "?"}, written, written))

    def merge(self, other: _TypeTally) -> None:
        self.count += other.count
        self.oldest_ms = _either(min, self.oldest_ms, other.oldest_ms)
        self.newest_ms = _either(max, self.newest_ms, other.newest_ms)
        self.from_topics |= other.from_topics
        self.written_oldest_ms = _either(min, self.written_oldest_ms, other.written_oldest_ms)
        self.written_newest_ms = _either(max, self.written_newest_ms, other.written_newest_ms)


def _either(pick: Callable[[int, int], int], one: int | None, other: int | None) -> int | None:
    """``pick`` of the two times that are known (None: unknown)."""
    return other if one is None else one if other is None else pick(one, other)


class Tally:
    """Dead letters counted by group and error type as they are read, so a reader that comes back (the dashboard)
    reads only what is new: ``positions`` is where it goes on (partition -> next offset)."""

    def __init__(self) -> None:
        # (the group that wrote them, or None: they do not say; error type) -> their tally
        self._by_type: dict[tuple[str | None, str], _TypeTally] = collections.defaultdict(_TypeTally)
        self.positions: dict[int, int] = {}

    def add(self, letter: DeadLetter) -> None:
        self._by_type[(letter.group, letter.error_type)].add(letter)
        self.positions[letter.partition] = max(self.positions.get(letter.partition, 0), letter.offset + 1)

    def rows(self, groups: Collection[str | None] | None = None) -> list[dict[str, Any]]:
        """``dlq list``: per error type, how many, the oldest and newest time of the original messages and of their
        dead-lettering, and the topics they came from; of
        the letters of ``groups`` only, if given (None in it: the letters that name no group)."""
        merged: dict[str, _TypeTally] = collections.defaultdict(_TypeTally)
        for (group, error_type), row in self._by_type.items():
            if groups is None or group in groups:
                merged[error_type].merge(row)
        return [
            {
                "error_type": error_type,
                "count": row.count,
                "oldest_ms": row.oldest_ms,
                "newest_ms": row.newest_ms,
                "written_oldest_ms": row.written_oldest_ms,
                "written_newest_ms": row.written_newest_ms,
                "from_topics": sorted(row.from_topics),
            }
            for error_type, row in sorted(merged.items(), key=lambda item: (-item[1].count, item[0]))
        ]

    def groups(self) -> list[dict[str, Any]]:
        """How many letters each group wrote, most first; ``"group": None`` counts those that name no group."""
        counts: collections.Counter[str | None] = collections.Counter()
        for (group, _), row in self._by_type.items():
            counts[group] += row.count
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0] is None, item[0] or ""))
        return [{"group": group, "count": count} for group, count in ranked]


def summary(letters: Iterable[DeadLetter], groups: Collection[str | None] | None = None) -> list[dict[str, Any]]:
    """``dlq list``: per error type, how many, the oldest and newest time, and the topics they came from (of the
    letters of ``groups`` only, if given)."""
    tally = Tally()
    for letter in letters:
        tally.add(letter)
    return tally.rows(groups)
