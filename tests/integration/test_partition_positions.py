"""Positions and split reading on a real broker: bounds, offsets for a time, replay ranges, one split's records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.errors import OffsetRangeError, UnknownTopicError
from marshal_workers.kafka.partition_positions import Bounds, offsets_for_time, partition_bounds, position_consumer
from marshal_workers.spark.planner import Split
from marshal_workers.spark.ranges import Bound, resolve_ranges
from marshal_workers.spark.split_reader import SplitReader, SplitReadError

pytestmark = pytest.mark.broker

T0 = 1_700_000_000_000
PER_PARTITION = 40  # message i of partition p is "p-i", written at T0 + 1000 * i


@pytest.fixture
def topic(settings: Settings, unique: str) -> str:
    """Three partitions of 40 messages, one second apart in record time; a fourth partition stays empty."""
    name = f"history-{unique}"
    admin = AdminClient({"bootstrap.servers": settings.brokers})
    admin.create_topics([NewTopic(name, num_partitions=4, replication_factor=1)])[name].result(10)
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 5})
    for i in range(PER_PARTITION):
        for partition in range(3):
            producer.produce(name, value=f"{partition}-{i}".encode(), partition=partition, timestamp=T0 + 1000 * i)
    assert producer.flush(30) == 0
    return name


@pytest.fixture
def consumer(settings: Settings) -> Iterator:
    consumer = position_consumer(settings)
    yield consumer
    consumer.close()


def test_bounds_come_from_the_log(settings: Settings, topic: str, consumer) -> None:
    bounds = partition_bounds(consumer, settings, topic, [0, 1, 2, 3])
    assert bounds == {0: Bounds(0, 40), 1: Bounds(0, 40), 2: Bounds(0, 40), 3: Bounds(0, 0)}


@pytest.mark.parametrize(
    ("at", "expected"),
    [(T0 - 5000, 0), (T0, 0), (T0 + 1, 1), (T0 + 12_500, 13), (T0 + 39_000, 39), (T0 + 39_001, 40), (T0 * 2, 40)],
)
def test_the_offset_for_a_time_is_the_first_record_at_or_after_it(
    settings: Settings, topic: str, consumer, at: int, expected: int
) -> None:
    # On Tansu the broker's own answer is always the log start: this also covers the search that replaces it.
    bounds = partition_bounds(consumer, settings, topic, [0, 1, 3])
    assert offsets_for_time(consumer, settings, topic, bounds, at) == {0: expected, 1: expected, 3: 0}


def test_replay_ranges_by_offset_and_time(settings: Settings, topic: str) -> None:
    ranges = resolve_ranges(settings, topic, [1, 0], Bound("offset", 5), Bound("time", T0 + 30_000))
    assert ranges == [Split(topic, 0, 5, 30), Split(topic, 1, 5, 30)]
    everything = resolve_ranges(settings, topic, None, Bound("earliest"), Bound("latest"))
    assert [(r.partition, r.start, r.end) for r in everything] == [(0, 0, 40), (1, 0, 40), (2, 0, 40), (3, 0, 0)]


def test_bad_replay_ranges_say_what_is_wrong(settings: Settings, topic: str) -> None:
    with pytest.raises(UnknownTopicError):
        resolve_ranges(settings, f"{topic}-missing", None, Bound("earliest"), Bound("latest"))
    with pytest.raises(OffsetRangeError, match=r"--from 41 is outside .*\[0\], which holds offsets 0..39"):
        resolve_ranges(settings, topic, [0], Bound("offset", 41), Bound("latest"))
    with pytest.raises(OffsetRangeError, match=r"--to 1 is outside .*\[3\], which holds no offsets"):
        resolve_ranges(settings, topic, None, Bound("earliest"), Bound("offset", 1))
    with pytest.raises(OffsetRangeError, match="there is no partition 4"):
        resolve_ranges(settings, topic, [4], Bound("earliest"), Bound("latest"))
    with pytest.raises(OffsetRangeError, match=r"--from @\d+ is offset 20 of .*, after --to 10"):
        resolve_ranges(settings, topic, [0], Bound("time", T0 + 20_000), Bound("offset", 10))


def test_a_split_reads_exactly_its_offsets_in_batches(settings: Settings, topic: str) -> None:
    with SplitReader(settings, Split(topic, 2, 7, 31)) as reader:
        batches = list(reader.batches(5))
    assert all(1 <= len(batch) <= 5 for batch in batches)
    offsets = [record.offset() for batch in batches for record in batch]
    assert offsets == list(range(7, 31))
    assert [record.value() for record in batches[0][:2]] == [b"2-7", b"2-8"]


def test_a_split_beyond_the_log_is_an_error_not_a_hang(settings: Settings, topic: str) -> None:
    reader = SplitReader(settings, Split(topic, 0, 35, 45), stall_timeout=2)
    with reader, pytest.raises(SplitReadError, match=r"no record after offset 39 for 2s"):
        list(reader.batches(100))
