"""Start-up steps that a stop signal interrupts within a fraction of a second.

A supervisor's signal handlers only note the signal (supervisor.py); its start-up (creating the coordination
topic, reading the log to its end) may wait on Kafka for long.  Each such step takes a ``should_stop`` callable,
looks at it at least every ``POLL_S``, and raises :class:`StopRequested` when it says so.  A librdkafka call that
waits for a broker holds the main thread, and with it Python's signal handlers, until it returns: such a call
runs on a thread of its own (:func:`interruptible`), abandoned if a stop comes first (it ends within its own
timeout, and holds nothing: a metadata request).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from marshal_workers.errors import StopRequested

T = TypeVar("T")
ShouldStop = Callable[[], bool]

POLL_S = 0.1  # how often a waiting step looks at should_stop


def never() -> bool:
    """The ``should_stop`` of a step nothing interrupts (every command but ``run``)."""
    return False


def check_stop(should_stop: ShouldStop) -> None:
    """Raise StopRequested if a stop was asked for."""
    if should_stop():
        raise StopRequested("a stop was asked for during start-up")


def wait_future(future: concurrent.futures.Future[T], timeout: float, should_stop: ShouldStop = never) -> T:
    """``future.result(timeout)``, giving up (StopRequested) as soon as ``should_stop`` says so."""
    deadline = time.monotonic() + timeout
    while True:
        check_stop(should_stop)
        remaining = deadline - time.monotonic()
        try:
            return future.result(timeout=max(0.0, min(POLL_S, remaining)))
        except concurrent.futures.TimeoutError:
            if remaining <= POLL_S:
                raise


def interruptible(call: Callable[[], T], should_stop: ShouldStop = never) -> T:
    """``call()``; when a stop may be asked for, on a thread of its own, so that it is heard (StopRequested) while
    the call still waits.  ``call`` must end on its own (a librdkafka call with a timeout)."""
    if should_stop is never:
        return call()
    check_stop(should_stop)
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            future.set_exception(exc)

    threading.Thread(target=run, name="interruptible-call", daemon=True).start()
    while True:
        check_stop(should_stop)
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            continue


def sleep(seconds: float, should_stop: ShouldStop = never) -> None:
    """``time.sleep(seconds)``, cut short (StopRequested) as soon as ``should_stop`` says so."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        check_stop(should_stop)
        time.sleep(min(POLL_S, remaining))
    check_stop(should_stop)
