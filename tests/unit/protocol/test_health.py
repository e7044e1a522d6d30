"""The health monitor on synthetic series: keep a worker that keeps up or is in a call, release one that cannot."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol.health import (
    CallInFlight,
    HealthPolicy,
    PartitionHealth,
    Sample,
    Verdict,
    observe,
    watch_call,
)

POLICY = HealthPolicy(behind_cycles=3, stall_after_s=10.0, smoothing=0.5)


def verdicts(series: Iterable[tuple[float, int, int]], policy: HealthPolicy = POLICY) -> list[Verdict]:
    """Feed (at, consumed, high) samples; the verdict after each."""
    health, out = PartitionHealth(), []
    for at, consumed, high in series:
        health, verdict = observe(health, Sample(at, consumed, high), policy)
        out.append(verdict)
    return out


def test_a_caught_up_worker_is_kept() -> None:
    series = [(t, 100 * t, 100 * t) for t in range(30)]
    assert set(verdicts(series)) == {Verdict.KEEP}


def test_a_worker_catching_up_on_a_backlog_is_kept() -> None:
    # 10,000 waiting, 100/s arriving, 300/s handled: the lag shrinks every cycle.
    series = [(t, 300 * t, 10_000 + 100 * t) for t in range(40)]
    assert set(verdicts(series)) == {Verdict.KEEP}


def test_a_worker_falling_behind_is_released_after_the_cycles_and_not_before() -> None:
    # 200/s arriving, 120/s handled: the lag grows every cycle.
    result = verdicts([(t, 120 * t, 200 * t) for t in range(10)])
    first = result.index(Verdict.FALLING_BEHIND)
    assert first == POLICY.behind_cycles  # the first sample only sets the baseline
    assert set(result[:first]) == {Verdict.KEEP}


def test_a_stalled_handler_is_released_once_it_made_no_progress_for_the_stall_time() -> None:
    # Handling stops at t=5 (a handler stuck on one message) while messages keep arriving slowly.
    series = [(t, min(t, 5) * 10, 10 * t + 1) for t in range(30)]
    result = verdicts(series, HealthPolicy(behind_cycles=1000, stall_after_s=10.0))
    assert result.index(Verdict.STALLED) == 15  # 10 s after the last progress, at t=5
    assert set(result[:15]) == {Verdict.KEEP}


def test_a_stalled_partition_with_nothing_to_do_is_not_stalled() -> None:
    series = [(t, 500, 500) for t in range(30)]
    assert set(verdicts(series)) == {Verdict.KEEP}


def test_a_short_burst_of_the_producer_is_absorbed_without_a_release() -> None:
    # 100/s normally; one second of 1,000 extra messages; the worker handles up to 400/s.
    series, high, consumed = [], 0, 0
    for t in range(40):
        high += 100 + (1000 if t == 10 else 0)
        consumed = min(high, consumed + 400)
        series.append((t, consumed, high))
    assert set(verdicts(series)) == {Verdict.KEEP}


def test_a_burst_longer_than_the_worker_can_absorb_is_released() -> None:
    # The producer goes from 100/s to 1,000/s for good; the worker handles at most 400/s.
    series, high, consumed = [], 0, 0
    for t in range(40):
        high += 100 if t < 10 else 1000
        consumed = min(high, consumed + 400)
        series.append((t, consumed, high))
    result = verdicts(series)
    assert Verdict.FALLING_BEHIND in result and result.index(Verdict.FALLING_BEHIND) > 10


def test_samples_out_of_order_or_repeated_in_time_restart_the_baseline() -> None:
    health, verdict = observe(PartitionHealth(), Sample(10.0, 0, 100), POLICY)
    health, verdict = observe(health, Sample(10.0, 0, 200), POLICY)
    assert verdict is Verdict.KEEP and health.consume_rate is None


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=60))
def test_a_worker_that_is_never_behind_is_never_released(steps: list[tuple[int, int]]) -> None:
    """Whatever arrives, a worker that has handled everything by each sample is kept."""
    high, series = 0, []
    for t, (arrived, _) in enumerate(steps):
        high += arrived
        series.append((float(t), high, high))
    assert set(verdicts(series)) == {Verdict.KEEP}


def test_a_slow_message_holding_the_offset_while_other_lanes_handle_is_not_stalled() -> None:
    # Concurrency inside a worker: offset 500 is stuck for a minute, the other lanes handle 200/s behind it.
    health, seen = PartitionHealth(), []
    for t in range(60):
        sample = Sample(float(t), 500, 10_000 + 100 * t, handled=200 * t)
        health, verdict = observe(health, sample, POLICY)
        seen.append(verdict)
    assert set(seen) == {Verdict.KEEP}
    assert health.consume_rate is not None and health.consume_rate > 150


def test_lanes_that_all_stop_are_stalled_like_a_single_call() -> None:
    health, seen = PartitionHealth(), []
    for t in range(30):
        health, verdict = observe(health, Sample(100.0 + t, 500, 10_000, handled=1_000), POLICY)
        seen.append(verdict)
    assert Verdict.STALLED in seen and seen.index(Verdict.STALLED) == POLICY.stall_after_s


# ------------------------------------------------------------- calls in flight (issue 25)

HB_S = 2.0
DEFAULTS = HealthPolicy(stall_after_s=HB_S)  # as the supervisor builds it with no time limit


def untimed(started: float, end: int) -> CallInFlight:
    """A call of a one-at-a-time worker with no time limit: the supervisor saw it start at ``started``."""
    return CallInFlight((0, end), started, timed=False)


def timed(started: float, end: int) -> CallInFlight:
    return CallInFlight((round(started * 1000), end), started, timed=True)


def long_calls(
    duration: float, messages: int, call: Callable[[float, int], CallInFlight], until: float
) -> list[Sample]:
    """A worker handling ``messages`` waiting messages at ``duration`` seconds each, sampled every HB/2."""
    samples, t = [], 0.0
    while t <= until:
        done = min(int(t // duration), messages)
        in_call = call(done * duration, done + 1) if done < messages else None
        samples.append(Sample(t, done, messages, handled=done, call=in_call))
        t += HB_S / 2
    return samples


def judge(samples: Iterable[Sample], policy: HealthPolicy) -> list[Verdict]:
    health, out = PartitionHealth(), []
    for sample in samples:
        health, verdict = observe(health, sample, policy)
        out.append(verdict)
    return out


def test_a_handler_taking_ten_heartbeats_per_message_keeps_its_partition_with_the_defaults() -> None:
    # The user's case: 3 messages waiting, 20 s each, HB 2 s; before, "stalled (lag 3)" after one HB.
    assert set(judge(long_calls(10 * HB_S, 3, untimed, until=70.0), DEFAULTS)) == {Verdict.KEEP}


def test_a_call_within_its_time_limit_keeps_the_partition() -> None:
    policy = HealthPolicy(stall_after_s=HB_S, call_time_limit=30.0)
    assert set(judge(long_calls(25.0, 3, timed, until=80.0), policy)) == {Verdict.KEEP}


def test_a_call_past_its_time_limit_is_stalled_one_stall_time_later() -> None:
    # The soft limit (30 s) did not stop it (a handler stuck in C code, or one that swallows the exception).
    policy = HealthPolicy(stall_after_s=HB_S, call_time_limit=30.0)
    samples = [Sample(float(t), 0, 3, handled=0, call=timed(0.0, 1)) for t in range(60)]
    result = judge(samples, policy)
    assert result.index(Verdict.STALLED) == 32, "the last sample within the limit (30 s) plus the stall time"
    assert set(result[:32]) == {Verdict.KEEP}


def test_a_message_in_hand_between_timed_calls_is_not_stalled() -> None:
    # Waiting a minute for its retry (the retry policy's backoff), with a 10 s time limit per call.
    policy = HealthPolicy(stall_after_s=HB_S, call_time_limit=10.0)
    samples = [Sample(float(t), 0, 3, handled=0, call=untimed(0.0, 1)) for t in range(60)]
    assert set(judge(samples, policy)) == {Verdict.KEEP}


def test_between_calls_nothing_moving_is_still_a_stall_after_the_stall_time() -> None:
    # A 7 s call ends at t=7; then the worker handles nothing more (stuck outside the handler) with lag 2.
    samples = [
        Sample(float(t), 0 if t < 7 else 1, 3, handled=0 if t < 7 else 1, call=untimed(0.0, 1) if t < 7 else None)
        for t in range(20)
    ]
    result = judge(samples, DEFAULTS)
    assert result.index(Verdict.STALLED) == 7 + HB_S, "judged by messages handled from the call's end"
    assert set(result[:9]) == {Verdict.KEEP}


def test_lanes_whose_calls_all_run_long_keep_their_partition() -> None:
    # concurrency: every lane in a long call, nothing finished for a minute; the oldest call published with its start.
    samples = [Sample(100.0 + t, 500, 10_000, handled=1_000, call=timed(99.0, 0)) for t in range(60)]
    assert set(judge(samples, DEFAULTS)) == {Verdict.KEEP}


def test_falling_behind_is_judged_as_before_while_a_call_runs() -> None:
    # 200/s arriving, 120/s handled by lanes that always have a call in flight: a call in flight hides no backlog.
    samples = [Sample(float(t), 120 * t, 200 * t, call=timed(t - 0.5, 0)) for t in range(10)]
    assert Verdict.FALLING_BEHIND in judge(samples, POLICY)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.01, 30.0), st.booleans(), st.integers(0, 3)), min_size=1, max_size=60),
    st.sampled_from([0.0, 5.0, 60.0]),
)
def test_a_partition_with_a_call_in_flight_within_its_limit_at_every_sample_is_never_stalled(
    steps: list[tuple[float, bool, int]], limit: float
) -> None:
    """Whatever the timing, the calls' lengths and what gets handled: while some call runs within the handler's
    time limit (or there is none) at every sample, and nothing new arrives, the partition is kept."""
    policy = HealthPolicy(behind_cycles=3, stall_after_s=1.0, call_time_limit=limit)
    t, handled, call_started, samples = 0.0, 0, 0.0, []
    for dt, new_call, finished in steps:
        t += dt
        handled += finished
        if new_call or (limit and t - call_started > limit):
            call_started = t  # a new call (the previous one ended, or the time limit killed it)
        samples.append(Sample(t, handled, 10_000, handled=handled, call=timed(call_started, handled + 1)))
    assert Verdict.STALLED not in judge(samples, policy)


def test_watch_call_reads_a_timed_start_and_dates_an_untimed_call_from_when_it_was_first_seen() -> None:
    # A timed call: the worker's own reading of its start, whenever it is seen.
    assert watch_call(None, started_ms=5_000, handling_end=11, next_offset=10, now=9.0) == timed(5.0, 11)
    # One call at a time with no time limit: the offset after the message in hand is above the progress.
    first = watch_call(None, started_ms=0, handling_end=11, next_offset=10, now=7.0)
    assert first == untimed(7.0, 11) and first.age(9.5) == 2.5
    assert watch_call(first, 0, 11, 10, now=8.0) is first, "the same call: still dated from when it was first seen"
    assert watch_call(first, 0, 12, 11, now=8.0) == untimed(8.0, 12), "the next call"
    assert watch_call(first, 0, 11, 11, now=8.0) is None, "done, and no other call began"
    assert watch_call(None, 0, 0, 0, now=1.0) is None, "a fresh slot: no call"
    # A timed call ended and its message waits for a retry: in hand, dated from when that was seen.
    assert watch_call(timed(5.0, 11), 0, 11, 10, now=9.0) == untimed(9.0, 11)
