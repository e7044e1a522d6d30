"""Instrumented handler calls: the soft time limit, the call in progress, the latency histogram.

Only what is switched on costs anything: with no time limit and no metrics
the handler is called as it is (the worker's hot path stays one call per
message).

* Soft time limit: an interval timer (SIGALRM) raises SoftTimeLimitExceeded
  inside the handler; the error policy treats it as any other failure.
* The call in progress (for the hard time limit, which the supervisor
  enforces by killing the worker, since a handler stuck in C code never sees
  a signal handler run, and for its health monitor, which judges a long call
  by the time limits): its start (monotonic_ms) and the offset after its
  message(s), in the worker's slot.
* Latency: a count per bucket of LATENCY_BOUNDS and the total time, in the
  slot, read by the supervisor's metrics endpoint.
"""

from __future__ import annotations

import bisect
import functools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.errors import SoftTimeLimitExceeded
from marshal_workers.handlers.app import HandlerSpec, effective_time_limits
from marshal_workers.observe.latency import LATENCY_BOUNDS
from marshal_workers.runtime.channel import LATENCY_FIRST_BUCKET, Field, Slot, monotonic_ms

Handler = Callable[[Any], Any]
_BOUNDS_NS = [round(bound * 1e9) for bound in LATENCY_BOUNDS]
_LATENCY_SAMPLE_INTERVAL_S = 0.1  # metrics on: how often a fetch's handler calls are timed


@dataclass(frozen=True)
class Instruments:
    soft_time_limit: float = 0.0  # seconds; 0: none
    track_calls: bool = False  # publish the call in progress (a hard time limit; a batch handler)
    latency: bool = False  # count handler latency (metrics are on)

    @property
    def any(self) -> bool:
        return bool(self.soft_time_limit or self.track_calls or self.latency)


def instrument(function: Handler, batch: bool, slot: Slot, instruments: Instruments) -> Handler:
    """``function`` wrapped with what ``instruments`` asks for (itself if nothing)."""
    if not instruments.any:
        return function
    fields = slot.fields
    soft, track, latency = instruments.soft_time_limit, instruments.track_calls, instruments.latency
    in_call = [False]  # the alarm raises only inside the call, never in our own bookkeeping around it

    if soft:

        def on_alarm(_signum: int, _frame: FrameType | None) -> None:
            if in_call[0]:
                raise SoftTimeLimitExceeded(f"the handler ran past its soft time limit ({soft:g}s)")

        signal.signal(signal.SIGALRM, on_alarm)

    @functools.wraps(function)  # the handler's name, in logs and dead letters, stays the user's
    def call(argument: Any) -> Any:
        if track:
            fields[Field.CALL_FIRST_OFFSET] = argument[0].offset if batch else argument.offset
            fields[Field.CALL_END_OFFSET] = (argument[-1].offset if batch else argument.offset) + 1
            fields[Field.CALL_STARTED_MS] = monotonic_ms()
        in_call[0] = True  # before the timer is armed, so a very short limit is never missed
        if soft:
            signal.setitimer(signal.ITIMER_REAL, soft)
        started = time.perf_counter_ns()
        try:
            return function(argument)
        finally:
            in_call[0] = False
            elapsed = time.perf_counter_ns() - started
            if soft:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if track:
                fields[Field.CALL_STARTED_MS] = 0
            if latency:
                fields[Field.LATENCY_SUM_NS] += elapsed
                fields[LATENCY_FIRST_BUCKET + bisect.bisect_left(_BOUNDS_NS, elapsed)] += 1

    return call


def instrumented_handlers(
    handler: HandlerSpec, settings: Settings, slot: Slot
) -> tuple[HandlerSpec, HandlerSpec | None]:
    """The handler with its time limits, and (metrics on) the same also timing each call."""
    soft, hard = effective_time_limits(handler, settings)
    # The call in progress is published with its start for a time limit (the hard one is enforced by the
    # supervisor; the health monitor judges a long call by either), and for a batch: if the worker dies in it,
    # the supervisor knows which batch to dead-letter as WorkerLost (worker_pool.py; a few writes per call).
    limits = Instruments(soft_time_limit=soft, track_calls=bool(soft or hard) or handler.batch)
    plain = replace(handler, function=instrument(handler.function, handler.batch, slot, limits))
    if not settings.metrics_port:
        return plain, None
    timed = replace(limits, latency=True)
    return plain, replace(handler, function=instrument(handler.function, handler.batch, slot, timed))


class LatencySampling:
    """Which handler a fetch's messages are given to: the plain one, or (metrics on, a sample due) the timed one.

    Every call of a fetch is timed once _LATENCY_SAMPLE_INTERVAL_S has passed
    since the last timed fetch: a fast handler pays a fraction of a percent
    for the histogram (timing every call cost a third of its throughput), a
    slow one, whose fetches last longer than that, is timed at every call.
    """

    def __init__(self, plain: HandlerSpec, timed: HandlerSpec | None = None) -> None:
        self.plain = plain
        self._timed = timed
        self._next_timed_fetch = 0.0

    def handler_for(self, records: list[Any]) -> HandlerSpec:
        if self._timed is None or not records or time.monotonic() < self._next_timed_fetch:
            return self.plain
        self._next_timed_fetch = time.monotonic() + _LATENCY_SAMPLE_INTERVAL_S
        return self._timed
