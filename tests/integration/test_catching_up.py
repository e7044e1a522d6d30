"""Readers that catch up on a real broker: up to the ends they knew, with the catch-up's wait, then tailing."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pytest
from confluent_kafka import Producer
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog, read_group_state
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.reader_start import find_starts
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker

AFTER_THE_CHECKPOINT = 3_000  # past the checkpoint search's first look (2,000 records)


def write_heartbeats(settings: Settings, topic: str, count: int, first_offset: int = 0) -> None:
    """A member's heartbeats of partition 0 of ``topic``, each its own produce batch, as a supervisor writes."""
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 0, "batch.num.messages": 1})
    common = {"v": codec.VERSION, "group": settings.group, "client": "host", "instance": "i-1"}
    for n in range(count):
        now_ms = int(time.time() * 1000)
        record = codec.Heartbeat(**common, ts=now_ms, topic=topic, partition=0, offset=first_offset + n)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0


def test_a_checkpoint_further_back_than_the_first_look_is_found_without_a_stall(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The search reads the last 2,000 records, then further back: each look re-reads the partition it left
    paused at the end of the one before (a partition read up to its end is not fetched while a reader catches up,
    and librdkafka keeps it paused across assignments unless told)."""
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=1.0)
    topic = f"orders-{unique}"
    with Coordinator(settings) as writer:  # creates the topic
        writer.write([writer.claim_record(topic, 0)])
        writer.write(writer.checkpoint_records(0), partitions=[0])
    write_heartbeats(settings, topic, AFTER_THE_CHECKPOINT)
    caplog.set_level(logging.WARNING, logger="marshal_workers.kafka.guarded_consumer")

    start = find_starts(settings, settings.coordination_topic, 1, settings.require_group())[0]

    assert start.kind == "checkpoint" and start.offset is not None and start.offset <= 2
    assert "got no record" not in caplog.text  # the second look read on at once


def test_status_reads_up_to_the_end_it_knew_and_a_tail_goes_on_past_it(settings: Settings, unique: str) -> None:
    """A one-shot reader (status) folds every record written before it began, the last batch's included (the
    embedded broker lists a partition's end as the last batch's base offset plus one); a tail catches up the same
    way, then sees what is written after."""
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)  # nobody goes stale
    topic = f"orders-{unique}"
    with Coordinator(settings):
        pass  # creates the coordination topic
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 50})
    common = {"v": codec.VERSION, "group": settings.group, "client": "host", "instance": "i-1"}
    now_ms = int(time.time() * 1000)
    producer.produce(
        settings.coordination_topic,
        codec.encode(codec.Claim(**common, ts=now_ms, topic=topic, partition=0)),
        partition=0,
    )
    assert producer.flush(30) == 0
    for n in range(1, 11):  # one batch of ten: only the last says offset 10
        record = codec.Heartbeat(**common, ts=now_ms + n, topic=topic, partition=0, offset=n)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=0)
    assert producer.flush(30) == 0

    state = read_group_state(settings, settings.require_group())
    assert state.get(topic, 0).offset == 10  # type: ignore[union-attr]

    tail = CoordinationLog(settings, settings.require_group(), 1).start()
    try:
        tail.wait_caught_up(stall_timeout=30)
        assert tail.records_read() == 11 and tail.read(lambda world: world.get(topic, 0).offset) == 10  # type: ignore[union-attr]
        write_heartbeats(settings, topic, 1, first_offset=11)
        poll_until(
            lambda: tail.read(lambda world: world.get(topic, 0).offset) == 11,  # type: ignore[union-attr]
            timeout=30,
            what="the tail to fold a heartbeat written after it caught up",
        )
    finally:
        tail.close()
