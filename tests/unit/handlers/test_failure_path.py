"""The one failure path (handlers/failure_path.py): what becomes of a failed call's messages, decided once for every
runner.  Pure: offsets, errors and try numbers in, decisions out."""

from __future__ import annotations

from typing import Any

import pytest

from marshal_workers import App, Ignore, PayloadError, Reject, Retry
from marshal_workers.handlers.app import HandlerSpec
from marshal_workers.handlers.failure_path import FailurePath, Fate, Final


def _handler(**options: Any) -> HandlerSpec:
    app = App("billing")
    app.handler("orders", retry_backoff=0.5, retry_jitter=False, **options)(lambda msg: None)
    return app.handlers["orders"]


def _tries(path: FailurePath, handler: HandlerSpec, offsets: list[int], error: BaseException) -> list[Fate]:
    """The fates of a call that fails with ``error`` every time, until the path stops retrying it."""
    fates, failures = [], 1
    while True:
        decision = path.after_call(handler, offsets, error, failures)
        fates.append(decision.fate)
        if decision.fate is not Fate.RETRY:
            return fates
        failures += 1


def test_a_failure_is_retried_with_the_backoff_then_dead_lettered_once_the_retries_are_spent() -> None:
    path, handler = FailurePath(), _handler(retries=2)
    delays = [path.after_call(handler, [7], ValueError("down"), n).delay for n in (1, 2)]
    assert delays == [0.5, 1.0]
    final = path.after_call(handler, [7], ValueError("down"), 3)
    assert final.fate is Fate.DEAD_LETTER and list(final.letters) == [0]
    counts = path.outcomes.take() or {}
    assert counts["retries"] == 2 and counts["errors"] == {"ValueError": 3}


def test_on_error_release_releases_the_partition_instead() -> None:
    assert _tries(FailurePath(), _handler(retries=1, on_error="release"), [7], ValueError()) == [
        Fate.RETRY,
        Fate.RELEASE,
    ]


def test_reject_and_ignore_are_never_retried() -> None:
    path, handler = FailurePath(), _handler(retries=5, on_error="release")
    rejected = path.after_call(handler, [1, 2], Reject("bad"), 1)
    assert rejected.fate is Fate.DEAD_LETTER and sorted(rejected.letters) == [0, 1], "whatever on_error says"
    assert path.after_call(handler, [3], Ignore(), 1).fate is Fate.IGNORED
    counts = path.outcomes.take() or {}
    assert (counts["rejected"], counts["ignored"], counts["retries"]) == (2, 1, 0)


def test_of_a_typed_batch_only_the_messages_that_did_not_decode_are_letters_even_at_one_offset() -> None:
    """Positions, not offsets: messages made for a test all carry offset 0 and are still told apart."""
    bad = PayloadError("not an invoice")
    decision = FailurePath().after_call(_handler(batch=True), [0, 0, 0], PayloadError("1 of 3", {1: bad}), 1)
    assert decision.fate is Fate.DEAD_LETTER and dict(decision.letters) == {1: bad}


def test_dlq_limit_releases_after_that_many_dead_letters_in_a_row_and_a_handled_message_starts_again() -> None:
    path, handler = FailurePath(), _handler(retries=0, dlq_limit=2)
    assert [path.after_call(handler, [o], ValueError(), 1).fate for o in (10, 11)] == [Fate.DEAD_LETTER] * 2
    released = path.after_call(handler, [12], ValueError(), 1)
    assert released.fate is Fate.RELEASE and released.in_a_row == 2
    # 13 was handled: the next failure begins a new row.
    assert path.after_call(handler, [14], ValueError(), 1).fate is Fate.DEAD_LETTER


def test_a_retry_the_runner_cannot_make_now_is_left_to_whoever_gets_the_message_next() -> None:
    """At least once, the next owner (or delivery) retries it; at most once nobody will: the failure is final."""
    at_least_once = FailurePath().after_call(_handler(), [1], ValueError(), 1, retry_here=False)
    at_most_once = FailurePath().after_call(_handler(mode="amo"), [1], ValueError(), 1, retry_here=False)
    assert (at_least_once.fate, at_most_once.fate) == (Fate.LATER, Fate.DEAD_LETTER)


@pytest.mark.parametrize(
    ("final", "spent", "rejected"),
    [
        (Final.ON_ERROR, Fate.DEAD_LETTER, Fate.DEAD_LETTER),
        (Final.DELIVER_AGAIN, Fate.LATER, Fate.DEAD_LETTER),
        (Final.STOP, Fate.STOP, Fate.STOP),
    ],
)
def test_each_runners_final_meets_a_failure_past_its_retries_and_a_reject(
    final: Final, spent: Fate, rejected: Fate
) -> None:
    handler = _handler(retries=1)
    assert _tries(FailurePath(final=final), handler, [4], Retry()) == [Fate.RETRY, spent]
    assert FailurePath(final=final).after_call(handler, [4], Reject("no"), 1).fate is rejected


def test_messages_given_up_on_without_a_call_meet_on_error() -> None:
    assert FailurePath().without_call(_handler(), [5, 6], TimeoutError()).fate is Fate.DEAD_LETTER
    assert FailurePath().without_call(_handler(on_error="release"), [5], TimeoutError()).fate is Fate.RELEASE
