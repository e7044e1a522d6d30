"""CoordinationLog.fold_delivered, the fast path of a writer's verdicts, without a broker.

The tail's side is fed the records a broker would return (fake_record.FakeRecord, with a Kafka
message's accessors); the integration test of the coordinator runs the same path against a real broker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from fake_record import FakeRecord

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId

GROUP, TOPIC = "billing", "orders"
ME = {"v": 1, "group": GROUP, "client": "host-a", "instance": "a1"}


def read(value: bytes, offset: int, timestamp: tuple[int, int]) -> FakeRecord:
    """A record as the tail's consumer returns it (coordination partition 0)."""
    return FakeRecord(topic="__marshal", partition=0, offset=offset, key=None, value=value, timestamp=timestamp)


@pytest.fixture
def log() -> Iterator[CoordinationLog]:
    # Never started: nothing connects.  One coordination partition, so every topic routes to 0.
    reader = CoordinationLog(Settings(group=GROUP, brokers="127.0.0.1:9"), GROUP, 1, own_instance="a1")
    yield reader
    reader.close()


def claim(ts: int) -> bytes:
    return codec.encode(codec.Claim(**ME, ts=ts, topic=TOPIC, partition=0))


def claim_messages(ts: int, offset: int) -> bytes:
    return codec.encode(codec.ClaimMessages(**ME, ts=ts, topic=TOPIC, partition=0, offset=offset))


def test_a_record_right_after_what_the_tail_folded_is_folded_from_its_delivery_report(log: CoordinationLog) -> None:
    log._fold_message(read(claim(1000), 0, (TIMESTAMP_CREATE_TIME, 1000)))  # type: ignore[arg-type]
    assert log.fold_delivered(0, 1, claim_messages(1100, 50), (TIMESTAMP_CREATE_TIME, 1100))
    assert log.take_verdict(0, 1) is True
    assert log.read(lambda s: s.get(TOPIC, 0).amo_offset) == 50  # type: ignore[union-attr]
    # The tail then reads it and skips it: folded once.
    log._fold_message(read(claim_messages(1100, 50), 1, (TIMESTAMP_CREATE_TIME, 1100)))  # type: ignore[arg-type]
    assert log.read(lambda s: s.stats.applied) == 2
    assert log.fast_verdicts and log.early_folds == 1


def test_a_record_with_something_unread_before_it_waits_for_the_tail(log: CoordinationLog) -> None:
    log._fold_message(read(claim(1000), 0, (TIMESTAMP_CREATE_TIME, 1000)))  # type: ignore[arg-type]
    # Offset 1 (another member's, say) is not folded yet: offset 2's verdict may depend on it.
    assert not log.fold_delivered(0, 2, claim_messages(1100, 50), (TIMESTAMP_CREATE_TIME, 1100))
    assert log.take_verdict(0, 2) is None
    assert log.read(lambda s: s.get(TOPIC, 0).amo_offset) is None  # type: ignore[union-attr]


def test_nothing_is_folded_early_before_the_tail_has_seen_the_partitions_timestamps(log: CoordinationLog) -> None:
    assert not log.fold_delivered(0, 0, claim(1000), (TIMESTAMP_CREATE_TIME, 1000))


def test_a_delivery_report_whose_timestamp_kind_differs_from_the_logs_waits_for_the_tail(
    log: CoordinationLog,
) -> None:
    """A broker that stamps LogAppendTime but answers a produce with none (Redpanda did): the report's time
    is not the log's, so the verdict must come from the log."""
    log._fold_message(read(claim(1000), 0, (TIMESTAMP_LOG_APPEND_TIME, 1005)))  # type: ignore[arg-type]
    assert not log.fold_delivered(0, 1, claim_messages(1100, 50), (TIMESTAMP_CREATE_TIME, 1100))


def test_a_report_time_the_log_contradicts_turns_the_fast_path_off_for_good(log: CoordinationLog) -> None:
    log._fold_message(read(claim(1000), 0, (TIMESTAMP_LOG_APPEND_TIME, 1005)))  # type: ignore[arg-type]
    assert log.fold_delivered(0, 1, claim_messages(1100, 50), (TIMESTAMP_LOG_APPEND_TIME, 1106))
    log._fold_message(read(claim_messages(1100, 50), 1, (TIMESTAMP_LOG_APPEND_TIME, 1107)))  # type: ignore[arg-type]
    assert not log.fast_verdicts
    log._fold_message(read(claim_messages(1200, 60), 2, (TIMESTAMP_LOG_APPEND_TIME, 1207)))  # type: ignore[arg-type]
    assert not log.fold_delivered(0, 3, claim_messages(1300, 70), (TIMESTAMP_LOG_APPEND_TIME, 1306))
    assert log.read(lambda s: (s.owner(TOPIC, 0), s.get(TOPIC, 0).amo_offset)) == (MemberId("host-a", "a1"), 60)  # type: ignore[union-attr]
