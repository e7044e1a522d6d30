"""Rate and age limits (issue 14 part 4): the options, the token bucket's arithmetic, the age verdict."""

from __future__ import annotations

import multiprocessing
import time

import pytest
from fake_record import FakeRecord
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers import App
from marshal_workers.errors import ConfigError, MessageTooOld
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.message_age import OnTooOld, is_too_old, split_by_age, too_old_error
from marshal_workers.handlers.rate_limits import (
    Bucket,
    SharedBucket,
    Throttle,
    burst_for,
    full,
    parse_rate,
    take,
    take_all,
    wait_for,
)
from marshal_workers.observe.metrics import Counters

# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("given_rate", "per_second"),
    [("200/s", 200.0), ("100/m", 100 / 60), ("5/h", 5 / 3600), (" 2.5 / s ", 2.5), (30, 30.0), (0.5, 0.5)],
)
def test_rate_limits_are_read_per_second_minute_or_hour(given_rate: object, per_second: float) -> None:
    assert parse_rate(given_rate) == pytest.approx(per_second)
    app = App(group="g")
    app.handler("t", rate_limit=given_rate)(lambda msg: None)  # type: ignore[arg-type]
    assert app.handlers["t"].rate_limit == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["200", "200/d", "fast", "-5/s", "0/s", 0, -1, True, float("inf"), float("nan")])
def test_a_bad_rate_limit_is_refused_with_examples(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"handler for 't': rate_limit: .*(such as '200/s'|more than 0)"):
        App(group="g").handler("t", rate_limit=bad)  # type: ignore[arg-type]


def test_no_limits_by_default() -> None:
    app = App(group="g")
    app.handler("t")(lambda msg: None)
    spec = app.handlers["t"]
    assert (spec.rate_limit, spec.max_age, spec.on_too_old) == (None, None, OnTooOld.SKIP)


def test_max_age_is_a_duration_and_on_too_old_skip_or_dlq() -> None:
    app = App(group="g")
    app.handler("t", max_age="1h", on_too_old="dlq")(lambda msg: None)
    assert (app.handlers["t"].max_age, app.handlers["t"].on_too_old) == (3600.0, OnTooOld.DLQ)
    with pytest.raises(ConfigError, match="handler for 'u': max_age: expected a duration"):
        app.handler("u", max_age="an hour")
    with pytest.raises(ConfigError, match="on_too_old must be 'skip' or 'dlq', got 'drop'"):
        app.handler("u", max_age="1h", on_too_old="drop")
    with pytest.raises(ConfigError, match="on_too_old='dlq' needs max_age"):
        app.handler("u", on_too_old="dlq")


# ------------------------------------------------------------- the bucket

rates = st.floats(min_value=0.01, max_value=10_000)
steps = st.lists(st.tuples(st.floats(min_value=0, max_value=5), st.integers(min_value=0, max_value=1000)), max_size=60)


@given(rates, steps)
def test_a_bucket_never_grants_more_than_rate_times_elapsed_plus_burst(
    rate: float, takes: list[tuple[float, int]]
) -> None:
    burst = burst_for(rate)
    start = now = 1000.0
    bucket, granted_total = full(start, burst), 0
    for advance, want in takes:
        now += advance
        granted, bucket = take(bucket, now, rate, burst, want)
        assert 0 <= granted <= want
        assert 0 <= bucket.tokens <= burst + 1e-9
        granted_total += granted
        assert granted_total <= rate * (now - start) + burst + 1e-6


@given(rates, steps)
def test_whole_batches_never_get_more_than_rate_times_elapsed_plus_the_burst_or_the_batch(
    rate: float, takes: list[tuple[float, int]]
) -> None:
    burst = burst_for(rate)
    start = now = 1000.0
    bucket, granted_total, largest = full(start, burst), 0, burst
    for advance, want in takes:
        now += advance
        granted, after = take_all(bucket, now, rate, burst, want)
        if granted:
            granted_total += want
            largest = max(largest, want)
        else:
            assert after == bucket._replace(
                tokens=min(burst, bucket.tokens + max(0.0, now - bucket.last) * rate), last=max(now, bucket.last)
            )
            # Not granted only while the bucket holds less than the batch (or, for a batch past the burst, is not full).
            assert after.tokens + 1e-9 < min(want, burst)
        bucket = after
        assert after.tokens <= burst + 1e-9
        assert granted_total <= rate * (now - start) + largest + 1e-6


def test_a_batch_past_the_burst_goes_when_the_bucket_is_full_and_the_next_takers_pay_for_it() -> None:
    granted, bucket = take_all(full(0.0, 10.0), 0.0, 100.0, 10.0, 30)
    assert granted and bucket.tokens == -20.0
    assert take_all(bucket, 0.2, 100.0, 10.0, 1)[0] is False  # -20 + 20: nothing yet
    assert wait_for(bucket, 100.0) == pytest.approx(0.21)
    assert take_all(bucket, 0.21, 100.0, 10.0, 1)[0] is True


@given(rates, st.floats(min_value=0, max_value=100))
def test_a_bucket_grants_what_flowed_in(rate: float, idle: float) -> None:
    """Not stingy either: after an empty bucket, waiting ``wait_for`` gives a token."""
    burst = burst_for(rate)
    granted, bucket = take(full(0.0, burst), 0.0, rate, burst, 10**9)
    assert granted == int(burst + 1e-9)  # the bucket forgives float dust, as take() does
    wait = wait_for(bucket, rate)
    assert take(bucket, wait + 1e-9, rate, burst, 1)[0] == 1
    expected = min(burst, bucket.tokens + idle * rate)
    assert take(bucket, idle, rate, burst, 10**9)[0] == int(expected + 1e-9)


def test_a_clock_that_goes_back_adds_nothing() -> None:
    assert take(Bucket(0.5, 10.0), 9.0, 100.0, 10.0, 1) == (0, Bucket(0.5, 10.0))


def test_the_burst_is_a_tenth_of_a_second_and_at_least_one_message() -> None:
    assert burst_for(200) == 20
    assert burst_for(0.5) == 1


def test_a_shared_bucket_is_one_bucket_for_every_holder_of_its_array() -> None:
    context = multiprocessing.get_context("fork")
    first = SharedBucket.create(context, 100.0)
    second = SharedBucket(first.array, 100.0)
    now = time.monotonic()
    assert first.take(10, now)[0] == 10  # the burst
    granted, wait = second.take(1, now)
    assert granted == 0 and 0 < wait <= 0.01


def test_a_throttle_waits_for_tokens_and_stops_when_told() -> None:
    context = multiprocessing.get_context("fork")
    array = SharedBucket.create(context, 1000.0).array
    throttle = Throttle(array, 1000.0)
    began = time.monotonic()
    assert throttle.acquire(300)  # the bucket is full: at once, 200 in debt
    assert throttle.acquire(1)  # waits for the debt
    assert 0.15 <= time.monotonic() - began < 5
    assert not throttle.acquire(10**6, tick=lambda: False)


# ----------------------------------------------------------------- the age


@pytest.mark.parametrize(
    ("timestamp", "too_old"),
    [
        ((1, 1_000), True),
        ((1, 6_400_000), True),
        ((1, 6_401_000), False),
        ((2, 10_000_000), False),
        ((0, 1), False),
        ((1, -1), False),
        ((2, 0), True),
    ],
)
def test_a_message_is_too_old_when_its_timestamp_is_past_max_age(timestamp: tuple[int, int], too_old: bool) -> None:
    assert is_too_old(timestamp, now_ms=10_001_000, max_age_ms=3_600_000) is too_old


def test_a_batch_splits_into_fresh_and_too_old_in_order() -> None:
    records = [FakeRecord(timestamp=stamp) for stamp in ((1, 0), (1, 9_000), (0, 0), (1, 1))]
    fresh, old = split_by_age(records, now_ms=10_000, max_age_ms=5_000)
    assert fresh == [records[1], records[2]] and old == [records[0], records[3]]


def test_the_dead_letters_error_says_how_old() -> None:
    error = too_old_error((1, 0), now_ms=7_200_000, max_age_ms=3_600_000)
    assert isinstance(error, MessageTooOld) and str(error) == "7200s old, past max_age (3600s)"


def test_too_old_messages_are_counted_in_the_outcomes() -> None:
    counts = OutcomeCounts()
    counts.too_old += 3
    report = counts.take()
    assert report is not None and report["too_old"] == 3 and counts.take() is None
    counters = Counters()
    counters.add_outcomes("t", report)
    assert counters.handler_outcomes[("t", "too_old")] == 3
