"""The executors a worker's concurrent calls run on (marshal_workers.runtime.worker.executors): no broker needed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from marshal_workers.errors import SoftTimeLimitExceeded
from marshal_workers.runtime.worker.executors import AsyncExecutor, Completion, Executor, ThreadExecutor


def collect(executor: Executor, count: int, timeout: float = 10.0) -> dict[int, Completion]:
    """Wait for ``count`` completions, enforcing the soft limit as the lane runner does."""
    done: dict[int, Completion] = {}
    deadline = time.monotonic() + timeout
    while len(done) < count:
        assert time.monotonic() < deadline, f"only {len(done)} of {count} calls finished"
        executor.enforce_soft_limit(time.monotonic())
        done.update((c.offset, c) for c in executor.wait(0.01))
    return done


@pytest.fixture
def closing() -> Iterator[list[Executor]]:
    made: list[Executor] = []
    yield made
    for executor in made:
        executor.close()


def test_threads_run_calls_side_by_side_and_report_each_outcome(closing: list[Executor]) -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def handler(value: Any) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        if value == "bad":
            raise ValueError("bad value")

    executor = ThreadExecutor(handler, threads=8, soft_time_limit=0)
    closing.append(executor)
    executor.submit([(o, "bad" if o == 3 else "ok") for o in range(8)])
    done = collect(executor, 8)
    assert most[0] == 8  # all at once, not one after the other
    assert isinstance(done[3].error, ValueError)
    assert all(done[o].error is None for o in range(8) if o != 3)
    assert all(c.elapsed_ns >= 40_000_000 for c in done.values())


def test_a_thread_past_its_soft_limit_gets_soft_time_limit_exceeded(closing: list[Executor]) -> None:
    cleaned_up = threading.Event()

    def handler(value: Any) -> None:
        try:
            while True:  # pure Python: the exception lands at the next instruction
                time.sleep(0.001)
        except SoftTimeLimitExceeded:
            cleaned_up.set()
            raise

    executor = ThreadExecutor(handler, threads=2, soft_time_limit=0.1)
    closing.append(executor)
    executor.submit([(7, None)])
    done = collect(executor, 1)
    assert isinstance(done[7].error, SoftTimeLimitExceeded) and cleaned_up.is_set()


def test_a_fast_thread_call_never_sees_the_soft_limit(closing: list[Executor]) -> None:
    executor = ThreadExecutor(lambda value: None, threads=4, soft_time_limit=0.05)
    closing.append(executor)
    executor.submit([(o, None) for o in range(200)])
    done = collect(executor, 200)
    time.sleep(0.1)
    executor.enforce_soft_limit(time.monotonic())  # nothing registered: nothing raised anywhere
    assert all(c.error is None for c in done.values())


def test_async_calls_run_as_tasks_together(closing: list[Executor]) -> None:
    async def handler(value: Any) -> None:
        await asyncio.sleep(0.2)
        if value == "bad":
            raise KeyError("bad")

    executor = AsyncExecutor(handler, soft_time_limit=0)
    closing.append(executor)
    started = time.monotonic()
    executor.submit([(o, "bad" if o == 5 else "ok") for o in range(100)])
    done = collect(executor, 100)
    assert time.monotonic() - started < 2  # 100 waits of 0.2 s overlapped
    assert isinstance(done[5].error, KeyError)
    assert sum(c.error is None for c in done.values()) == 99


def test_an_async_call_past_its_soft_limit_is_cancelled_with_soft_time_limit_exceeded(closing: list[Executor]) -> None:
    async def handler(value: Any) -> None:
        if value == "slow":
            await asyncio.sleep(60)
        else:
            raise TimeoutError("the handler's own timeout")  # not the soft limit's

    executor = AsyncExecutor(handler, soft_time_limit=0.1)
    closing.append(executor)
    executor.submit([(1, "slow"), (2, "own")])
    done = collect(executor, 2)
    assert isinstance(done[1].error, SoftTimeLimitExceeded)
    assert type(done[2].error) is TimeoutError
