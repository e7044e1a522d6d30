"""When ServedTopic leases its next range (lease_ahead.py): before the held ones run dry while readers read, never
for nobody."""

from __future__ import annotations

import time

import pytest

from marshal_workers.core.config import Settings
from marshal_workers.http.lease_ahead import HAND_OUT_WINDOW_S, LEASE_AHEAD_S, READERS_RECENT_S, HandOutRate
from marshal_workers.http.served_lease import ServedLease
from marshal_workers.http.served_topic import ServedTopic, ServeOptions
from marshal_workers.runtime.channel import monotonic_ms


def served_with_messages_left(left: int, last_read_s_ago: float, waiting: int = 0) -> ServedTopic:
    """A server holding one range of 100 whose last ``left`` messages wait to be handed out."""
    topic = ServedTopic(Settings(group="g", brokers="127.0.0.1:1"), ServeOptions(topic="t", range_size=100))
    held = ServedLease(partition=0, start=0, end=100, tries=0, deadline_ms=monotonic_ms() + 30_000, fetched_to=100)
    held.messages = {offset: object() for offset in range(100 - left, 100)}
    topic.ranges[(0, 0)] = held
    topic.last_read = time.monotonic() - last_read_s_ago
    topic.waiting_readers = waiting
    return topic


def test_readers_answered_at_once_get_the_next_range_leased_before_the_held_one_runs_dry() -> None:
    # Each read was answered at once, so none waits now: the next range is leased all the same, while 10 are left.
    topic = served_with_messages_left(10, last_read_s_ago=0.01)
    assert topic.available() == 10
    assert topic._want(topic.available()) == 1


@pytest.mark.parametrize(
    ("left", "last_read_s_ago", "waiting"),
    [(80, 0.01, 0), (80, 0.01, 3), (10, READERS_RECENT_S + 1, 0)],
    ids=["plenty at hand", "plenty at hand, readers waiting", "no reader lately"],
)
def test_no_range_is_leased_with_plenty_at_hand_or_for_no_reader(
    left: int, last_read_s_ago: float, waiting: int
) -> None:
    topic = served_with_messages_left(left, last_read_s_ago, waiting)
    assert topic._want(topic.available()) == 0


def test_a_reader_waiting_now_gets_a_range_whenever_it_read_last() -> None:
    topic = served_with_messages_left(0, last_read_s_ago=READERS_RECENT_S + 1, waiting=1)
    assert topic._want(topic.available()) == 2  # nothing left to hand out: two ranges (max_leases allows it)


def test_fast_readers_get_enough_ranges_leased_at_once_to_last_the_lease_ahead_time() -> None:
    topic = served_with_messages_left(60, last_read_s_ago=0.01)  # more than half a range at hand
    assert topic._want(topic.available()) == 0, "at a slow rate half a range at hand is enough"
    rate = HandOutRate()
    # One full window at 6,000 messages a second (300 taken in LEASE_AHEAD_S, with 60 at hand), measured at times
    # ahead of the clock so that no window closes while the test runs, however slowly the machine runs it.
    window_start = time.monotonic() + 3600
    rate.per_second(window_start)
    rate.count += int(6_000 * HAND_OUT_WINDOW_S)
    assert rate.per_second(window_start + HAND_OUT_WINDOW_S) == pytest.approx(6_000)
    topic._hand_outs = rate
    assert 6_000 * LEASE_AHEAD_S == pytest.approx(300)
    assert topic._want(topic.available()) == 3  # ceil((300 - 60) / 100), within max_leases (4) less the one held


def test_the_hand_out_rate_is_the_last_full_windows() -> None:
    rate = HandOutRate()
    assert rate.per_second(10.0) == 0.0  # nothing measured yet
    rate.count += 50
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S / 2) == 0.0, "a window not yet full does not count"
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S) == pytest.approx(50 / HAND_OUT_WINDOW_S)
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S * 3) == 0.0, "none handed out in the next window"
