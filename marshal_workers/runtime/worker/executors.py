"""Where a worker's concurrent handler calls run: a thread pool, or an event loop (docs/concurrency.md).

The lane runner decides what runs; an executor only runs it and reports back.
Both kinds take a list of calls at once and hand back :class:`Completion`s
through one queue, which the runner's thread drains (``wait``), so all the
bookkeeping stays on that one thread.

* :class:`ThreadExecutor` runs ``def`` handlers on N threads.  The soft time
  limit raises :class:`SoftTimeLimitExceeded` inside the thread of a call
  that ran past it (``PyThreadState_SetAsyncExc``, as Dramatiq's TimeLimit
  does): it lands at the next Python bytecode, so a call stuck in C code
  only stops at the hard time limit, which kills the worker.
* :class:`AsyncExecutor` runs ``async def`` handlers as tasks on an event
  loop of its own thread; the soft time limit is an ``asyncio`` timeout.
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from marshal_workers.errors import SoftTimeLimitExceeded

Call = tuple[int, Any]  # (the call's first offset, the argument: a Message, or a list of them)


@dataclass(slots=True)
class Completion:
    offset: int  # the call's first offset, as submitted
    error: BaseException | None  # None: the handler returned
    elapsed_ns: int


class Executor(Protocol):
    def submit(self, calls: Sequence[Call]) -> None: ...

    def wait(self, timeout: float) -> list[Completion]: ...

    def enforce_soft_limit(self, now: float) -> None: ...

    def close(self) -> None: ...


class _Completions:
    """The queue of finished calls, shared by both executors."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Completion] = queue.SimpleQueue()

    def put(self, completion: Completion) -> None:
        self._queue.put(completion)

    def wait(self, timeout: float) -> list[Completion]:
        """What finished, waiting up to ``timeout`` seconds for the first one."""
        done: list[Completion] = []
        try:
            done.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
            while True:
                done.append(self._queue.get_nowait())
        except queue.Empty:
            return done


class ThreadExecutor:
    def __init__(self, function: Callable[[Any], Any], threads: int, soft_time_limit: float) -> None:
        self._function = function
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="handler")
        self._completions = _Completions()
        self._soft = soft_time_limit
        self._running: dict[int, tuple[int, float]] = {}  # offset -> (thread id, soft deadline); soft limit on
        self._lock = threading.Lock()

    def submit(self, calls: Sequence[Call]) -> None:
        for offset, argument in calls:
            self._pool.submit(self._run, offset, argument)

    def _run(self, offset: int, argument: Any) -> None:
        error: BaseException | None = None
        started = time.perf_counter_ns()
        try:
            try:
                if self._soft:
                    with self._lock:
                        self._running[offset] = (threading.get_ident(), time.monotonic() + self._soft)
                self._function(argument)
            except BaseException as exc:  # noqa: BLE001 - every failure is the handler's outcome, reported back
                error = exc
            finally:
                if self._soft:
                    with self._lock:
                        self._running.pop(offset, None)
        except SoftTimeLimitExceeded as exc:  # raised just as the call returned: it still ran past the limit
            error = exc
        self._completions.put(Completion(offset, error, time.perf_counter_ns() - started))

    def wait(self, timeout: float) -> list[Completion]:
        return self._completions.wait(timeout)

    def enforce_soft_limit(self, now: float) -> None:
        if not self._soft:
            return
        with self._lock:  # held while raising, so the call cannot end (and its thread take another) meanwhile
            for offset, (thread, deadline) in list(self._running.items()):
                if now >= deadline:  # still registered, so still in the call (it unregisters under this lock)
                    _raise_in_thread(thread, SoftTimeLimitExceeded)
                    self._running[offset] = (thread, float("inf"))  # once per call

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _raise_in_thread(thread: int, exception: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exception))


class AsyncExecutor:
    def __init__(self, function: Callable[[Any], Any], soft_time_limit: float) -> None:
        self._function = function
        self._soft = soft_time_limit or None
        self._completions = _Completions()
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones
        self._thread = threading.Thread(target=self._loop.run_forever, name="handler-loop", daemon=True)
        self._thread.start()

    def submit(self, calls: Sequence[Call]) -> None:
        # One wake-up of the loop per round of calls, not per call.
        self._loop.call_soon_threadsafe(self._start_all, list(calls))

    def _start_all(self, calls: list[Call]) -> None:
        for offset, argument in calls:
            task = self._loop.create_task(self._run(offset, argument))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, offset: int, argument: Any) -> None:
        error: BaseException | None = None
        started = time.perf_counter_ns()
        limit = asyncio.timeout(self._soft)
        try:
            async with limit:
                await self._function(argument)
        except BaseException as exc:  # noqa: BLE001 - every failure is the handler's outcome, reported back
            error = exc
            # A TimeoutError of the handler's own (an HTTP client's, say) is not the soft limit's.
            if isinstance(exc, TimeoutError) and limit.expired():
                try:  # raised, from the timeout: its traceback shows where the handler was when time ran out
                    raise SoftTimeLimitExceeded(f"the handler ran past its soft time limit ({self._soft:g}s)") from exc
                except SoftTimeLimitExceeded as exceeded:
                    error = exceeded
        self._completions.put(Completion(offset, error, time.perf_counter_ns() - started))

    def wait(self, timeout: float) -> list[Completion]:
        return self._completions.wait(timeout)

    def enforce_soft_limit(self, now: float) -> None:
        pass  # asyncio.timeout does it inside each task

    def close(self) -> None:
        def stop() -> None:
            for task in self._tasks:
                task.cancel()
            self._loop.stop()

        if self._loop.is_running():
            self._loop.call_soon_threadsafe(stop)
            self._thread.join(5)
