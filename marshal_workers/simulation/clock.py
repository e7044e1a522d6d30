"""The virtual clock: an event queue.  Time moves only from one event to the next; nothing sleeps."""

from __future__ import annotations

import heapq
from collections.abc import Callable

Event = Callable[[], None]


class VirtualClock:
    """Seconds since the simulation's start, and what is due when.

    Events at the same time run in the order they were scheduled (a sequence number breaks ties), so a run
    never depends on how the heap orders equal keys.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Event]] = []
        self._seq = 0

    def at(self, when: float, event: Event) -> None:
        """Run ``event`` at ``when`` (at once, after what is already due now, if ``when`` is past)."""
        self._seq += 1
        heapq.heappush(self._queue, (max(when, self.now), self._seq, event))

    def after(self, delay: float, event: Event) -> None:
        self.at(self.now + delay, event)

    def run_until(self, end: float) -> None:
        """Run every event due up to ``end``, in time order; the clock stops at ``end``."""
        queue = self._queue
        while queue and queue[0][0] <= end:
            when, _, event = heapq.heappop(queue)
            self.now = when
            event()
        self.now = end

    @property
    def now_ms(self) -> int:
        return round(self.now * 1000)
