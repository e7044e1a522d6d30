"""What to do after a handler call fails: retry (and when), give up (on_error), dead-letter at once, or skip.

Pure: an error, the attempt number and a random source in, a :class:`Step` out.  The one failure path
(failure_path.py), which every runner drives, asks :func:`next_step`, so a policy means the same thing wherever
its handler runs.

The anchors are Celery's task options (``autoretry_for``, ``dont_autoretry_for``, ``retry_backoff``,
``retry_backoff_max``, ``retry_jitter`` on by default) and Dramatiq's ``Retry``/``Reject`` semantics:

* ``raise marshal_workers.Retry(delay=...)``: retry this message, after ``delay`` if given (else the backoff),
  counted against ``retries`` like any failure;
* ``raise marshal_workers.Reject(reason)``: no retry, straight to the dead-letter topic, whatever ``on_error``;
* ``raise marshal_workers.Ignore()``: no retry, the message counts as done (skipped, counted);
* any other exception: retried if it is one of ``retry_on`` and none of ``no_retry_on``, while retries remain.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import NamedTuple

from marshal_workers.handlers.signals import Ignore, Reject, Retry


class Action(enum.Enum):
    RETRY = "retry"  # call the handler again on the message(s), after Step.delay seconds
    GIVE_UP = "give_up"  # the retries are spent, or the error is not retried: the handler's on_error applies
    REJECT = "reject"  # the handler rejected it: to the dead-letter topic at once
    IGNORE = "ignore"  # the handler ignored it: done, nothing more


class Step(NamedTuple):
    action: Action
    delay: float = 0.0  # seconds before the retry (RETRY only)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # retries after the first failure
    backoff: float = 0.1  # seconds before the first retry; doubles each time
    backoff_max: float = 600.0  # the longest wait between two tries (Celery's retry_backoff_max)
    jitter: bool = True  # wait a random time up to the backoff (Celery's retry_jitter): retries do not march
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    no_retry_on: tuple[type[BaseException], ...] = ()

    def backoff_delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` failed tries (1 after the first): the capped, doubling backoff,
        or with jitter a random time up to it (full jitter)."""
        ceiling = min(self.backoff * 2 ** max(failures - 1, 0), self.backoff_max)
        return (rng or random).uniform(0, ceiling) if self.jitter else ceiling


def next_step(policy: RetryPolicy, error: BaseException, failures: int, rng: random.Random | None = None) -> Step:
    """What to do after the ``failures``-th failed try (1 for the first) of a message, which raised ``error``."""
    if isinstance(error, Ignore):
        return Step(Action.IGNORE)
    if isinstance(error, Reject):
        return Step(Action.REJECT)
    if failures > policy.retries:
        return Step(Action.GIVE_UP)
    if isinstance(error, Retry):
        return Step(Action.RETRY, policy.backoff_delay(failures, rng) if error.delay is None else error.delay)
    if not isinstance(error, policy.retry_on) or isinstance(error, policy.no_retry_on):
        return Step(Action.GIVE_UP)
    return Step(Action.RETRY, policy.backoff_delay(failures, rng))
