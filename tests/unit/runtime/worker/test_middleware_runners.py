"""Middleware under every way of running a handler: a partition's worker with each of its loops (one call at a
time, batches, lanes of threads, an async handler's lanes), a shared worker, and the testing harness
(marshal_workers.testing), and Spark replay's task (spark/replay.py).  One contract: the middleware sees each call once, with what the handler gets, around
it; an error it raises instead of the handler's is the one retries and dead letters apply to; a worker lifespan is
open while the messages are handled.

The worker shells run in the test's process on fake edges (worker_fakes.py), as in test_worker_shell.py and
test_shared_worker.py, whose runs these are."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_shared_worker import Run as SharedRun
from test_shared_worker import at_end, holds
from test_worker_shell import Run
from worker_fakes import TOPIC

from marshal_workers import App, Message
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.runtime.messages import RangeLeased
from marshal_workers.spark.replay import replay_records
from marshal_workers.testing import FakeRecord, make_message, run_handler

OFFSETS = range(6)
FAILING = 3  # the handler raises ConnectionError on it; the middleware raises Unavailable instead
RUNNERS = {
    "one call": {},
    "batches": {"batch": True, "batch_size": 2},
    "lanes": {"concurrency": 3},
    "async lanes": {"concurrency": 3, "async": True},
    "shared": {"shared": True},
    "testing harness": {},
    "testing harness, async": {"concurrency": 3, "async": True},
}


class Unavailable(Exception):
    """What the middleware makes of the handler's ConnectionError."""


class Recorder:
    """An app whose middleware and hooks note what they see: ``calls`` (the offsets of each call the middleware
    wrapped, and whether the handler was inside it), ``errors`` (what after_message was told) and ``life``."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.handled: list[int] = []
        self.errors: list[str] = []
        self.life: list[str] = []
        self.app = App("billing")
        options = {"retries": 1, "retry_backoff": 0.001, "retry_jitter": False, **options}
        is_async = options.pop("async", False)
        self.app.middleware(self._async_middleware if is_async else self._middleware)
        self.app.after_message(lambda msg, outcome, error, seconds: self.errors.append(type(error).__name__))
        self.app.lifespan(self._lifespan)
        handler = self._handle_async if is_async else (self._handle_batch if options.get("batch") else self._handle)
        self.app.handler(TOPIC, **options)(handler)

    def _lifespan(self) -> Iterator[None]:
        self.life.append("open")
        yield
        self.life.append(f"closed after {len(self.handled)}")

    def _offsets(self, msg: Any) -> tuple[int, ...]:
        return tuple(m.offset for m in msg) if isinstance(msg, list) else (msg.offset,)

    def _middleware(self, msg: Any, call_next: Callable[[Any], Any]) -> Any:
        self.calls.append(self._offsets(msg))
        try:
            return call_next(msg)
        except ConnectionError as exc:
            raise Unavailable(str(exc)) from exc

    async def _async_middleware(self, msg: Any, call_next: Callable[[Any], Any]) -> Any:
        self.calls.append(self._offsets(msg))
        try:
            return await call_next(msg)
        except ConnectionError as exc:
            raise Unavailable(str(exc)) from exc

    def _handle(self, msg: Message) -> None:
        assert self.life == ["open"], "inside the worker's lifespan"
        if msg.offset == FAILING:
            raise ConnectionError("refused")
        self.handled.append(msg.offset)

    async def _handle_async(self, msg: Message) -> None:
        self._handle(msg)

    def _handle_batch(self, msgs: list[Message]) -> None:
        if any(msg.offset == FAILING for msg in msgs):  # before it handles any: the batch is retried whole
            raise ConnectionError("refused")
        for msg in msgs:
            self._handle(msg)


def run(runner: str, recorder: Recorder, to_close: list[Any]) -> list[int]:
    """Run ``runner`` over OFFSETS; the offsets it dead-lettered."""
    app = recorder.app
    if runner.startswith("testing harness"):
        results = run_handler(app, TOPIC, [make_message(b"{}", offset=offset) for offset in OFFSETS])
        return [r.message.offset for r in results if r.outcome == "dead_letter"]
    if runner == "shared":
        shared = SharedRun(app, OFFSETS, at_end)
        to_close.append(shared)
        shared.tell(RangeLeased(0, 0, FAILING + 1, holds(), 0), RangeLeased(0, FAILING + 1, len(OFFSETS), holds(), 0))
        assert shared.run() is WorkerExit.STOPPED
        return shared.dead.offsets
    calls = len(OFFSETS) // 2 + 1 if app.handlers[TOPIC].batch else len(OFFSETS) + 1  # the retry included
    worker = Run(app, OFFSETS, done=lambda: len(recorder.errors) >= calls)  # every call over: the loop may stop
    to_close.append(worker)
    assert worker.run() is WorkerExit.STOPPED
    return worker.dead.offsets


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_middleware_wraps_every_call_once_and_its_error_is_the_one_the_worker_acts_on(
    runner: str, to_close: list[Any]
) -> None:
    recorder = Recorder(dict(RUNNERS[runner]))

    dead = run(runner, recorder, to_close)

    batch = recorder.app.handlers[TOPIC].batch
    seen = sorted(offset for call in recorder.calls for offset in call)
    tries = 2  # the first call and its one retry
    if batch:  # a failing batch is retried whole, then dead-lettered whole
        failing_batch = next(call for call in recorder.calls if FAILING in call)
        assert recorder.calls.count(failing_batch) == tries
        assert sorted(dead) == list(failing_batch)
        assert seen == sorted([*OFFSETS, *failing_batch])
    elif runner == "shared":  # a shared message that keeps failing is left for its next delivery
        assert seen == sorted([*OFFSETS, FAILING]) and dead == []
    else:
        assert seen == sorted([*OFFSETS, FAILING]), "each message once, the failing one once more (its retry)"
        assert dead == [FAILING]
    assert recorder.errors.count("Unavailable") == tries and "ConnectionError" not in recorder.errors
    assert sorted(recorder.handled) == sorted(set(OFFSETS) - set(dead) - {FAILING})
    assert recorder.life == ["open", f"closed after {len(recorder.handled)}"], "the lifespan closed at the stop"


@pytest.mark.parametrize("options", [{}, {"batch": True, "batch_size": 2}], ids=["one call", "batches"])
def test_a_spark_replay_runs_the_middleware_and_hooks_and_stops_at_the_error_the_middleware_raised(
    options: dict[str, Any],
) -> None:
    recorder = Recorder(dict(options))
    records = [FakeRecord(TOPIC, 0, offset, b"k", b"{}") for offset in OFFSETS]

    handled, failure = replay_records(
        recorder.app, TOPIC, lambda most: [records[i : i + most] for i in range(0, len(records), most)]
    )

    assert failure is not None and failure[0] == (FAILING - 1 if options else FAILING)  # a batch stops at its first
    assert isinstance(failure[1], Unavailable), "the middleware's error, not the handler's"
    assert recorder.errors.count("Unavailable") == 2 and "ConnectionError" not in recorder.errors  # one retry
    assert recorder.handled == list(range(failure[0])) and handled == failure[0]
    assert recorder.life == ["open", f"closed after {failure[0]}"], "a replayed split is a worker's life"
