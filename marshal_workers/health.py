"""Is a worker keeping up with its partition?  Pure decisions over samples (DESIGN.md section 6).

Each cycle the supervisor samples, per claimed partition, the worker's next
offset, the messages it has handled, and the partition's high watermark.
Progress and speed are judged by messages handled: with concurrency inside a
worker (section 10) one slow message holds the next offset while the other
lanes keep handling, and that partition is busy, not stalled.  ``observe`` turns the new sample
and the partition's history into a verdict:

* keep: caught up (no lag), catching up (lag shrinking), or a burst the
  worker has not yet had ``behind_cycles`` cycles to absorb;
* release: falling behind (lag grew and it consumes slower than messages
  arrive) for ``behind_cycles`` cycles in a row, or stalled (no progress at
  all while lag > 0) for ``stall_after_s``.

Time is an argument (``Sample.at``, seconds on any monotonic clock); nothing
here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HealthPolicy:
    behind_cycles: int = 5  # cycles in a row of falling behind before a release
    stall_after_s: float = 5.0  # no progress with lag > 0 for this long: release (the supervisor uses HB)
    smoothing: float = 0.3  # weight of the newest velocity in the moving averages (0..1]


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, monotonic
    consumed: int  # the worker's next offset
    high: int  # the partition's high watermark
    handled: int | None = None  # messages handled so far (None: judge by the next offset alone)

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
    progressed = done > 0 or sample.consumed > last.consumed
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


def _done_since(last: Sample, sample: Sample) -> int:
    """Progress between two samples: messages handled, or how far the next offset moved if that is more
    (compaction and transaction markers move the offset without a message to handle)."""
    moved = sample.consumed - last.consumed
    if sample.handled is None or last.handled is None:
        return moved
    return max(sample.handled - last.handled, moved)


def _average(previous: float | None, newest: float, weight: float) -> float:
    return newest if previous is None else previous + weight * (newest - previous)
