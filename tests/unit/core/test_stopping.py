"""Start-up steps give up as soon as a stop is asked for (marshal_workers/core/stopping.py)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from marshal_workers.core import stopping
from marshal_workers.errors import StopRequested


def asked_after(seconds: float) -> stopping.ShouldStop:
    """A should_stop that starts saying yes ``seconds`` from now (a signal handler setting a flag)."""
    at = time.monotonic() + seconds
    return lambda: time.monotonic() >= at


def test_a_call_that_waits_on_a_broker_is_left_to_itself_when_a_stop_comes() -> None:
    release = threading.Event()
    began = time.monotonic()
    with pytest.raises(StopRequested):
        stopping.interruptible(lambda: release.wait(30), asked_after(0.2))
    assert time.monotonic() - began < 5  # not the call's 30 s
    release.set()


def test_a_call_returns_its_result_or_raises_its_error_when_no_stop_comes() -> None:
    assert stopping.interruptible(lambda: 42, asked_after(60)) == 42

    def failing() -> None:
        raise ValueError("no broker")

    with pytest.raises(ValueError, match="no broker"):
        stopping.interruptible(failing, asked_after(60))


def test_without_a_should_stop_the_call_runs_on_the_callers_thread() -> None:
    assert stopping.interruptible(threading.current_thread) is threading.current_thread()


def test_waiting_for_a_future_gives_up_on_a_stop_and_times_out_as_before() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(StopRequested):
        stopping.wait_future(future, 30, asked_after(0.2))
    with pytest.raises(TimeoutError):
        stopping.wait_future(future, 0.3)
    future.set_result(7)
    assert stopping.wait_future(future, 1, asked_after(60)) == 7


def test_a_sleep_is_cut_short_by_a_stop() -> None:
    began = time.monotonic()
    with pytest.raises(StopRequested):
        stopping.sleep(30, asked_after(0.2))
    assert time.monotonic() - began < 5
    stopping.sleep(-1, stopping.never)  # nothing left to wait
