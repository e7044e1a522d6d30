"""Checkpoints on a real broker: a reader starts at the latest one and agrees with a reader of the whole log."""

from __future__ import annotations

from dataclasses import replace

import pytest
from confluent_kafka import Producer

from marshal_workers import codec
from marshal_workers.config import Settings
from marshal_workers.coordination_log import CoordinationLog, find_checkpoints, read_group_state
from marshal_workers.coordinator import Coordinator, Progress

pytestmark = pytest.mark.broker

HISTORY = 60_000  # records of the group's past, before the checkpoint


def write_history(settings: Settings, topic: str, count: int, start_ts: int) -> None:
    """A past owner's claims and heartbeats of 4 partitions, as raw records (fast), on partition 0."""
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 20, "queue.buffering.max.messages": 200_000})
    common = {"v": 1, "group": settings.group, "client": "old-host", "instance": "old-1"}
    for p in range(4):
        record = codec.Claim(**common, ts=start_ts, topic=topic, partition=p)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=0)
    for n in range(count):
        record = codec.Heartbeat(**common, ts=start_ts + 1 + n // 100, topic=topic, partition=n % 4, offset=n)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=0)
        if n % 50_000 == 0:
            producer.poll(0)
    # Partition 3 is released and then never heard of again: only the checkpoint keeps its position.
    release = codec.Release(**common, ts=start_ts + count, topic=topic, partition=3, offset=777_777)
    producer.produce(settings.coordination_topic, codec.encode(release), partition=0)
    assert producer.flush(60) == 0


def test_a_reader_starts_at_the_latest_checkpoint_and_agrees_with_one_that_read_everything(
    settings: Settings, unique: str
) -> None:
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)  # nobody goes stale
    topic = f"orders-{unique}"
    with Coordinator(settings) as writer:  # creates the topic
        write_history(settings, topic, HISTORY, writer.now_ms() - 60_000)
    with Coordinator(settings) as writer:
        assert writer.read(lambda world: world.get(topic, 3).offset) == 777_777  # type: ignore[union-attr]
        writer.write(writer.checkpoint_records(0), partitions=[0])
        # Life goes on after the checkpoint: a new member claims and heartbeats partition 0's old owner out.
        writer.write([writer.claim_record(topic, 0)])  # refused: old-1 still owns it (HB is an hour)
        writer.heartbeats([Progress(topic, 1, 5)])  # refused too: not the owner
    found = find_checkpoints(settings, settings.coordination_topic, 1, settings.group)[0]
    assert found is not None and found[0].as_of > HISTORY
    everything = CoordinationLog(settings, settings.group, 1, from_beginning=True).start()
    try:
        everything.wait_caught_up(stall_timeout=30)
        expected = everything.snapshot()
    finally:
        everything.close()
    started = CoordinationLog(settings, settings.group, 1).start()
    try:
        started.wait_caught_up(stall_timeout=30)
        state = started.snapshot()
    finally:
        started.close()
    assert started.started_at == [found[0].as_of]
    assert state.stats.applied <= 10  # the tail after the checkpoint, not the history
    assert expected.stats.applied > HISTORY
    assert state.partitions == expected.partitions
    assert state.get(topic, 3).offset == 777_777  # type: ignore[union-attr]  # older than every record read
    assert read_group_state(settings, settings.group).partitions == expected.partitions  # what status shows


def test_without_a_checkpoint_a_reader_reads_the_whole_log(settings: Settings, unique: str) -> None:
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)
    topic = f"orders-{unique}"
    with Coordinator(settings) as writer:
        write_history(settings, topic, 1_000, writer.now_ms())
    assert find_checkpoints(settings, settings.coordination_topic, 1, settings.group)[0] is None
    state = read_group_state(settings, settings.group)
    assert state.get(topic, 3).offset == 777_777  # type: ignore[union-attr]
    assert state.stats.applied == 1_000 + 5
