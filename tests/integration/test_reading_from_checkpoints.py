"""Checkpoints on a real broker: a reader starts at the latest one and agrees with a reader of the whole log."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import msgspec
import pytest
from confluent_kafka import Producer
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog, read_group_state
from marshal_workers.kafka.coordination_writer import Coordinator, Progress
from marshal_workers.kafka.reader_start import find_checkpoints, find_starts
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import WorldState

pytestmark = pytest.mark.broker

HISTORY = 60_000  # records of the group's past, before the checkpoint


def write_history(settings: Settings, topic: str, count: int, start_ts: int) -> None:
    """A past owner's claims and heartbeats of 4 partitions, as raw records (fast), on partition 0."""
    producer = Producer(
        {"bootstrap.servers": settings.brokers, "linger.ms": 20, "queue.buffering.max.messages": 200_000}
    )
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
        # The search for the checkpoint read the records after it, and handed them over: none is fetched again.
        assert started.caught_up()
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


def test_a_new_groups_reader_starts_at_another_groups_checkpoint_that_does_not_name_it(
    settings: Settings, unique: str
) -> None:
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)
    busy = replace(settings, group=f"busy-{unique}")
    early = replace(settings, group=f"early-{unique}")  # wrote one record before the history, long ago
    topic = f"orders-{unique}"
    with Coordinator(early) as writer:  # creates the topic
        writer.claim(f"early-{unique}", 0)
        write_history(busy, topic, HISTORY, writer.now_ms() - 60_000)
    with Coordinator(busy) as writer:  # read it all from the beginning: knows every group before its checkpoint
        written = writer.checkpoint_records(0)
        writer.write(written, partitions=[0])
        writer.heartbeats([Progress(topic, 1, 5)])  # life goes on after it
    assert {busy.group, early.group} == set(written[0].directory)  # type: ignore[attr-defined, arg-type]

    # A new group: no record anywhere, no checkpoint of its own; it starts at the busy group's checkpoint.
    [start] = find_starts(settings, settings.coordination_topic, 1, settings.group)
    assert (start.kind, start.offset) == ("directory", written[0].as_of)  # type: ignore[attr-defined]
    new = CoordinationLog(settings, settings.group, 1).start()
    try:
        new.wait_caught_up(stall_timeout=30)
        assert new.records_read() <= 10  # the checkpoint and what followed it, not the 60,000 before
        assert not new.read(WorldState.has_records)  # status and log: "unknown group" without reading it all
    finally:
        new.close()
    # Once it writes, its readers still start there and agree with one that read everything.
    with Coordinator(settings) as member:
        assert member.claim(f"new-{unique}", 0)
        assert member.heartbeat(f"new-{unique}", 0, 42)
    later = read_group_state(settings, settings.group)
    everything = CoordinationLog(settings, settings.group, 1, from_beginning=True).start()
    try:
        everything.wait_caught_up(stall_timeout=30)
        assert everything.records_read() > HISTORY
        assert later.partitions == everything.snapshot().partitions
        assert later.get(f"new-{unique}", 0).offset == 42  # type: ignore[union-attr]
    finally:
        everything.close()

    # The group that wrote before the history is named: its reader cannot start there, and reads it all, as before.
    [start] = find_starts(early, early.coordination_topic, 1, early.group)
    assert start.kind == "beginning"
    assert read_group_state(early, early.group).get(f"early-{unique}", 0) is not None


def test_a_member_that_started_at_a_checkpoint_without_a_directory_learns_one_in_the_background(
    settings: Settings, unique: str
) -> None:
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)
    other = replace(settings, group=f"other-{unique}")
    topic = f"orders-{unique}"
    with Coordinator(other) as writer:
        write_history(other, topic, 5_000, writer.now_ms() - 60_000)
    with Coordinator(settings) as member:
        member.claim(topic, 0)
        # A checkpoint as release 0.6.0 wrote it: no directory.
        old = [msgspec.structs.replace(part, directory=None) for part in member.checkpoint_records(0)]
        member.write(old, partitions=[0])  # type: ignore[arg-type]
    with Coordinator(settings) as reader:  # not a member: reads from it and learns nothing more
        assert reader.checkpoint_records(0)[0].directory is None  # type: ignore[attr-defined]
    member = Coordinator(settings).start(member=True)
    try:
        part = lambda: member.checkpoint_records(0)[0]  # noqa: E731
        learned = poll_until(lambda: part().directory, timeout=60, what="a directory")  # type: ignore[attr-defined]
        assert set(learned) == {other.group, settings.group}
    finally:
        member.close()


def test_a_long_read_says_how_far_it_got_while_it_reads(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = replace(settings, coordination_partitions=1, heartbeat_interval=3600.0)
    with Coordinator(settings) as writer:
        write_history(settings, f"orders-{unique}", 20_000, writer.now_ms())
    caplog.set_level(logging.INFO, logger="marshal_workers.kafka.coordination_reader")
    # From the beginning: a search for checkpoints would have read these 20,000 already, and handed them over
    # (the next test); a longer log than a search keeps is read by the catch-up, as here.
    reader = CoordinationLog(settings, settings.group, 1, progress_every=0.001, from_beginning=True).start()
    try:
        reader.wait_caught_up(stall_timeout=30)
        total = reader.records_read()
    finally:
        reader.close()
    assert total == 20_005  # 4 claims, the heartbeats, a release
    found = [
        (int(n), int(m))
        for record in caplog.records
        for n, m in re.findall(r"read (\d+) of about (\d+) records of \S+ so far", record.getMessage())
    ]
    assert found, caplog.text
    assert all(settings.group in record.getMessage() for record in caplog.records if "so far" in record.getMessage())
    assert [n for n, _ in found] == sorted(n for n, _ in found) and all(n <= total for n, _ in found)
    assert found[-1][1] == total  # "about": the end its fetches saw
