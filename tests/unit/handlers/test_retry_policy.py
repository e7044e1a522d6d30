"""The retry policy (retry_policy.py) and the handler options that make it, without a broker."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers import App, Ignore, Reject, Retry
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.retry_policy import Action, RetryPolicy, Step, next_step
from marshal_workers.observe.metrics import Counters

FIXED = RetryPolicy(retries=3, backoff=1.0, backoff_max=5.0, jitter=False)


def test_a_failure_is_retried_with_a_doubling_capped_backoff_then_given_up() -> None:
    steps = [next_step(FIXED, ValueError("x"), failures) for failures in range(1, 5)]
    assert steps == [Step(Action.RETRY, 1.0), Step(Action.RETRY, 2.0), Step(Action.RETRY, 4.0), Step(Action.GIVE_UP)]
    capped = RetryPolicy(retries=10, backoff=1.0, backoff_max=5.0, jitter=False)
    assert next_step(capped, ValueError(), 8) == Step(Action.RETRY, 5.0), "never more than retry_backoff_max"


def test_only_the_errors_of_retry_on_and_none_of_no_retry_on_are_retried() -> None:
    policy = RetryPolicy(retry_on=(ConnectionError, TimeoutError), no_retry_on=(ConnectionRefusedError,), jitter=False)
    assert next_step(policy, ConnectionResetError(), 1).action is Action.RETRY  # a ConnectionError
    assert next_step(policy, ConnectionRefusedError(), 1).action is Action.GIVE_UP  # excluded
    assert next_step(policy, KeyError("k"), 1).action is Action.GIVE_UP  # not one of retry_on


def test_the_handler_says_what_to_do_with_retry_reject_and_ignore() -> None:
    assert next_step(FIXED, Retry(delay="250ms"), 1) == Step(Action.RETRY, 0.25)
    assert next_step(FIXED, Retry(), 2) == Step(Action.RETRY, 2.0), "no delay given: the backoff"
    assert next_step(FIXED, Retry(delay=0), 4) == Step(Action.GIVE_UP), "a Retry counts against retries"
    nothing_retried = RetryPolicy(retry_on=(KeyError,))
    assert next_step(nothing_retried, Retry(delay=1), 1).action is Action.RETRY, "asked for: retried whatever retry_on"
    assert next_step(FIXED, Reject("malformed"), 1) == Step(Action.REJECT), "no retry: to the dead-letter topic"
    assert next_step(FIXED, Ignore(), 1) == Step(Action.IGNORE)
    assert next_step(RetryPolicy(retries=0), Reject(), 1).action is Action.REJECT, "even with no retries left"


@given(st.integers(1, 60), st.floats(0.001, 100), st.floats(0.001, 1000), st.integers(0, 2**32))
def test_a_jittered_wait_is_never_negative_nor_past_the_cap(
    failures: int, backoff: float, cap: float, seed: int
) -> None:
    policy = RetryPolicy(retries=100, backoff=backoff, backoff_max=cap, jitter=True)
    delay = next_step(policy, OSError(), failures, random.Random(seed)).delay
    assert 0 <= delay <= min(backoff * 2 ** (failures - 1), cap)


def test_jitter_spreads_the_waits_of_many_workers() -> None:
    rng = random.Random(7)
    waits = {round(RetryPolicy(backoff=10, jitter=True).backoff_delay(1, rng), 3) for _ in range(50)}
    assert len(waits) > 40, "retries that do not march in step"


def test_handler_options_build_the_policy_and_bad_ones_say_what_to_do() -> None:
    app = App(group="g")

    @app.handler(
        "orders",
        retries=5,
        retry_backoff="1s",
        retry_backoff_max="30s",
        retry_jitter=False,
        retry_on=ConnectionError,
        no_retry_on=(ConnectionRefusedError,),
    )
    def on_order(msg: object) -> None: ...

    assert app.handlers["orders"].retry_policy == RetryPolicy(
        retries=5,
        backoff=1.0,
        backoff_max=30.0,
        jitter=False,
        retry_on=(ConnectionError,),
        no_retry_on=(ConnectionRefusedError,),
    )
    assert App(group="g").handler("t")(on_order) and RetryPolicy().jitter, "jitter is on by default, as in Celery"
    with pytest.raises(ConfigError, match="retry_on must be an exception class or a tuple of them"):
        App(group="g").handler("t", retry_on="ValueError")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="retry_backoff_max"):
        App(group="g").handler("t", retry_backoff_max="soon")
    with pytest.raises(ConfigError, match="retry_jitter must be True or False"):
        App(group="g").handler("t", retry_jitter="yes")  # type: ignore[arg-type]


def test_outcomes_reach_the_metrics_and_garbage_from_a_worker_is_dropped() -> None:
    counts = OutcomeCounts()
    assert counts.take() is None, "nothing to send"
    counts.failed(ValueError())
    counts.failed(ValueError())
    counts.failed(Reject("bad"))
    counts.retries, counts.rejected, counts.ignored = 1, 1, 0
    report = counts.take()
    assert report is not None
    assert counts.take() is None, "sent once"
    metrics = Counters()
    metrics.add_outcomes("orders", report)
    metrics.add_outcomes("orders", {"errors": "not a dict of counts"})
    metrics.add_outcomes("orders", {"retries": "many"})
    assert set(report) == {"errors", "retries", "ignored", "rejected", "too_old", "other_group"}, "one count of each"
    assert metrics.handler_errors == {("orders", "ValueError"): 2, ("orders", "Reject"): 1}
    assert metrics.handler_retries == {"orders": 1}
    assert metrics.handler_outcomes == {("orders", "ignored"): 0, ("orders", "rejected"): 1}
