"""The health monitor on synthetic series: keep a worker that keeps up, release one that cannot."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from marshal_workers.health import HealthPolicy, PartitionHealth, Sample, Verdict, observe

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
    series = [(t, min(t, 5) * 10, 10 * t + 1) for t in range(0, 30)]
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


@settings(max_examples=200, deadline=None)
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
