"""The log lines of failed handler calls: each failure once, with its traceback, at the level its outcome deserves.

Every runner (one call at a time and batches through runtime/worker/failures.py, lanes in lane_runner.py, shared
partitions in shared_worker.py) logs a failed call once, when it knows what becomes of the message: the decision of
the failure path (failure_path.py), through :func:`log_decision`:

* tried again here (a retry), or later (a shared partition's next delivery, or the next owner after a stop):
  a warning;
* written to the dead-letter topic, or the partition released at it (``on_error="release"``, ``dlq_limit``):
  an error;
* ignored (``raise Ignore()``): an info line, without a traceback (the handler chose it).

The traceback goes with the line (``exc_info``: text logs print it below the line, JSON logs in the
``exception`` field), so a failure retried three times and then dead-lettered shows four tracebacks, one per
call, and none twice.  ``log`` is a logs.ContextLog: each line carries the group, topic and partition, and the
message's offset (in the text, and as the ``offset`` field of a JSON line).  An error that was never raised
(WorkerLost, MaxDeliveriesExceeded: made up for a message not handed to the handler) has no traceback to show.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from marshal_workers.core.logs import ContextLog
from marshal_workers.handlers.failure_path import Decision, Fate
from marshal_workers.handlers.signals import PayloadError


def log_decision(
    log: ContextLog,
    handler: str,
    offsets: list[int],
    decision: Decision,
    failures: int,
    destination: str,
    later: str = "the worker is stopping: the next owner retries it",
) -> None:
    """The one line of a failed call on ``offsets`` (its ``failures``-th failed try) once the failure path has
    decided: ``destination`` names the dead-letter topic, ``later`` who tries the message again (LATER)."""
    fate, error, offset = decision.fate, decision.error, offsets[0]
    if fate is Fate.RETRY:
        log_retry(log, handler, offset, error, failures, decision.delay)
    elif fate is Fate.IGNORED:
        log_ignored(log, handler, offset, error)
    elif fate is Fate.DEAD_LETTER and isinstance(error, PayloadError) and _partly_decoded(error, decision, offsets):
        log_undecoded(log, handler, offsets, sorted(decision.letters), error, destination)
    elif fate is Fate.DEAD_LETTER:
        first = offsets[min(decision.letters)]
        log_dead_letter(log, handler, first, error, len(decision.letters), destination)
    elif fate is Fate.RELEASE:
        if decision.in_a_row:
            log.error(
                "%d messages in a row went to %s (dlq_limit): releasing the partition as sick at offset %d instead",
                decision.in_a_row,
                destination,
                offset,
            )
        log_release(log, handler, offset, error)
    elif fate is Fate.LATER:
        log_left_for_later(log, handler, offset, error, later)


E = TypeVar("E", bound=BaseException)


def log_retry(log: ContextLog, handler: str, offset: int, error: BaseException, retry: int, delay: float) -> None:
    """The call on ``offset`` failed; retry number ``retry`` follows in ``delay`` seconds."""
    _failed(
        log,
        logging.WARNING,
        offset,
        error,
        "handler %s failed at offset %d (%r); retry %d in %.2fs",
        handler,
        offset,
        error,
        retry,
        delay,
    )


def log_left_for_later(log: ContextLog, handler: str, offset: int, error: BaseException, reason: str) -> None:
    """The call on ``offset`` failed and is tried again, but not by this worker now: ``reason`` says by whom."""
    _failed(
        log, logging.WARNING, offset, error, "handler %s failed at offset %d (%r): %s", handler, offset, error, reason
    )


def _partly_decoded(error: PayloadError, decision: Decision, offsets: list[int]) -> bool:
    """A typed batch some of whose messages did not decode: the handler had the others, so the call did not fail."""
    return bool(error.by_position) and len(decision.letters) < len(offsets)


def log_undecoded(
    log: ContextLog, handler: str, offsets: list[int], undecoded: list[int], error: PayloadError, destination: str
) -> None:
    """Of a typed batch at ``offsets``, the messages at positions ``undecoded`` did not decode and went to the
    dead-letter topic; the handler had the others.  A WARNING with each message's own reason, and no traceback:
    nothing failed in the handler."""
    reasons = "; ".join(f"offset {offsets[p]}: {error.by_position.get(p, error)}" for p in undecoded)
    log.warning(
        "handler %s: %d of %d messages did not decode (PayloadError) and went to %s, the other %d were handled (%s)",
        handler,
        len(undecoded),
        len(offsets),
        destination,
        len(offsets) - len(undecoded),
        reasons,
        extra={"offset": offsets[undecoded[0]]},
    )


def log_dead_letter(
    log: ContextLog, handler: str, offset: int, error: BaseException, count: int, destination: str
) -> None:
    """The ``count`` message(s) from ``offset`` went to the dead-letter topic because of ``error``; ``destination``
    names the topic (and, for a shared handler, after how many deliveries)."""
    _failed(
        log,
        logging.ERROR,
        offset,
        error,
        "handler %s failed at offset %d (%r): sent %d message(s) to %s",
        handler,
        offset,
        error,
        count,
        destination,
    )


def log_release(log: ContextLog, handler: str, offset: int, error: BaseException) -> None:
    """The call on ``offset`` failed for good, and the partition is released at it (not dead-lettered)."""
    _failed(
        log,
        logging.ERROR,
        offset,
        error,
        "handler %s failed at offset %d (%r): releasing the partition",
        handler,
        offset,
        error,
    )


def log_ignored(log: ContextLog, handler: str, offset: int, error: BaseException) -> None:
    """The handler raised Ignore: done, on purpose; no traceback."""
    log.info("handler %s ignored offset %d (%r)", handler, offset, error, extra={"offset": offset})


def apart_from(error: E, first: BaseException) -> E:
    """``error``, raised by a retry made while ``first`` (the message's first failure) was still being handled,
    without the link Python made to it (``__context__``: "During handling of the above exception, another
    exception occurred"): each call's traceback is its own, and the first failure is not shown again with every
    retry's.  Links the handler made itself (``raise ... from``, an exception of its own being handled) stay."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        if link.__context__ is first:
            link.__context__ = None
        pending.extend(e for e in (link.__cause__, link.__context__) if e is not None and e is not first)
    return error


def _failed(log: ContextLog, level: int, offset: int, error: BaseException, message: str, *args: Any) -> None:
    raised = error.__traceback__ is not None
    log.log(level, message, *args, exc_info=error if raised else None, extra={"offset": offset})
