"""Waiting on many pipes, sockets and process sentinels at once, with one selector kept between waits.

``multiprocessing.connection.wait`` builds a selector, registers every object,
polls and closes it on each call; ``Connection.poll(0)`` and
``Process.is_alive()`` each do the same for one object.  The supervisor's loop
waits once per AMO claim and per delivery report, so that work was a large part
of its CPU (py-spy: about half of the loop's time under an AMO benchmark).
A Waiter registers an object once and re-registers only what changed.

poll(2), not epoll: the kernel keeps no registration between calls, so a file
descriptor closed and reused between two waits cannot report for the old
object (each wait compares the object registered under a number with the one
asked for, and re-registers on a change).
"""

from __future__ import annotations

import selectors
from collections.abc import Iterable
from typing import Any


def _fileno(waitable: Any) -> int:
    return waitable if isinstance(waitable, int) else waitable.fileno()


class Waiter:
    """Wait until any of some objects (an int file descriptor or anything with fileno()) is readable."""

    def __init__(self) -> None:
        self._selector = selectors.PollSelector()
        self._registered: dict[int, Any] = {}

    def wait(self, waitables: Iterable[Any], timeout: float | None) -> set[Any]:
        """The objects of ``waitables`` that are readable (or at EOF), waiting up to ``timeout`` seconds."""
        wanted = {_fileno(w): w for w in waitables}
        registered = self._registered
        for fd in [fd for fd in registered if fd not in wanted]:
            self._selector.unregister(fd)
            del registered[fd]
        for fd, waitable in wanted.items():
            known = registered.get(fd)
            if known is waitable or (isinstance(waitable, int) and known == waitable):
                continue
            if known is not None:
                self._selector.unregister(fd)
            self._selector.register(fd, selectors.EVENT_READ, waitable)
            registered[fd] = waitable
        return {key.data for key, _ in self._selector.select(timeout)}

    def close(self) -> None:
        self._selector.close()
        self._registered.clear()
