"""ServedTopic's view of an ack's messages (settlements.py): its own pending hand-outs are pending without a look at
the log; anything else is the log's to say (these servers have no coordinator: a look at the log would fail the
test)."""

from __future__ import annotations

import pytest

from marshal_workers.core.config import Settings
from marshal_workers.http.http_messages import MessageId
from marshal_workers.http.served_lease import ServedLease
from marshal_workers.http.served_topic import ServedTopic, ServeOptions
from marshal_workers.runtime.channel import monotonic_ms


def served_with_a_hand_out(now: int, lease_left_ms: int = 10_000) -> ServedTopic:
    topic = ServedTopic(Settings(group="g", brokers="127.0.0.1:1"), ServeOptions(topic="t"))
    topic.partition_count = 2  # as start() learns it from the broker
    held = ServedLease(partition=0, start=100, end=200, tries=0, deadline_ms=now + lease_left_ms, fetched_to=200)
    held.pending_until[150] = now + 5_000  # handed out, its pending time running
    held.pending_until[151] = now - 1  # handed out, its pending time over
    held.pending_until[152] = now + 5_000
    held.acked.add(152)
    topic.ranges[(0, 100)] = held
    return topic


def test_our_own_pending_hand_out_is_pending_without_the_log() -> None:
    topic = served_with_a_hand_out(monotonic_ms())
    assert topic.message_states([MessageId("t", 0, 150)]) == ["pending"]


@pytest.mark.parametrize(
    ("offset", "lease_left_ms"),
    [(151, 10_000), (152, 10_000), (160, 10_000), (250, 10_000), (150, 0)],
    ids=["pending time over", "acked already", "never handed out", "not in a range we hold", "lease may have lapsed"],
)
def test_anything_else_is_asked_of_the_log(offset: int, lease_left_ms: int) -> None:
    topic = served_with_a_hand_out(monotonic_ms(), lease_left_ms)
    with pytest.raises(AssertionError, match="call start"):  # it went to the coordinator (none here)
        topic.message_states([MessageId("t", 0, offset)])


def test_one_message_not_ours_sends_the_whole_request_to_the_log() -> None:
    topic = served_with_a_hand_out(monotonic_ms())
    with pytest.raises(AssertionError, match="call start"):
        topic.message_states([MessageId("t", 0, 150), MessageId("t", 0, 151)])
