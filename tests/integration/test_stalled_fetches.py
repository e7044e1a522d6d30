"""The embedded broker's stalled fetches on a long partition, and the project's readers getting past them.

On Tansu (memory storage) every fetch lists all of a partition's batches within the fetch's wait; past a few
thousand batches a 1 ms wait never reaches the reader's offset again (docs/brokers.md).  The coordination log's
reader starts with such a wait here and must still read the whole log, seeing and counting the stall.  On an
external Kafka (MARSHAL_WORKERS_TEST_BROKERS) nothing stalls: the reader must simply read it all.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.kafka.coordination_writer import ensure_coordination_topic
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import admin_client, ensure_topic
from marshal_workers.kafka.reader_start import log_consumer
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker

BATCHES = 6000  # each its own batch, so its own object in Tansu's store: past what a 1 ms fetch can list
EMBEDDED = not os.environ.get("MARSHAL_WORKERS_TEST_BROKERS")


def write_single_record_batches(settings: Settings, count: int) -> None:
    """Another group's heartbeats on coordination partition 0, one record per produce batch."""
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 0, "batch.num.messages": 1})
    common = {"v": 1, "group": "another-group", "client": "host", "instance": "i-1"}
    for n in range(count):
        record = codec.Heartbeat(**common, ts=1_700_000_000_000 + n, topic="t", partition=0, offset=n)
        producer.produce(settings.coordination_topic, codec.encode(record), partition=0)
        if n % 100 == 0:
            producer.flush(10)
    assert producer.flush(30) == 0


def reaches(bootstrap: str, topic: str, offset: int, wait_ms: int, within_s: float) -> bool:
    """Whether a plain consumer with that fetch wait reads the record at ``offset`` within ``within_s``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "plain", "fetch.wait.max.ms": wait_ms})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                return True
        return False
    finally:
        consumer.close()


def test_the_coordination_reader_gets_past_the_stalled_fetches_of_a_long_partition(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = replace(settings, coordination_fetch_wait=0.001, coordination_partitions=2)
    ensure_coordination_topic(admin_client(settings), settings)
    write_single_record_batches(settings, BATCHES)
    if EMBEDDED:  # the fault is there: a plain reader with the same wait never gets the last record
        assert not reaches(settings.brokers, settings.coordination_topic, BATCHES - 1, wait_ms=1, within_s=3.0)

    caplog.set_level(logging.WARNING, logger="marshal_workers.kafka.guarded_consumer")
    reader = CoordinationLog(settings, settings.group, 2, from_beginning=True).start()
    try:
        # Catching up, it reads with the long wait of a reader that knows where the end is, which gets through the
        # listing: never the 1 ms wait that stalls here for good.  (On a loaded machine the broker may still answer
        # nothing for a second at the long wait, and the guard then waits longer: that is not the fault.)
        reader.wait_caught_up(stall_timeout=10.0)  # raises if it makes no progress for 10 s
        assert reader.records_read() == BATCHES
        assert "instead of 1 (" not in caplog.text, "it caught up with the tail's short wait"
        stalls_catching_up = reader.fetch_stalls
        # Tailing, with the short wait again: a record written now is past what that wait can list, and the
        # guard gets the tail past it.
        write_single_record_batches(settings, 1)
        deadline = time.monotonic() + 20
        while reader.records_read() < BATCHES + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reader.records_read() == BATCHES + 1
        if EMBEDDED:
            assert reader.fetch_stalls > stalls_catching_up
            assert "instead of 1 (" in caplog.text and f"{settings.coordination_topic}[0]" in caplog.text
            assert "coordination log reader (tail)" in caplog.text  # which reader it was
    finally:
        reader.close()


def test_a_guarded_reader_tailing_a_growing_partition_reads_every_record_once(settings: Settings, unique: str) -> None:
    """A worker's reader (GuardedConsumer) tails a partition as it grows past what its fetch wait can list: it
    stalls mid-way, and its replacement resumes exactly after the last record it returned."""
    topic = f"long-{unique}"
    ensure_topic(admin_client(settings), settings, topic, 1)
    producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 0, "batch.num.messages": 1})
    reader = GuardedConsumer(
        {"bootstrap.servers": settings.brokers, "group.id": f"g-{unique}", "fetch.wait.max.ms": 1},
        "test reader",
        heartbeat_s=1.0,
    )
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        offsets: list[int] = []
        stalled_at: int | None = None  # records read when the reader was replaced

        def read(timeout: float) -> None:
            nonlocal stalled_at
            before = len(offsets)
            offsets.extend(m.offset() for m in reader.consume(1000, timeout) if m.error() is None)
            if stalled_at is None and reader.stalls:
                stalled_at = before

        for n in range(BATCHES):
            producer.produce(topic, str(n).encode(), partition=0)
            if n % 100 == 99:
                producer.flush(10)
                read(0.01)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 20
        while len(offsets) < BATCHES and time.monotonic() < deadline:
            read(0.1)
        assert offsets == list(range(BATCHES))  # nothing skipped, nothing twice
        if EMBEDDED:
            assert stalled_at is not None and 0 < stalled_at < BATCHES  # it had read some before it stalled
    finally:
        reader.close()


@pytest.mark.parametrize("reader", ["coordination log", "worker"])
def test_a_reader_skips_no_record_while_several_producers_write_one_partition(
    reader: str, settings: Settings, unique: str
) -> None:
    """Tansu gives a batch its offsets before it stores it, so a fetch may find a later batch and not yet an
    earlier one: a plain reader skips the earlier record for good (docs/brokers.md).  Several producers write
    one partition while the coordination log's reader (always contiguous), or a worker's (contiguous on a broker
    known to skip: the embedded one), tails it: it returns every offset once, in order, re-reading where a record
    was missing (without that, it fails here: 3 runs of 3 skipped records)."""
    topic = f"log-{unique}"
    ensure_topic(admin_client(settings), settings, topic, 1)
    stop = threading.Event()
    acked: list[int] = []  # offsets the broker acknowledged

    def produce() -> None:
        producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 0, "enable.idempotence": True})
        while not stop.is_set():
            try:
                producer.produce(topic, b"x" * 100, on_delivery=lambda error, m: error or acked.append(m.offset()))
            except BufferError:
                producer.poll(0.01)
            producer.poll(0.001)
        assert producer.flush(30) == 0

    if reader == "worker":
        tail = GuardedConsumer({"bootstrap.servers": settings.brokers, "group.id": f"g-{unique}"}, "test", 1.0)
        tail.assign([TopicPartition(topic, 0, 0)])
        tail.read_without_gaps_if_the_broker_skips(10.0)
    else:
        tail = log_consumer(settings, settings.require_group(), "test", catch_up=False)
        tail.assign([TopicPartition(topic, 0, 0)])
    read: list[int] = []
    producers = [threading.Thread(target=produce) for _ in range(6)]
    try:
        assert tail.contiguous == (EMBEDDED or reader == "coordination log")
        for thread in producers:
            thread.start()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            read += [m.offset() for m in tail.consume(1000, 0.01) if m.error() is None]
        stop.set()
        for thread in producers:
            thread.join(30)
        written = max(acked) + 1
        assert sorted(acked) == list(range(written))
        deadline = time.monotonic() + 20
        while len(read) < written and time.monotonic() < deadline:
            read += [m.offset() for m in tail.consume(1000, 0.1) if m.error() is None]
        assert read == list(range(written))  # every record, once, in order
    finally:
        stop.set()
        tail.close()
