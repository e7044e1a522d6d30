"""Outcomes of the group commit's writes, handed to the event loop in one wake-up per batch.

``asyncio.wrap_future`` costs each awaited write verdict its own ``call_soon_threadsafe``: a write to the
loop's self-pipe, an extra wake-up of the loop and a syscall, per request.  A group commit settles many
requests at once (every request of one write), so here the writer's thread queues the outcomes and wakes
the loop once; the loop then resolves every waiting request's future in one pass.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopHandoff:
    """Turns concurrent futures (done on another thread) into asyncio futures of one loop, batching the wake-ups."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
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
        return waiting

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
