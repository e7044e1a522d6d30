"""Rate limits: ``@app.handler(topic, rate_limit="200/s")`` bounds a handler's messages per second across all
the workers of one supervisor (docs/handlers.md, "Rate limits").

A token bucket: ``rate`` tokens a second flow in, up to ``burst``; a message takes one before its handler call
(a batch one per message).  The arithmetic is pure (:func:`refill`, :func:`take`, :func:`take_all`,
:func:`wait_for`: state and ``now`` in, state out), and never grants more than ``rate * elapsed + burst``
tokens, or for a batch larger than the burst, than ``rate * elapsed + its size``: such a batch goes when the
bucket is full and leaves it in debt, which the next takers wait for (rather than each of many workers
holding part of a batch's tokens while it waits for the rest).  The state lives in shared
memory (:class:`SharedBucket`: two doubles and a lock), created by the supervisor per rate-limited handler from its
fork-server context and passed to every worker of that topic, as the slot is.  Its clock is CLOCK_MONOTONIC,
one clock for every process of a host (channel.monotonic_ms).
"""

from __future__ import annotations

import math
import re
import time
from multiprocessing.context import BaseContext
from typing import Any, NamedTuple

from marshal_workers.errors import ConfigError

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")
_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
_ROUNDING = 1e-9  # tokens: what floating point loses in a refill is not held against a taker
BURST_SECONDS = 0.1  # the bucket holds a tenth of a second's worth of tokens (at least one)


def parse_rate(value: Any) -> float:
    """Messages per second from ``"N/s"``, ``"N/m"``, ``"N/h"`` (as Celery's ``rate_limit``) or a number (per second)."""
    if isinstance(value, bool):
        raise ConfigError(f"expected a rate such as '200/s', '100/m' or '5/h', got {value!r}")
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        match = _RATE.match(str(value))
        if not match:
            raise ConfigError(
                f"expected a rate such as '200/s', '100/m' or '5/h' (messages per second, minute or "
                f"hour), got {value!r}"
            )
        rate = float(match.group(1)) / _PER[match.group(2)]
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"a rate must be more than 0 messages per hour, got {value!r}")
    return rate


def burst_for(rate: float) -> float:
    """How many tokens the bucket holds: a tenth of a second's worth, at least one (one message can always go)."""
    return max(1.0, rate * BURST_SECONDS)


class Bucket(NamedTuple):
    tokens: float  # available now (at most burst)
    last: float  # when they were counted (monotonic seconds)


def full(now: float, burst: float) -> Bucket:
    return Bucket(burst, now)


def refill(bucket: Bucket, now: float, rate: float, burst: float) -> Bucket:
    """The bucket at ``now``: what flowed in since ``bucket.last``, up to ``burst``.  A clock that went back
    (it cannot, but a caller may pass an older ``now``) adds nothing."""
    if now <= bucket.last:
        return bucket
    return Bucket(min(burst, bucket.tokens + (now - bucket.last) * rate), now)


def take(bucket: Bucket, now: float, rate: float, burst: float, want: int) -> tuple[int, Bucket]:
    """Up to ``want`` whole tokens from the bucket at ``now``: (how many were granted, the bucket after)."""
    current = refill(bucket, now, rate, burst)
    granted = max(0, min(want, math.floor(current.tokens + _ROUNDING)))  # 2.9999999999 tokens are 3
    return granted, Bucket(max(0.0, current.tokens - granted), current.last)


def take_all(bucket: Bucket, now: float, rate: float, burst: float, want: int) -> tuple[bool, Bucket]:
    """All ``want`` tokens or none: (granted, the bucket after).  More than the burst can hold is granted when the
    bucket is full, leaving it below zero (in debt)."""
    current = refill(bucket, now, rate, burst)
    if current.tokens + _ROUNDING < min(want, burst):
        return False, current
    return True, Bucket(current.tokens - want if want > burst else max(0.0, current.tokens - want), current.last)


def wait_for(bucket: Bucket, rate: float, want: float = 1.0) -> float:
    """Seconds until the bucket (as of ``bucket.last``) holds ``want`` tokens again."""
    return max(0.0, (want - bucket.tokens) / rate)


class SharedBucket:
    """A :class:`Bucket` in shared memory, for one handler across the worker processes of a supervisor."""

    def __init__(self, array: Any, rate: float) -> None:
        self.array = array  # the shared Array('d', 2) (what is passed to a worker): tokens, last
        self.rate = rate
        self.burst = burst_for(rate)

    @classmethod
    def create(cls, context: BaseContext, rate: float) -> SharedBucket:
        array = context.Array("d", 2)  # with a lock: every worker takes from it
        bucket = full(time.monotonic(), burst_for(rate))
        array[0], array[1] = bucket.tokens, bucket.last
        return cls(array, rate)

    def take(self, want: int, now: float) -> tuple[int, float]:
        """(tokens granted, up to ``want``; seconds until the next one if none are left)."""
        with self.array.get_lock():
            granted, after = take(Bucket(self.array[0], self.array[1]), now, self.rate, self.burst, want)
            self.array[0], self.array[1] = after.tokens, after.last
        return granted, wait_for(after, self.rate)

    def take_all(self, want: int, now: float) -> tuple[bool, float]:
        """(all ``want`` tokens granted or none; seconds until they could be, if not)."""
        with self.array.get_lock():
            granted, after = take_all(Bucket(self.array[0], self.array[1]), now, self.rate, self.burst, want)
            self.array[0], self.array[1] = after.tokens, after.last
        return granted, 0.0 if granted else wait_for(after, self.rate, min(want, self.burst))


def create_buckets(context: BaseContext, rates: dict[str, float | None]) -> dict[str, Any]:
    """One shared bucket array per rate-limited topic (``rates``: topic -> messages per second or None)."""
    return {topic: SharedBucket.create(context, rate).array for topic, rate in rates.items() if rate}


class Throttle:
    """A worker's side of its handler's bucket: takes tokens, waiting in small steps when there are none.

    ``tick()`` is called while waiting (the worker's housekeeping); it returns False to stop waiting (a stop
    request, the lease lost): :meth:`acquire` then returns False, having taken nothing."""

    STEP_S = 0.05  # the longest sleep between two looks at the bucket (and at the stop request)

    def __init__(self, array: Any, rate: float) -> None:
        self.bucket = SharedBucket(array, rate)

    def acquire(self, count: int, tick: Any = None) -> bool:
        """Take ``count`` tokens (one per message) at once, waiting for them; False if ``tick()`` said to stop
        first."""
        while True:
            granted, wait = self.bucket.take_all(count, time.monotonic())
            if granted:
                return True
            if tick is not None and not tick():
                return False
            time.sleep(min(max(wait, 0.001), self.STEP_S))

    def try_acquire(self, count: int) -> tuple[int, float]:
        """Without waiting: (tokens granted, up to ``count``; seconds until the next one)."""
        return self.bucket.take(count, time.monotonic())
