"""Range sizes of a shared handler (protocol/range_sizing.py): from the workers' measured rates, within bounds, and
never more than a share of the topic's backlog."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import Lease
from marshal_workers.protocol.range_sizing import CAP, FLOOR, MOST_SPAN_MS, RangeSizing, target_span_ms

LEASE_MS = 60_000
ME, OTHER, THIRD = MemberId("me", "1"), MemberId("other", "1"), MemberId("third", "1")


def lease(holder: MemberId, start: int = 0) -> Lease:
    return Lease(start, start + 10, holder, 10**9, False, 0)


def test_the_target_span_is_a_sixth_of_the_lease_and_at_most_three_seconds() -> None:
    assert target_span_ms(60_000) == MOST_SPAN_MS == 3_000
    assert target_span_ms(6_000) == 1_000, "a short pending timeout: a sixth of it"
    assert target_span_ms(1_000) == 166


def test_before_any_measurement_a_claim_is_range_size() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    assert sizing.claim_size([0, 1]) == 100


def test_a_fast_handler_gets_large_ranges_and_a_slow_one_small_ones() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    sizing.observe(0, messages=100, busy_ms=2.0, now=1.0)  # 50,000 msgs/s: 150,000 in 3 s, capped
    assert sizing.size_for(0) == CAP
    slow = RangeSizing(initial=100, lease_ms=LEASE_MS)
    slow.observe(0, messages=100, busy_ms=2_000.0, now=1.0)  # 20 ms a message: 150 in 3 s
    assert slow.size_for(0) == 150


def test_a_handler_that_slows_down_gets_smaller_ranges_within_a_few_ranges() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    sizing.observe(0, messages=10_000, busy_ms=500.0, now=0.0)  # fast
    assert sizing.size_for(0) == CAP
    now = 0.0
    for _ in range(3):  # then each message takes 50 ms (a dependency got slow)
        now += 3.0
        sizing.observe(0, messages=sizing.size_for(0), busy_ms=sizing.size_for(0) * 50.0, now=now)
    assert sizing.size_for(0) < 200, "three slow ranges later the size is near the slow rate's 60"


def test_a_new_worker_starts_from_its_siblings_rate_and_a_claim_takes_the_smallest_size() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    sizing.observe(0, messages=1_000, busy_ms=1_000.0, now=1.0)  # 1,000 msgs/s: 3,000
    sizing.observe(1, messages=1_000, busy_ms=2_000.0, now=1.0)  # 500 msgs/s: 1,500
    assert sizing.size_for(2) == 2_000, "not measured yet: the siblings' rate (2,000 messages in 3 s)"
    assert sizing.claim_size([0, 1]) == 1_500


def test_empty_or_untimed_settlements_say_nothing_about_the_rate() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    sizing.observe(0, messages=0, busy_ms=5.0, now=1.0)
    sizing.observe(0, messages=10, busy_ms=0.0, now=1.0)
    sizing.observe(0, messages=10, busy_ms=float("nan"), now=1.0)
    assert sizing.size_for(0) == 100


def test_a_fixed_size_is_kept_whatever_is_measured_or_left() -> None:
    sizing = RangeSizing(initial=500, lease_ms=LEASE_MS, adaptive=False)
    sizing.observe(0, messages=100, busy_ms=1.0, now=1.0)
    assert sizing.size_for(0) == 500
    assert sizing.sizer([0], our_workers=4, me=ME)(backlog=10, live=[]) == 500, "the user insisted on 500"


def test_near_the_tail_the_backlog_is_shared_among_our_workers_and_the_other_members() -> None:
    sizing = RangeSizing(initial=100, lease_ms=LEASE_MS)
    sizing.observe(0, messages=100, busy_ms=1.0, now=1.0)  # fast: CAP
    sizer = sizing.sizer([0], our_workers=4, me=ME)
    assert sizer(1_000_000, []) == CAP
    assert sizer(4_000, []) == 1_000, "a quarter each for our four workers"
    # Another member holds three leases on the partition (two workers, at two leases a worker), a third one one.
    others = [lease(OTHER, 0), lease(OTHER, 10), lease(OTHER, 20), lease(THIRD, 30), lease(ME, 40)]
    assert sizer(4_200, others) == 600, "4 of ours + 2 + 1 others: a seventh"
    assert sizer(3, []) == FLOOR, "never below the floor"


@given(
    initial=st.integers(1, 10_000),
    lease_ms=st.integers(1_000, 86_400_000),
    measurements=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 100_000), st.floats(0, 1e7, allow_nan=False), st.floats(0, 10)),
        max_size=20,
    ),
    backlog=st.integers(-10, 10**7),
    our_workers=st.integers(1, 64),
    other_leases=st.integers(0, 40),
)
def test_sizes_never_leave_the_bounds_and_the_share_bound_holds(
    initial: int,
    lease_ms: int,
    measurements: list[tuple[int, int, float, float]],
    backlog: int,
    our_workers: int,
    other_leases: int,
) -> None:
    sizing = RangeSizing(initial=initial, lease_ms=lease_ms)
    now = 0.0
    for worker, messages, busy_ms, step in measurements:
        now += step
        sizing.observe(worker, messages, busy_ms, now)
    for worker in range(5):
        assert FLOOR <= sizing.size_for(worker) <= CAP
    live = [lease(OTHER, 10 * n) for n in range(other_leases)]
    size = sizing.sizer(range(4), our_workers, ME)(backlog, live)
    assert FLOOR <= size <= CAP
    sharers = our_workers + (math.ceil(other_leases / 2) if other_leases else 0)
    assert size <= max(FLOOR, math.ceil(max(backlog, 0) / sharers)), "no worker takes more than its share"


@given(
    per_message_ms=st.floats(0.001, 5_000, allow_nan=False),
    initial=st.integers(1, 10_000),
    lease_ms=st.integers(1_000, 3_600_000),
    ranges=st.integers(1, 10),
)
def test_a_steady_rate_gives_the_target_span_at_once_and_stays_there(
    per_message_ms: float, initial: int, lease_ms: int, ranges: int
) -> None:
    sizing = RangeSizing(initial=initial, lease_ms=lease_ms)
    now = 0.0
    for _ in range(ranges):
        size = sizing.size_for(0)
        sizing.observe(0, size, size * per_message_ms, now)
        now += size * per_message_ms / 1000
    expected = min(max(math.floor(target_span_ms(lease_ms) / per_message_ms), FLOOR), CAP)
    assert abs(sizing.size_for(0) - expected) <= 1  # float rounding of the rate
    if expected > FLOOR and expected < CAP:
        span = sizing.size_for(0) * per_message_ms
        assert span <= target_span_ms(lease_ms) * 1.01, "a lease covers the target span of work"


@given(fast_ms=st.floats(0.01, 10), slowdown=st.floats(2, 100), lease_ms=st.integers(6_000, 600_000))
def test_a_slower_handler_never_gets_larger_ranges(fast_ms: float, slowdown: float, lease_ms: int) -> None:
    sizing = RangeSizing(initial=100, lease_ms=lease_ms)
    sizing.observe(0, 1_000, 1_000 * fast_ms, 0.0)
    before = sizing.size_for(0)
    sizing.observe(0, 1_000, 1_000 * fast_ms * slowdown, 1.0)
    assert sizing.size_for(0) <= before
    if before < CAP:
        assert sizing.size_for(0) < before or before == FLOOR, "a slow handler's size shrinks"
