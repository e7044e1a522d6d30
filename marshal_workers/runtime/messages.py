"""What passes on the pipes between processes: one named, typed message each (structs, pickled by the pipe).

A supervisor and each of its workers share a duplex pipe (multiprocessing.Pipe).  EOF on it means the other
end is gone.  Both ends import the messages from here.

A worker (one per claimed partition, runtime/worker/worker.py) and its supervisor
    worker to supervisor
        :class:`ClaimBatch`: at most once, claim every message before ``end`` (a batch) before handling it.
        :class:`Outcomes`: what became of failed handler calls since the last report (for the metrics).
    supervisor to worker
        :class:`ClaimVerdict`: the answer to a :class:`ClaimBatch`; the supervisor sends nothing else.

A shared worker (runtime/worker/shared_worker.py) and its supervisor's shared pool
(runtime/supervisor/shared_pool.py; docs/shared-partitions.md)
    supervisor to worker
        :class:`RangeLeased`: handle ``[start, end)`` before ``deadline_ms``.
        :class:`Renewed`: the lease on the range from ``start`` now lasts until ``deadline_ms``.
        :class:`Stop`: finish the range in hand, give the others back, exit.
    worker to supervisor
        :class:`Started`, :class:`Settled`, :class:`Abandoned`, :class:`Returned`: what became of a range.
        :class:`RangeProgress`: how far the range in hand is done (at a bounded cadence, and at once when an offset
        failed or was dead-lettered; its position between those is in the worker's channel.RangeSlot).
        :class:`Outcomes`, as above.

Deadlines are monotonic milliseconds (channel.monotonic_ms): one clock for every process of a host.
"""

from __future__ import annotations

from typing import Any

import msgspec

from marshal_workers.member.at_most_once import ClaimAnswer


class ClaimBatch(msgspec.Struct, frozen=True):
    """Worker to supervisor, at most once: claim every message before ``end`` in the log, then answer."""

    end: int


class ClaimVerdict(msgspec.Struct, frozen=True):
    """Supervisor to worker: what became of its :class:`ClaimBatch`."""

    answer: ClaimAnswer


class Outcomes(msgspec.Struct, frozen=True):
    """Worker (either kind) to supervisor: counts of failed calls, retries, ignored, rejected, too old and
    other-group messages since the last report (handler_outcomes.OutcomeCounts.take)."""

    counts: dict[str, Any]


class RangeLeased(msgspec.Struct, frozen=True):
    """Shared pool to shared worker: handle ``[start, end)`` of ``partition`` before ``deadline_ms``; its messages
    were delivered ``tries`` times before."""

    partition: int
    start: int
    end: int
    deadline_ms: int
    tries: int


class Renewed(msgspec.Struct, frozen=True):
    """Shared pool to shared worker: the lease on the range from ``start`` now lasts until ``deadline_ms``."""

    partition: int
    start: int
    deadline_ms: int


class Stop(msgspec.Struct, frozen=True):
    """Shared pool to shared worker: finish the range in hand, give the others back, exit."""


class Started(msgspec.Struct, frozen=True):
    """Shared worker to pool: handling the range from ``start`` now (if it dies, any offset of it may be handled)."""

    partition: int
    start: int


class Settled(msgspec.Struct, frozen=True):
    """Shared worker to pool: done with ``[start, end)`` (``end`` is short of the lease's when a stop or the
    partition's end came first): ``failed`` offsets to deliver again, ``dead`` ones dead-lettered, ``handled``
    messages handled; ``high``: the partition's end as its fetches saw it (or None); ``busy_ms``: how long it was
    busy with the range's messages (fetches that returned some, and handler calls; not waits at the partition's
    end), from which the pool sizes the next ranges (protocol/range_sizing.py)."""

    partition: int
    start: int
    end: int
    failed: tuple[int, ...]
    dead: tuple[int, ...]
    handled: int
    high: int | None
    busy_ms: float = 0.0


class RangeProgress(msgspec.Struct, frozen=True):
    """Shared worker to pool: inside the range from ``start`` in hand, every offset of ``[start, upto)`` is done
    except ``failed`` ones (to deliver again); ``dead`` ones were dead-lettered.  Cumulative: each one says all
    of it so far.  What it marks is done in the log when the lease ends, however it ends (``progress_ranges``)."""

    partition: int
    start: int
    upto: int
    failed: tuple[int, ...]
    dead: tuple[int, ...]


class Abandoned(msgspec.Struct, frozen=True):
    """Shared worker to pool: the lease's deadline passed first; the range was left alone from there."""

    partition: int
    start: int
    end: int


class Returned(msgspec.Struct, frozen=True):
    """Shared worker to pool: the range was never started (a stop, or the partition's end): to be cancelled."""

    partition: int
    start: int
    end: int


FromWorker = ClaimBatch | Outcomes
ToWorker = ClaimVerdict
ToSharedWorker = RangeLeased | Renewed | Stop
FromSharedWorker = Started | RangeProgress | Settled | Abandoned | Returned | Outcomes
