"""One fold of the coordination log for the whole fleet: every member reads the state it would fold itself.

A member folds the log in order up to its read position; with one coordination partition there is one order,
so the state after the first ``n`` records is the same for every reader (the fold is deterministic: same
records, same order, same state).  This fold applies each record once, at its append, to a copy of the state
before it (``copy_on_write.copy_before``: it shares what the record cannot change), and keeps the state after
each record as long as a member may still read up to exactly there (its read lag at most behind the newest).
A member that reads up to position ``n`` takes the state after ``n`` records as its own view, and its writes'
verdicts are those the fold gave them there: what its own fold would have given, without the 100th copy of
the work.  The states are never folded again once kept; members only query them.

With several coordination partitions a member's fold interleaves them in the order of its own reads, and some
of the state (the latest claim of each instance, which members ask) depends on that order; there every member
folds for itself (``Simulation.shared`` is None).
"""

from __future__ import annotations

import bisect
from collections import deque

from marshal_workers.protocol import codec
from marshal_workers.protocol.copy_on_write import copy_before
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.sim_log import Entry


class SharedFold:
    """The states after each record of a one-partition log that a member may still read up to."""

    def __init__(self, empty: WorldState, max_read_lag_s: float) -> None:
        self.head = empty  # the state after every record appended so far (the oracle's view)
        self.max_read_lag_s = max_read_lag_s
        self._kept: deque[tuple[int, WorldState]] = deque([(0, empty)])  # (position, the state there)
        self.appended: list[float] = []  # each record's append time (virtual seconds), in log order
        self._releases = [0]  # accepted releases among the first n records
        self._relearned_at = -1.0  # virtual seconds: the head's free_partitions index, last relearned
        self._relearn_every_s = 0.5

    def fold(self, entry: Entry, now: float) -> object:
        """Fold the record just appended; its verdict."""
        record = entry.record
        state = copy_before(self.head, record)
        verdict = state.apply(record, entry.at, entry.partition)
        self.head = state
        if now - self._relearned_at >= self._relearn_every_s:  # its copies, which members ask, inherit the bound
            self._relearned_at = now
            state.relearn_free_index(entry.at)
        position = entry.offset + 1
        self.appended.append(entry.appended)
        released = bool(verdict) and type(record) is codec.Release
        self._releases.append(self._releases[-1] + released)
        kept = self._kept
        kept.append((position, state))
        # A reader reads up to at least now - max lag: a state followed by a record appended by then is past.
        horizon = now - self.max_read_lag_s
        while len(kept) > 1 and self.appended[kept[1][0] - 1] <= horizon:
            kept.popleft()
        return verdict

    def position_at(self, start: int, until: float) -> int:
        """How many records a reader at ``start`` has read once it reads everything appended up to ``until``."""
        return max(start, bisect.bisect_right(self.appended, until, lo=start))

    def state_at(self, position: int) -> WorldState:
        """The state after the first ``position`` records."""
        base = self._kept[0][0]
        if position < base:  # a reader never lags more than the max read lag: a bug of the simulator if it does
            raise LookupError(f"the shared fold no longer keeps the state at {position} (it keeps from {base})")
        return self._kept[position - base][1]

    def releases_between(self, start: int, end: int) -> bool:
        """Was a release accepted among records ``start`` to ``end`` (excluded)?"""
        return self._releases[end] > self._releases[start]
