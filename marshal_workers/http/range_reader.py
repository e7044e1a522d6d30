"""The Kafka side of a served topic: reading its held ranges' messages, and what it read past them.

One consumer reads every held range that is not read to its end, each partition from the lowest offset still to
read there, and every message goes to the range that covers it.  What the consumer read past every held range of
a partition is kept (read_ahead.py) for the next range claimed there, and each partition's end as the fetches saw
it (where ListOffsets lists less, it is the end: protocol/partition_end.py).  Messages redriven for another group
(dead_letter_groups.py) are never handed out: they are done, as offsets without a message.
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from marshal_workers.core.logs import ContextLog
from marshal_workers.http.read_ahead import ReadAhead
from marshal_workers.http.serve_counters import ServeCounters
from marshal_workers.http.served_lease import ServedLease, covering
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import RECORD_HEADERS
from marshal_workers.protocol.dead_letter_groups import OtherGroups

FETCH_MOST = 500


class RangeReader:
    """Reads the messages of one served topic's held ranges (shared with the ServedTopic, under its lock)."""

    def __init__(
        self,
        topic: str,
        group: str,
        ranges: dict[tuple[int, int], ServedLease],
        lock: threading.Lock,
        counters: ServeCounters,
        log: ContextLog,
    ) -> None:
        self.topic = topic
        self.log = log
        self._ranges = ranges
        self._lock = lock
        self._counters = counters
        self._other_groups = OtherGroups(group, RECORD_HEADERS)  # messages redriven for another group
        self._positions: dict[int, int] = {}  # partition -> the next offset the consumer reads there
        self.fetched_high: dict[int, int] = {}  # partition -> its end as fetches saw it
        self._ahead = ReadAhead()  # messages read past the held ranges, for the next ones claimed (read_ahead.py)

    def take_ahead(self, held: ServedLease) -> None:
        """A range just claimed takes what was read of it already: no fetch before its first read.  Under the
        lock."""
        taken = self._ahead.take(held.partition, held.start, held.end)
        if taken is None:
            return
        records, held.fetched_to = taken
        for offset, record in records.items():
            if record is None:
                self._counters.other_group += 1  # never handed out: done, as an offset with no message
            else:
                held.messages[offset] = record

    def fetch(self, consumer: GuardedConsumer) -> None:
        """Read the messages of every held range not read yet: one consumer, each partition from the lowest offset
        still to read, every message routed to the range that covers it."""
        with self._lock:
            wanted: dict[int, int] = {}
            for held in self._ranges.values():
                if not held.fetched():
                    wanted[held.partition] = min(wanted.get(held.partition, held.fetched_to), held.fetched_to)
        if not wanted:
            if self._positions:
                consumer.unassign()
                self._positions = {}
            return
        if set(wanted) != set(self._positions) or any(wanted[p] < self._positions[p] for p in wanted):
            consumer.assign([TopicPartition(self.topic, p, offset) for p, offset in sorted(wanted.items())])
            self._positions = dict(wanted)
        reading_from = dict(self._positions)
        records = consumer.consume(FETCH_MOST, 0.01)  # short: the loop has more to do than wait here
        seen: dict[int, int] = {}  # partition -> the offset after the last message (or the end) seen
        fetched: list[tuple[int, int, Any]] = []
        for record in records:
            error = record.error()
            partition, offset = record.partition(), record.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and partition is not None and offset is not None:
                    seen[partition] = max(seen.get(partition, 0), offset)  # nothing more there for now
                else:
                    self.log.warning("%s[%s]: fetch error: %s", self.topic, partition, error)
                continue
            assert partition is not None and offset is not None  # a record, not an error event: it has both
            fetched.append((partition, offset, record))
            seen[partition] = max(seen.get(partition, 0), offset + 1)
        for partition, seen_end in seen.items():
            if partition in self._positions:
                self._positions[partition] = max(self._positions[partition], seen_end)
            high = consumer.fetched_end(self.topic, partition)  # the true end, where ListOffsets lists less
            if high > self.fetched_high.get(partition, -1):
                self.fetched_high[partition] = high
        not_ours = self._other_groups.keys([record for _, _, record in fetched])
        with self._lock:
            for partition, offset, record in fetched:
                into = covering(self._ranges, partition, offset)
                if into is not None and offset >= into.fetched_to and offset not in into.acked:
                    if not_ours and (partition, offset) in not_ours:
                        self._counters.other_group += 1  # never handed out: done, as an offset with no message
                    else:
                        into.messages[offset] = record
            for held in self._ranges.values():
                reached = seen.get(held.partition)
                if reached is not None and reached > held.fetched_to:  # read in order from at most fetched_to
                    held.fetched_to = min(reached, held.end)
            self._keep_ahead(reading_from, seen, fetched, not_ours)

    def _keep_ahead(
        self,
        reading_from: dict[int, int],
        seen: dict[int, int],
        fetched: list[tuple[int, int, Any]],
        not_ours: frozenset[tuple[int, int]],
    ) -> None:
        """What this fetch read past every held range of a partition goes to the read-ahead. Under the lock."""
        for partition, reached in seen.items():
            ends = [held.end for held in self._ranges.values() if held.partition == partition]
            begin = max(reading_from.get(partition, reached), *ends)
            past = {
                offset: None if (partition, offset) in not_ours else record
                for p, offset, record in fetched
                if p == partition and offset >= begin
            }
            self._ahead.note(partition, begin, reached, past)
