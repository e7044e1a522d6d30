"""Replay: run an App's handler over a range of a topic's history, one Spark task per split.

What a task does (on an executor, no pyspark needed):

* it loads MODULE:APP (once per Python worker: Spark reuses them), runs the
  ``on_worker_start`` hooks, reads its split with its own consumer, and calls
  the topic's handler, inside the app's middleware and message hooks as in a
  worker, on every message in offset order: one message per call,
  or lists of up to ``batch_size`` for a batch handler; then the
  ``on_worker_stop`` hooks.  Each split is a worker's life.
* at least once, whatever the handler's mode: a replay re-processes history
  on purpose, and a task that Spark runs again re-handles its whole split.
* it never writes to the coordination topic and never commits an offset: a
  replay leaves the group's positions alone, so it is safe beside a live fleet.
* a failing handler goes through the worker's failure path
  (handlers/failure_path.py): retried as the worker retries it (``retries``,
  the backoff, ``Retry``, ``Ignore``); a failure that is final (the retries
  spent, a ``Reject``, of a typed batch its first message that did not
  decode) stops the split at that message and reports it: the replay fails
  (exit code 14) and says which ranges to run again.  Nothing is
  dead-lettered: the dead-letter topic holds what the live fleet could not
  handle, and a replay that can be re-run has no need to park messages there.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marshal_workers.core.config import Settings
from marshal_workers.errors import SparkJobError
from marshal_workers.handlers.app import App, HandlerSpec, Message
from marshal_workers.handlers.blocking_calls import blocking
from marshal_workers.handlers.failure_path import FailurePath, Fate, Final
from marshal_workers.handlers.loader import load_app
from marshal_workers.spark.jobs import run_job
from marshal_workers.spark.planner import Split, total_size
from marshal_workers.spark.split_reader import SplitReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FETCH_MOST = 1000  # records per consume() for one-message handlers
_ERROR_CHARS = 4000


@dataclass(frozen=True)
class SplitResult:
    """What one task did with its split."""

    split: Split
    handled: int  # messages the handler finished (a batch counts when the call returned)
    seconds: float  # the task's time, from its consumer's start to its last message
    failed_offset: int | None = None  # the first message the handler could not handle, after its retries
    error: str | None = None  # its last exception, with the traceback

    @property
    def ok(self) -> bool:
        return self.failed_offset is None

    @property
    def rate(self) -> float:
        return self.handled / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReplayReport:
    app_path: str
    topic: str
    results: list[SplitResult]
    seconds: float  # wall time of the Spark job, from submission to the last result

    @property
    def handled(self) -> int:
        return sum(r.handled for r in self.results)

    @property
    def failed(self) -> list[SplitResult]:
        return [r for r in self.results if not r.ok]

    @property
    def rate(self) -> float:
        return self.handled / self.seconds if self.seconds > 0 else 0.0


# ------------------------------------------------------------------ driver


def replay(spark: SparkSession, app_path: str, settings: Settings, splits: Sequence[Split]) -> ReplayReport:
    """Run the handler of ``splits``' topic over every split, in parallel; the report of every split.

    Handler failures are in the report (``failed``); a split that cannot be read fails the job: SparkJobError.
    """
    if not splits:
        raise ValueError("nothing to replay: no split")
    topics = {split.topic for split in splits}
    if len(topics) != 1:
        raise ValueError(f"one topic per replay, got {sorted(topics)}")
    topic = topics.pop()
    task = functools.partial(replay_split, app_path, settings)
    spark.sparkContext.setJobDescription(f"marshal-workers replay {app_path} {topic} ({total_size(splits)} messages)")
    started = time.monotonic()
    results = run_job(
        f"replay of {topic}", lambda: spark.sparkContext.parallelize(splits, len(splits)).map(task).collect()
    )
    return ReplayReport(app_path, topic, sorted(results, key=lambda r: r.split), time.monotonic() - started)


def render(report: ReplayReport) -> list[str]:
    """Per split and total: counts and rates, and what failed."""
    lines = []
    for result in report.results:
        where = f"{result.split!s:<32}"
        if result.ok:
            lines.append(f"{where} {result.handled:>12,} messages {result.seconds:>8.2f} s {result.rate:>12,.0f}/s")
        else:
            lines.append(
                f"{where} {result.handled:>12,} messages, then FAILED at offset {result.failed_offset}:\n"
                + "\n".join("    " + line for line in (result.error or "").splitlines())
            )
    busy = sum(r.seconds for r in report.results)
    lines.append(
        f"total: {report.handled:,} messages of {report.topic} in {len(report.results)} splits, "
        f"{report.seconds:.2f} s ({report.rate:,.0f}/s); the tasks ran {busy:.2f} s in all"
    )
    return lines


def document(report: ReplayReport) -> dict[str, Any]:
    """The report as JSON for ``replay --json``."""
    return {
        "app": report.app_path,
        "topic": report.topic,
        "messages": report.handled,
        "seconds": round(report.seconds, 3),
        "rate": round(report.rate, 1),
        "splits": [
            {
                "partition": r.split.partition,
                "start": r.split.start,
                "end": r.split.end,
                "handled": r.handled,
                "seconds": round(r.seconds, 3),
                "rate": round(r.rate, 1),
                "failed_offset": r.failed_offset,
                "error": r.error,
            }
            for r in report.results
        ],
    }


def failure_summary(report: ReplayReport) -> str:
    """What to run again after handler failures."""
    again = "; ".join(
        f"--partition {r.split.partition} --from {r.failed_offset} --to {r.split.end}" for r in report.failed
    )
    return (
        f"{len(report.failed)} of {len(report.results)} splits stopped at a message their handler could not handle "
        f"(errors above); the rest of the replay is done. Fix the handler, then replay what is left: {again}"
    )


# ---------------------------------------------------------------- executors


def replay_split(app_path: str, settings: Settings, split: Split) -> SplitResult:
    """In a task: the worker hooks, then the handler on every message of ``split``."""
    app = load_app(app_path)  # imported once per Python worker: then sys.modules has it
    if split.topic not in app.handlers:
        raise SparkJobError(f"{app_path} has no handler for topic {split.topic!r} on this executor")
    started = time.monotonic()
    with SplitReader(settings, split) as reader:
        handled, failure = replay_records(app, split.topic, reader.batches)
    seconds = time.monotonic() - started
    if failure is None:
        return SplitResult(split, handled, seconds)
    offset, error = failure
    return SplitResult(split, handled, seconds, offset, _describe(error))


def replay_records(
    app: App, topic: str, batches: Callable[[int], Iterable[list[Any]]]
) -> tuple[int, tuple[int, BaseException] | None]:
    """One worker's life over ``batches(most)`` (a split's fetches in offset order): the worker hooks (a lifespan
    included) around the handler as a worker runs it, inside the app's middleware and message hooks; (messages
    handled, the first failure as (offset, error) or None)."""
    handler = replay_handler(app, topic)
    for hook in app.worker_start_hooks:
        hook()
    handled = 0
    try:
        for records in batches(handler.batch_size if handler.batch else FETCH_MOST):
            done, failure = handle_records(handler, records)
            handled += done
            if failure is not None:
                return handled, failure
    finally:
        _stop_hooks(app)
    return handled, None


def replay_handler(app: App, topic: str) -> HandlerSpec:
    """``topic``'s handler as a worker runs it (app.handler_in_worker: the middleware and the message hooks), an
    ``async def`` one awaited call by call."""
    return blocking(app.handler_in_worker(topic))


def handle_records(handler: HandlerSpec, records: list[Any]) -> tuple[int, tuple[int, BaseException] | None]:
    """A fetch of a split in offset order, one message per call or (batch) all in one: (messages handled, the
    first failure as (offset, error) or None)."""
    if handler.batch:
        try:
            handler.call(records)
            return len(records), None
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            return _recover(handler, records, exc)
    function = handler.function
    for index, record in enumerate(records):
        try:  # the fast path: one call; retries only after a failure
            function(Message(record))
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            handled, failure = _recover(handler, [record], exc)
            if failure is not None:
                return index + handled, failure
    return len(records), None


def _recover(
    handler: HandlerSpec, records: list[Any], error: BaseException
) -> tuple[int, tuple[int, BaseException] | None]:
    """After a first failure, the one failure path (handlers/failure_path.py), whose final failures stop the
    split: retried as a worker retries; (messages handled, the first that failed for good as (offset, error), or
    None once a try succeeded or the handler ignored it).  Of a typed batch, the messages that decoded count as
    handled, and the first that did not is where the split stops."""
    path, failures = FailurePath(final=Final.STOP), 1
    while True:
        decision = path.after_call(handler, [r.offset() for r in records], error, failures)
        if decision.fate is Fate.STOP:
            first = min(decision.letters)
            return len(records) - len(decision.letters), (records[first].offset(), decision.letters[first])
        if decision.fate is not Fate.RETRY:
            return len(records), None  # ignored: done
        time.sleep(decision.delay)
        failures += 1
        try:
            handler.call(records, failures)
            return len(records), None
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            error = exc


def _describe(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error, chain=False)).strip()  # the retry's error, not the first
    return text if len(text) <= _ERROR_CHARS else "...\n" + text[-_ERROR_CHARS:]


def _stop_hooks(app: App) -> None:
    for hook in app.worker_stop_hooks:
        try:
            hook()
        except Exception:  # a hook that fails on the way out changes no result: the executor's log says it
            log.exception("on_worker_stop hook %r failed", hook)
