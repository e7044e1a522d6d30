"""Outcomes of the group commit's writes, handed to the event loop in one wake-up per batch.

``asyncio.wrap_future`` costs each awaited write verdict its own ``call_soon_threadsafe``: a write to the
loop's self-pipe, an extra wake-up of the loop and a syscall, per request.  A group commit settles many
requests at once (every request of one write), so here the writer's thread queues the outcomes and wakes
the loop once; the loop then resolves every waiting request's future in one pass.

A request waits for its verdict at most ``within_s``: a TimeoutError then.  Every watch of one handoff has the
same wait, so their deadlines come in order and one timer of the loop (the earliest deadline's) serves them all,
where ``asyncio.timeout`` cost each request a timer handle and a context manager of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopHandoff:
    """Turns concurrent futures (done on another thread) into asyncio futures of one loop, batching the wake-ups."""

    def __init__(self, loop: asyncio.AbstractEventLoop, within_s: float | None = None) -> None:
        self._loop = loop
        self._within_s = within_s  # how long a watch waits at most (None: as long as it takes)
        self._deadlines: deque[tuple[float, asyncio.Future[Any]]] = deque()  # loop time, in order
        self._timer: asyncio.TimerHandle | None = None  # at the earliest deadline not yet known to be met
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Future[Any]]] = []
        self._scheduled = False  # a flush is on its way to the loop: outcomes queued meanwhile go with it
        self.wakeups = 0  # flushes scheduled from another thread (for the tests: fewer than outcomes under load)

    def watch(self, done: Future[T]) -> asyncio.Future[T]:
        """An asyncio future of this loop with ``done``'s outcome (call on the loop's thread)."""
        waiting: asyncio.Future[T] = self._loop.create_future()
        if done.done():
            _copy(done, waiting)
        else:
            done.add_done_callback(lambda finished: self._arrived(waiting, finished))
            if self._within_s is not None:
                self._keep_deadline(waiting, self._within_s)
        return waiting

    def _keep_deadline(self, waiting: asyncio.Future[Any], within_s: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():  # answered: forget them as new ones come (no timer needed)
            deadlines.popleft()
        deadlines.append((self._loop.time() + within_s, waiting))
        if self._timer is None:
            self._timer = self._loop.call_at(deadlines[0][0], self._expire)

    def _expire(self) -> None:
        """Fail every watch past its deadline with TimeoutError; wait again for the next one still open."""
        self._timer = None
        now, deadlines = self._loop.time(), self._deadlines
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, waiting = deadlines.popleft()
            if not waiting.done():
                waiting.set_exception(TimeoutError("no verdict in time"))
        if deadlines:
            self._timer = self._loop.call_at(deadlines[0][0], self._expire)

    def _arrived(self, waiting: asyncio.Future[Any], finished: Future[Any]) -> None:
        with self._lock:
            self._ready.append((waiting, finished))
            if self._scheduled:
                return
            self._scheduled = True
            self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _flush(self) -> None:
        with self._lock:
            ready, self._ready, self._scheduled = self._ready, [], False
        for waiting, finished in ready:
            if not waiting.done():  # a request that gave up (its timeout) cancelled it
                _copy(finished, waiting)


def _copy(finished: Future[Any], waiting: asyncio.Future[Any]) -> None:
    error = finished.exception()
    if error is not None:
        waiting.set_exception(error)
    else:
        waiting.set_result(finished.result())
