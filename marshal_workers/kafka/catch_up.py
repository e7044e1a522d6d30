"""Reading up to the ends a reader knows: when a reader that catches up (a checkpoint search, ``status``, ``log``, a
starting member) has read everything that was written when it began, without waiting for an empty fetch.

An empty fetch is what tells a reader it is at a partition's end (end-of-partition), and the embedded broker holds
one for the whole fetch wait; a reader catching up reads with the catch-up wait (guarded_consumer.catch_up_wait_ms),
so it would pay that wait at the end of every partition.  Instead it stops at the end it knows:

- ListOffsets when reading began (``listed_bounds``).  On Kafka that is the partition's end.  The embedded broker
  answers the base offset of the last batch plus one: the end, less the last batch's other records.
- The high watermark of the fetch response that brought the partition's first record (librdkafka caches it before
  it hands the records over): right on both, and at least the listed end.  Only that first one: on a busy log a
  later one moves on, and a reader that chased it might never be done.

A partition listed as empty (end 0) has nothing to read; any other is at its end once a record at or past its
known end was read, or end-of-partition was reported (a partition whose records retention removed since).  A
partition at its end is no longer fetched until the reader tails (GuardedConsumer.read_up_to_end).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import KafkaException

from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.protocol.partition_end import partition_end

log = logging.getLogger(__name__)


class KnownEnds:
    """Per partition, the end a catching-up reader reads up to, and whether it got there.  Pure: the reader gives
    it the listed ends, the records it read, and the high watermark ``wants_fetched_end`` asks for."""

    def __init__(self, listed: Sequence[int]) -> None:
        self.targets = list(listed)  # -1: not listed (the broker did not answer)
        self._fetched = [False] * len(listed)  # the fetched high watermark is in targets
        self.at_end = [end == 0 for end in listed]

    def wants_fetched_end(self, partition: int) -> bool:
        """Should the reader pass the high watermark of the fetch that brought this record (``fetched_end``)?"""
        return not self._fetched[partition]

    def fetched_end(self, partition: int, high: int) -> None:
        if high >= 0:
            self.targets[partition] = partition_end(self.targets[partition], high)
            self._fetched[partition] = True

    def read(self, partition: int, offset: int) -> bool:
        """The record at ``offset`` was read: True if that took the partition to its end."""
        if self._fetched[partition] and offset + 1 >= self.targets[partition] and not self.at_end[partition]:
            self.at_end[partition] = True
            return True
        return False

    def ended(self, partition: int) -> None:
        """End-of-partition was reported."""
        self.at_end[partition] = True

    def all_read(self) -> bool:
        return all(self.at_end)


def listed_bounds(consumer: GuardedConsumer, topic: str, partition_count: int, timeout: float) -> list[tuple[int, int]]:
    """Each partition's (start, end) as ListOffsets answers them now (asked at once), (-1, -1) where the broker
    does not answer."""
    bounds = []
    for partition, listed in consumer.listed_watermarks(topic, range(partition_count), timeout).items():
        if isinstance(listed, KafkaException):
            log.debug("%s[%d]: no end listed (%s): reading up to its end-of-partition event", topic, partition, listed)
            listed = (-1, -1)
        bounds.append(listed)
    return bounds


def read_record(ends: KnownEnds, consumer: GuardedConsumer, topic: str, partition: int, offset: int) -> None:
    """Tell ``ends`` of a record read, and stop fetching its partition if that was the last one it knew of (on the
    thread that polls ``consumer``: the cached watermark is its)."""
    if ends.at_end[partition]:
        return
    if ends.wants_fetched_end(partition):
        ends.fetched_end(partition, consumer.fetched_end(topic, partition))
    if ends.read(partition, offset):
        consumer.read_up_to_end(topic, partition)


def partition_ended(ends: KnownEnds, consumer: GuardedConsumer, topic: str, partition: int) -> None:
    """End-of-partition was reported for it: it is read up to its end."""
    if not ends.at_end[partition]:
        ends.ended(partition)
        consumer.read_up_to_end(topic, partition)


def fetch_only_those_behind(ends: KnownEnds, consumer: GuardedConsumer, topic: str) -> None:
    """Right after the reader is assigned: partitions with nothing to read are not fetched while it catches up."""
    for partition, done in enumerate(ends.at_end):
        if done:
            consumer.read_up_to_end(topic, partition)
