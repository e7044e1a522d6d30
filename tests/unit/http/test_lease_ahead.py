"""When ServedTopic leases its next range (lease_ahead.py): before the held ones run dry while readers read, never
for nobody."""

from __future__ import annotations

import time

import pytest

from marshal_workers.core.config import Settings
from marshal_workers.http.lease_ahead import (
    HAND_OUT_WINDOW_S,
    LEASE_AHEAD_S,
    MOST_RANGE,
    READERS_RECENT_S,
    HandOutRate,
    range_size,
)
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


def reading_at(per_second: int) -> HandOutRate:
    """A hand-out rate of one full window at ``per_second``, measured at times ahead of the clock so that no window
    closes while the test runs, however slowly the machine runs it."""
    rate = HandOutRate()
    window_start = time.monotonic() + 3600
    rate.per_second(window_start)
    rate.count += int(per_second * HAND_OUT_WINDOW_S)
    assert rate.per_second(window_start + HAND_OUT_WINDOW_S) == pytest.approx(per_second)
    return rate


@pytest.mark.parametrize(
    ("per_second", "ranges", "size"),
    [(6_000, 1, 600), (60_000, 2, MOST_RANGE)],
    ids=["one larger range", "several ranges of the largest size"],
)
def test_fast_readers_get_enough_offsets_leased_at_once_to_last_the_lease_ahead_time(
    per_second: int, ranges: int, size: int
) -> None:
    topic = served_with_messages_left(60, last_read_s_ago=0.01)  # more than half a range at hand
    assert topic._want(topic.available()) == 0, "at a slow rate half a range at hand is enough"
    topic._hand_outs = reading_at(per_second)
    assert topic._range_size() == size  # RANGE_SPAN_S of their reads (6,000 a second: 600), at most MOST_RANGE
    assert topic._want(topic.available()) == ranges
    assert ranges * size >= per_second * LEASE_AHEAD_S - 60, "what they take in LEASE_AHEAD_S, with 60 at hand"
    assert (ranges - 1) * size < per_second * LEASE_AHEAD_S - 60, "and no range more"


@pytest.mark.parametrize(
    ("per_second", "configured", "size"),
    [(0, 100, 100), (500, 100, 100), (6_000, 100, 600), (10**6, 100, MOST_RANGE), (10**6, 5000, 5000)],
)
def test_ranges_are_the_configured_size_or_larger_for_fast_readers(per_second: int, configured: int, size: int) -> None:
    # Below RANGE_SPAN_S of their reads the configured size; above it that much, up to MOST_RANGE; never less.
    assert range_size(per_second, configured) == size


def test_the_hand_out_rate_is_the_last_full_windows() -> None:
    rate = HandOutRate()
    assert rate.per_second(10.0) == 0.0  # nothing measured yet
    rate.count += 50
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S / 2) == 0.0, "a window not yet full does not count"
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S) == pytest.approx(50 / HAND_OUT_WINDOW_S)
    assert rate.per_second(10.0 + HAND_OUT_WINDOW_S * 3) == 0.0, "none handed out in the next window"
