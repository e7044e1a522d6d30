"""Replay on a local Spark session against the real broker: every message once, batches, time ranges, failures."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from spark_support import APP, ReplayApp, create_topic, produce

from marshal_workers.core.config import Settings
from marshal_workers.errors import SparkJobError
from marshal_workers.spark.planner import Split, plan_splits
from marshal_workers.spark.ranges import Bound, resolve_ranges
from marshal_workers.spark.replay import failure_summary, replay

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one Spark session

T0 = 1_700_000_000_000


def numbered(partitions: int, per_partition: int) -> dict[int, list[bytes]]:
    """Message n (n = 0, 1, ...) on partition n % partitions, at offset n // partitions."""
    return {p: [str(p + partitions * i).encode() for i in range(per_partition)] for p in range(partitions)}


EARLIEST, LATEST = Bound("earliest"), Bound("latest")


def test_a_clean_replay_handles_every_message_of_the_range_exactly_once(
    spark, replay_app: ReplayApp, settings: Settings
) -> None:
    topic = replay_app.topic("plain")
    create_topic(settings.brokers, topic, 3)
    produce(settings.brokers, topic, numbered(3, 100))
    hooks_before = Counter(replay_app.hooks())

    splits = plan_splits(resolve_ranges(settings, topic, None, EARLIEST, LATEST), 30)
    assert len(splits) == 12  # 4 of 25 per partition
    report = replay(spark, APP, settings, splits)

    assert not report.failed and report.handled == 300
    assert all(result.handled == result.split.size for result in report.results)
    handled = Counter((partition, offset) for partition, offset, _, _ in replay_app.lines(topic))
    assert set(handled) == {(p, o) for p in range(3) for o in range(100)} and set(handled.values()) == {1}
    assert all(value == str(p + 3 * o) for p, o, value, _ in replay_app.lines(topic))
    # Each split is a worker's life: its on_worker_start and on_worker_stop hooks ran once.
    hooks = Counter(replay_app.hooks()) - hooks_before
    assert hooks == {"start": 12, "stop": 12}
    # A replay never joins the group or commits, and never writes to the coordination topic.
    consumer = Consumer({"bootstrap.servers": settings.brokers, "group.id": f"{replay_app.prefix}-group"})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    assert all(tp.offset < 0 for tp in committed), committed
    topics = AdminClient({"bootstrap.servers": settings.brokers}).list_topics(timeout=10).topics
    assert settings.coordination_topic not in topics


def test_a_batch_handler_gets_lists_of_at_most_its_batch_size(spark, replay_app: ReplayApp, settings: Settings) -> None:
    topic = replay_app.topic("batch")
    create_topic(settings.brokers, topic, 2)
    produce(settings.brokers, topic, numbered(2, 40))
    report = replay(spark, APP, settings, plan_splits(resolve_ranges(settings, topic, None, EARLIEST, LATEST), 20))

    assert report.handled == 80 and not report.failed
    lines = replay_app.lines(topic)
    assert Counter((p, o) for p, o, _, _ in lines) == Counter((p, o) for p in range(2) for o in range(40))
    sizes = {size for _, _, _, size in lines}
    assert max(sizes) == 7 and all(1 <= size <= 7 for size in sizes)


def test_a_range_given_by_times_replays_the_messages_of_that_time(
    spark, replay_app: ReplayApp, settings: Settings
) -> None:
    topic = replay_app.topic("times")
    create_topic(settings.brokers, topic, 2)
    # Partition p's message i was written at T0 + 1000 * i + 500 * p.
    produce(settings.brokers, topic, numbered(2, 60), {p: [T0 + 1000 * i + 500 * p for i in range(60)] for p in (0, 1)})

    start, end = Bound("time", T0 + 10_000), Bound("time", T0 + 25_000)
    ranges = resolve_ranges(settings, topic, None, start, end)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 25), (1, 10, 25)]
    report = replay(spark, APP, settings, plan_splits(ranges, 100))

    assert report.handled == 30
    handled = sorted((p, o) for p, o, _, _ in replay_app.lines(topic))
    assert handled == [(p, o) for p in (0, 1) for o in range(10, 25)]


def test_a_failing_handler_stops_its_split_and_says_what_to_replay_again(
    spark, replay_app: ReplayApp, settings: Settings
) -> None:
    topic = replay_app.topic("fail")
    create_topic(settings.brokers, topic, 2)
    values = numbered(2, 40)
    values[1][13] = b"fail"  # partition 1, offset 13: in the split 10..20
    produce(settings.brokers, topic, values)
    report = replay(spark, APP, settings, plan_splits(resolve_ranges(settings, topic, None, EARLIEST, LATEST), 10))

    [failed] = report.failed
    assert (failed.split, failed.handled, failed.failed_offset) == (Split(topic, 1, 10, 20), 3, 13)
    assert "ValueError: cannot handle offset 13" in (failed.error or "")
    assert report.handled == 80 - 10 + 3, "every other split was handled whole"
    handled = {(p, o) for p, o, _, _ in replay_app.lines(topic)}
    assert handled == {(p, o) for p in (0, 1) for o in range(40)} - {(1, o) for o in range(13, 20)}
    assert "--partition 1 --from 13 --to 20" in failure_summary(report)


def test_a_split_that_cannot_be_read_fails_the_job_with_its_reason(
    spark, replay_app: ReplayApp, settings: Settings
) -> None:
    topic = replay_app.topic("short")
    create_topic(settings.brokers, topic, 1)
    produce(settings.brokers, topic, numbered(1, 10))
    quick = replace(settings, connect_timeout=1.0)  # a silent broker is given 3 s
    with pytest.raises(SparkJobError, match=r"SplitReadError: reading .*\[0\] 5..20 .* no record after offset 9"):
        replay(spark, APP, quick, [Split(topic, 0, 5, 20)])
