"""Which offsets the simulated workers handled, per partition, and how many of them more than once.

Kept for the shared (range-lease) and at-most-once topics only: the invariants of docs/simulation.md's
"Shared and at-most-once topics" (at most once never handles an offset twice; at least once never marks done an
offset no worker handled) and the figures (repeats) are read from here.  Runs, not offsets: workers handle
offsets in order, so a partition's runs stay few however long the run.
"""

from __future__ import annotations

import bisect

from marshal_workers.protocol.claiming import Key


class HandledRuns:
    """Per partition, the offsets handled at least once, as sorted disjoint runs ``[start, end)`` apart."""

    def __init__(self) -> None:
        self._starts: dict[Key, list[int]] = {}
        self._ends: dict[Key, list[int]] = {}
        self.repeats = 0  # offsets handled again (each time counted)

    def add(self, key: Key, start: int, end: int) -> int:
        """``[start, end)`` handled (again); how many of them had been handled before."""
        if end <= start:
            return 0
        starts = self._starts.setdefault(key, [])
        ends = self._ends.setdefault(key, [])
        first = bisect.bisect_left(ends, start)  # the first run that ends at or after start: may touch or overlap
        last = bisect.bisect_right(starts, end)  # runs from here on start after end
        again = sum(max(0, min(end, ends[i]) - max(start, starts[i])) for i in range(first, last))
        if first < last:
            start, end = min(start, starts[first]), max(end, ends[last - 1])
        starts[first:last] = [start]
        ends[first:last] = [end]
        self.repeats += again
        return again

    def covered(self, key: Key, start: int, end: int) -> bool:
        """Was every offset of ``[start, end)`` handled?"""
        if end <= start:
            return True
        starts = self._starts.get(key, [])
        index = bisect.bisect_right(starts, start) - 1
        return index >= 0 and self._ends[key][index] >= end

    def count_below(self, key: Key, end: int) -> int:
        """How many offsets below ``end`` were handled."""
        return sum(max(0, min(e, end) - s) for s, e in zip(self._starts.get(key, []), self._ends.get(key, [])))

    def missing(self, key: Key, start: int, end: int) -> int:
        """The first offset of ``[start, end)`` not handled (``end`` if every one was)."""
        starts = self._starts.get(key, [])
        index = bisect.bisect_right(starts, start) - 1
        if index >= 0 and self._ends[key][index] > start:
            return min(end, self._ends[key][index])
        return start
