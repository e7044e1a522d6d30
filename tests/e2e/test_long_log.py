"""A group with a long past: 300,000 old coordination records, then a live fleet (issue 11).

The first supervisor after the upgrade reads the whole log once and writes checkpoints; every later one
starts at them, so what it reads is bounded by the records since, not by the log's age.  A partition
nobody has touched since long ago still resumes at its exact offset: only the checkpoint holds it.
The history is 30 times the bound on what the later one may read, which is all the test needs; how long
reading takes on logs of 100,000 to 3,000,000 records is a benchmark's (bench_startup.py).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.reader_start import find_checkpoints
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker

HISTORY = 300_000
IDLE_PARTITION, IDLE_OFFSET = 3, 12  # released long ago at offset 12 and never touched since


def write_history(fleet: Fleet, count: int, start_ts: int) -> int:
    """An old owner's claims of the fleet's 4 partitions, ``count`` heartbeats, and the idle partition's release,
    all with timestamps from long ago, on the topic's coordination partition (raw records: fast).  Returns the
    coordination topic's partition count."""
    with Coordinator(
        Settings(brokers=fleet.brokers, group=fleet.group, coordination_topic=fleet.coordination_topic)
    ) as c:
        home = codec.coordination_partition(fleet.topic, c.partition_count)  # and creates the coordination topic
    producer = Producer(
        {
            "bootstrap.servers": fleet.brokers,
            "linger.ms": 50,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    common = {"v": 1, "group": fleet.group, "client": "old-host", "instance": "old-1"}

    def send(record: codec.Record) -> None:
        value = codec.encode(record)
        while True:
            try:
                producer.produce(fleet.coordination_topic, value, partition=home)
                return
            except BufferError:
                producer.poll(0.1)

    for p in range(fleet.partitions):
        send(codec.Claim(**common, ts=start_ts, topic=fleet.topic, partition=p))
    # The old owner made no progress past offset 0 on the busy partitions: heartbeats, and more heartbeats.
    beat = {
        p: codec.encode(codec.Heartbeat(**common, ts=start_ts + 1, topic=fleet.topic, partition=p, offset=0))
        for p in range(fleet.partitions)
    }
    for n in range(count):
        while True:
            try:
                producer.produce(fleet.coordination_topic, beat[n % fleet.partitions], partition=home)
                break
            except BufferError:
                producer.poll(0.1)
    send(codec.Release(**common, ts=start_ts + 2, topic=fleet.topic, partition=IDLE_PARTITION, offset=IDLE_OFFSET))
    assert producer.flush(120) == 0
    return c.partition_count


def records_read_at_start(log: str) -> int:
    found = re.findall(r"ready on \S+ \(\d+ partitions; read (\d+) records", log)
    assert found, log
    return int(found[-1])


def test_a_supervisor_of_a_group_with_a_long_past_starts_from_checkpoints_and_resumes_exactly(
    kafka_brokers: str, fleets: Callable[..., Fleet]
) -> None:
    fleet = fleets("old", 4, env={"MARSHAL_WORKERS_CHECKPOINT_INTERVAL": "1s"})
    try:
        a_week_ago = int(time.time() * 1000) - 7 * 86_400_000
        coordination_partitions = write_history(fleet, HISTORY, a_week_ago)
        fleet.produce(range(80))  # 20 messages per partition, offsets 0-19

        # The first supervisor after the upgrade has no checkpoint: it reads it all, once, then writes them.
        first = fleet.start("a")
        poll_until(lambda: len(fleet.counts()) == 80 - IDLE_OFFSET, timeout=180, what="a handling everything")
        assert records_read_at_start(fleet.log_of("a")) > HISTORY
        settings = Settings(brokers=kafka_brokers, group=fleet.group)
        poll_until(
            lambda: any(
                found is not None
                for found in find_checkpoints(settings, fleet.coordination_topic, coordination_partitions, fleet.group)
            ),
            timeout=60,
            what="a checkpoint",
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == ExitCode.OK

        # The next one reads the records since the checkpoints, not the history, and takes over exactly.
        started = time.monotonic()
        second = fleet.start("b")
        poll_until(lambda: "claimed" in fleet.log_of("b"), timeout=60, what="b's first claim")
        print(f"b: first claim {time.monotonic() - started:.1f}s after its start (benchmark: bench_startup.py)")
        assert records_read_at_start(fleet.log_of("b")) < 10_000
        fleet.produce(range(80, 120))
        poll_until(lambda: len(fleet.counts()) == 120 - IDLE_OFFSET, timeout=60, what="b handling the new messages")
        assert max(fleet.counts().values()) == 1, "nothing handled twice across the hand-over"
        idle = sorted(line.offset for line in fleet.lines() if line.partition == IDLE_PARTITION)
        assert idle == list(range(IDLE_OFFSET, 30)), "the idle partition resumed at its week-old release offset"
        rows = fleet.status_rows()
        assert sorted(rows) == [0, 1, 2, 3] and {row["client"] for row in rows.values()} == {"b"}
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == ExitCode.OK
    finally:
        fleet.stop_all()
