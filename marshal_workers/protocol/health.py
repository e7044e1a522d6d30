"""Is a worker keeping up with its partition?  Pure decisions over samples.

Each cycle the supervisor samples, per claimed partition, the worker's next
offset, the messages it has handled, the partition's high watermark, and the
handler call in flight, if any.  Progress and speed are judged by messages
handled: with concurrency inside a worker one slow message holds the next
offset while the other lanes keep handling, and that partition is busy, not
stalled.  A handler call in progress is not a stall either: a task that runs
for minutes is normal.  While it runs it counts as progress until it passes
the handler's time limit (``call_time_limit``: the hard one, else the soft
one; none: it may run as long as it likes).  ``observe`` turns the new sample
and the partition's history into a verdict:

* keep: caught up (no lag), catching up (lag shrinking), a burst the worker
  has not yet had ``behind_cycles`` cycles to absorb, or a call running
  within its time limit;
* release: falling behind (lag grew and it consumes slower than messages
  arrive) for ``behind_cycles`` cycles in a row, or stalled (no progress at
  all while lag > 0) for ``stall_after_s``.

``watch_call`` tells, from what a worker publishes in its slot, which call is
in flight and since when.  Time is an argument (seconds on the supervisor's
monotonic clock, which its workers share); nothing here reads a clock or does
I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HealthPolicy:
    behind_cycles: int = 5  # cycles in a row of falling behind before a release
    stall_after_s: float = 5.0  # no progress with lag > 0 for this long: release (the supervisor uses HB)
    smoothing: float = 0.3  # weight of the newest velocity in the moving averages (0..1]
    # How long a handler call may run and still count as progress (the handler's hard time limit, else its soft
    # one); 0: no limit, a call in flight is never a stall.  Past it the stall clock runs: stall_after_s more.
    call_time_limit: float = 0.0


@dataclass(frozen=True)
class CallInFlight:
    """The handler call a worker is in (with concurrency, its oldest), as the supervisor sees it."""

    key: tuple[int, int]  # (CALL_STARTED_MS, HANDLING_END) as read from the slot: another key is another call
    started: float  # seconds, monotonic: the worker's own reading of the start, else when first seen
    timed: bool  # ``started`` is the worker's reading: the time limits apply (else: see _call_within_limit)

    def age(self, now: float) -> float:
        return max(now - self.started, 0.0)


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, monotonic
    consumed: int  # the worker's next offset
    high: int  # the partition's high watermark
    handled: int | None = None  # messages handled so far (None: judge by the next offset alone)
    call: CallInFlight | None = None  # the handler call in flight, if any

    @property
    def lag(self) -> int:
        return max(self.high - self.consumed, 0)


class Verdict(enum.Enum):
    KEEP = "keep"
    FALLING_BEHIND = "falling behind"
    STALLED = "stalled"

    @property
    def release(self) -> bool:
        return self is not Verdict.KEEP


@dataclass(frozen=True)
class PartitionHealth:
    """What the monitor remembers about one partition between samples."""

    last: Sample | None = None
    consume_rate: float | None = None  # moving average, messages/s
    produce_rate: float | None = None  # moving average, messages/s
    behind_cycles: int = 0
    last_progress_at: float | None = None


def observe(health: PartitionHealth, sample: Sample, policy: HealthPolicy) -> tuple[PartitionHealth, Verdict]:
    """Fold one sample into a partition's health; say whether to keep or release it."""
    last = health.last
    if last is None or sample.at <= last.at:
        return PartitionHealth(last=sample, last_progress_at=sample.at), Verdict.KEEP
    elapsed = sample.at - last.at
    done = _done_since(last, sample)
    consume_rate = _average(health.consume_rate, done / elapsed, policy.smoothing)
    produce_rate = _average(health.produce_rate, max(sample.high - last.high, 0) / elapsed, policy.smoothing)
    progressed = done > 0 or sample.consumed > last.consumed or _call_within_limit(sample, policy)
    last_progress_at = sample.at if progressed or sample.lag == 0 else (health.last_progress_at or last.at)
    behind = sample.lag > 0 and sample.lag > last.lag and consume_rate < produce_rate
    updated = replace(
        health,
        last=sample,
        consume_rate=consume_rate,
        produce_rate=produce_rate,
        behind_cycles=health.behind_cycles + 1 if behind else 0,
        last_progress_at=last_progress_at,
    )
    if sample.lag > 0 and sample.at - last_progress_at >= policy.stall_after_s:
        return updated, Verdict.STALLED
    if updated.behind_cycles >= policy.behind_cycles:
        return updated, Verdict.FALLING_BEHIND
    return updated, Verdict.KEEP


def _call_within_limit(sample: Sample, policy: HealthPolicy) -> bool:
    """A call in flight is progress while it runs within the handler's time limit (there is none: always).

    A message in hand between timed calls (waiting for its retry, or between the calls of an at-most-once
    batch) is too: the retry policy bounds that wait, not the time limit."""
    call = sample.call
    if call is None:
        return False
    return not call.timed or not policy.call_time_limit or call.age(sample.at) <= policy.call_time_limit


def watch_call(
    previous: CallInFlight | None, started_ms: int, handling_end: int, next_offset: int, now: float
) -> CallInFlight | None:
    """The call in flight from a worker's slot: ``started_ms`` (CALL_STARTED_MS: the start of a timed call,
    0 between calls or when calls are not timed), ``handling_end`` (HANDLING_END: one call at a time, the offset
    after the message in hand, stored before its call) and ``next_offset``; None when no call is in flight.

    An untimed call has no start in the slot (reading the clock per message would cost the hot path): it
    started when first seen, so its age errs short by at most the time between two looks.
    """
    if started_ms > 0:
        return CallInFlight((started_ms, handling_end), started_ms / 1000, timed=True)
    if handling_end <= next_offset:
        return None
    key = (0, handling_end)
    if previous is not None and previous.key == key:
        return previous
    return CallInFlight(key, now, timed=False)


def _done_since(last: Sample, sample: Sample) -> int:
    """Progress between two samples: messages handled, or how far the next offset moved if that is more
    (compaction and transaction markers move the offset without a message to handle)."""
    moved = sample.consumed - last.consumed
    if sample.handled is None or last.handled is None:
        return moved
    return max(sample.handled - last.handled, moved)


def _average(previous: float | None, newest: float, weight: float) -> float:
    return newest if previous is None else previous + weight * (newest - previous)
