"""Bookkeeping of one partition's messages in flight inside a worker (docs/concurrency.md).

A worker with ``concurrency`` N runs up to N handler calls of one partition at
once.  :class:`Lanes` decides which fetched message may start next and what
the partition's progress is; it is pure: no threads, no clock (times are
arguments), no I/O.  The executor (a thread pool or an event loop) moves
events in and out::

    lanes.offer(offset, key)         a fetched message; False: the window is full, offer it again later
    lanes.skip(offset)               a fetched message a previous owner already did (done_set.Skipper)
    lanes.next_runnable(now)         the message to start next, if any may start
    lanes.start(offset)              it is handed to the executor
    lanes.finish(offset)             it is done (handled, or dead-lettered)
    lanes.defer(offset, until)       it failed and is retried at ``until``; other lanes keep going
    lanes.progress(), done_above()   what the heartbeat carries: ``offset`` and ``done``

Ordering (one value per handler):

* ``"key"``: two messages with the same key are never in flight together and
  start in offset order, a retry's backoff included (a deferred message keeps
  its key's lane); messages without a key are not ordered.
* ``"none"``: no order at all.
* ``"partition"``: one at a time, in offset order.

All three are one rule, "at most one message per lane in flight, a lane in
offset order", with a different lane per message: its key (none for a
keyless message) under "key", none under "none", one lane for all under
"partition".  Among the messages that may start, the lowest offset goes
first, so progress moves as early as it can.

The window: an offer is refused while ``offset - lowest unfinished >=
window``, so a stuck message holds the window (``progress()`` names it) and
never the process's memory.  Offsets that Kafka never delivers between two
fetched ones (compaction, transaction markers) and skipped ones count as done.

Memory, whatever the key distribution: every message held lies within the
window, so the offset map, the offset queue, the lanes' keys, the lanes'
queues and the deferred heap each hold at most ``window`` entries,
and the ready heap at most ``2 * window + 16`` (stale entries are dropped
lazily and compacted past that).  :attr:`Lanes.footprint` counts them all:
it never exceeds ``7 * window + 16``.  Message payloads and keys belong to
the caller; Lanes keeps a reference to the keys of held messages only.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from dataclasses import dataclass
from typing import Final

from marshal_workers.protocol import done_set


class Ordering(str, enum.Enum):
    KEY = "key"
    NONE = "none"
    PARTITION = "partition"


class Stage(enum.Enum):
    """Where an unfinished message is.  Done messages are not held at all."""

    WAITING = "waiting"  # behind an earlier message of its lane
    READY = "ready"  # may start when a slot is free
    RUNNING = "running"  # in the executor's hands: counts towards the concurrency
    DEFERRED = "deferred"  # failed; becomes ready again at its ``until`` (keeps its lane)


class LaneError(ValueError):
    """An illegal transition (starting a message that is not ready, finishing one not running, ...): a bug."""


_ONE_LANE: Final = b""  # the lane of every message under "partition" (no other key exists there)
_COMPACT_SLACK: Final = 16


@dataclass(slots=True)
class _Message:
    lane: bytes | None  # None: in no lane (a keyless message, or ordering "none")
    stage: Stage
    attempts: int = 0  # how many times it was started


class Lanes:
    """The in-flight bookkeeping of one partition, from ``start`` (the offset the worker resumes at)."""

    def __init__(self, start: int, concurrency: int, window: int, ordering: Ordering | str = Ordering.KEY) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not 1 <= window <= done_set.MAX_RUNS:
            # A larger window could need a done set too large for a heartbeat (see done_set).
            raise ValueError(f"window must be in [1, {done_set.MAX_RUNS}], got {window}")
        self.concurrency = concurrency
        self.window = window
        self.ordering = Ordering(ordering)
        self._next_fetch = start  # one past the furthest offset offered or skipped
        self._messages: dict[int, _Message] = {}  # every unfinished message
        self._order: deque[int] = deque()  # offered offsets in order; done ones are dropped from the left
        self._lanes: dict[bytes, deque[int]] = {}  # a lane's unfinished offsets; the head is its current one
        self._ready: list[int] = []  # heap of offsets; an entry whose message is no longer READY is stale
        self._deferred: list[tuple[float, int]] = []  # heap of (until, offset)
        self._running = 0

    # ------------------------------------------------------------- intake

    def offer(self, offset: int, key: bytes | None) -> bool:
        """Take a fetched message if the window allows; False: hold it and offer it again later."""
        if not self._admits(offset):
            return False
        lane = self._lane_of(key)
        stage = Stage.READY
        if lane is not None:
            queue = self._lanes.get(lane)
            if queue is None:
                self._lanes[lane] = deque((offset,))
            else:
                queue.append(offset)
                stage = Stage.WAITING
        self._messages[offset] = _Message(lane, stage)
        self._order.append(offset)
        self._next_fetch = offset + 1
        if stage is Stage.READY:
            self._push_ready(offset)
        return True

    def skip(self, offset: int) -> bool:
        """Count a fetched message as done without running it; False: outside the window, skip it later."""
        if not self._admits(offset):
            return False
        self._next_fetch = offset + 1  # nothing to hold: an offset between held ones is done
        return True

    def _admits(self, offset: int) -> bool:
        if offset < self._next_fetch:
            raise LaneError(f"offset {offset} was offered out of order (expected >= {self._next_fetch})")
        return not self._order or offset - self._order[0] < self.window

    def _lane_of(self, key: bytes | None) -> bytes | None:
        if self.ordering is Ordering.KEY:
            return key
        return _ONE_LANE if self.ordering is Ordering.PARTITION else None

    # ---------------------------------------------------------- scheduling

    def next_runnable(self, now: float) -> int | None:
        """The offset to start next (the lowest that may start), or None: all slots busy, or nothing ready."""
        self._wake_due(now)
        if self._running >= self.concurrency:
            return None
        ready = self._ready
        while ready:
            offset = ready[0]
            message = self._messages.get(offset)
            if message is not None and message.stage is Stage.READY:
                return offset
            heapq.heappop(ready)  # stale: started since, or done
        return None

    def next_due(self) -> float | None:
        """When the earliest deferred message becomes ready again (None: nothing is deferred)."""
        return self._deferred[0][0] if self._deferred else None

    def start(self, offset: int) -> None:
        """Hand a ready message to the executor."""
        message = self._expect(offset, Stage.READY, "start")
        if self._running >= self.concurrency:
            raise LaneError(f"cannot start offset {offset}: {self._running} of {self.concurrency} slots are busy")
        message.stage = Stage.RUNNING
        message.attempts += 1
        self._running += 1

    def finish(self, offset: int) -> None:
        """A running message is done: its lane moves on and progress may advance."""
        message = self._expect(offset, Stage.RUNNING, "finish")
        self._running -= 1
        del self._messages[offset]
        if message.lane is not None:
            self._advance_lane(message.lane)
        order = self._order
        while order and order[0] not in self._messages:
            order.popleft()

    def defer(self, offset: int, until: float) -> None:
        """A running message failed and will be retried at ``until``; it frees its slot but keeps its lane."""
        message = self._expect(offset, Stage.RUNNING, "defer")
        self._running -= 1
        message.stage = Stage.DEFERRED
        heapq.heappush(self._deferred, (until, offset))

    def _expect(self, offset: int, stage: Stage, action: str) -> _Message:
        message = self._messages.get(offset)
        found = "done or never offered" if message is None else message.stage.value
        if message is None or message.stage is not stage:
            raise LaneError(f"cannot {action} offset {offset}: it is {found}, not {stage.value}")
        return message

    def _advance_lane(self, lane: bytes) -> None:
        queue = self._lanes[lane]
        queue.popleft()  # the finished message was the lane's head
        if not queue:
            del self._lanes[lane]
            return
        head = queue[0]
        self._messages[head].stage = Stage.READY
        self._push_ready(head)

    def _wake_due(self, now: float) -> None:
        deferred = self._deferred
        while deferred and deferred[0][0] <= now:
            _, offset = heapq.heappop(deferred)
            self._messages[offset].stage = Stage.READY
            self._push_ready(offset)

    def _push_ready(self, offset: int) -> None:
        heapq.heappush(self._ready, offset)
        if len(self._ready) > 2 * len(self._messages) + _COMPACT_SLACK:
            # Drop stale entries (messages started out of heap order) so the heap stays within the window.
            self._ready = [o for o, m in self._messages.items() if m.stage is Stage.READY]
            heapq.heapify(self._ready)

    # ------------------------------------------------------------- reports

    def progress(self) -> int:
        """The lowest offset not done: where a next owner resumes (the heartbeat's ``offset``)."""
        return self._order[0] if self._order else self._next_fetch

    def done_above(self) -> list[int]:
        """The offsets done above progress, as done_set runs (the heartbeat's ``done``)."""
        if not self._order:
            return []
        progress = self._order[0]
        ranges: list[done_set.Range] = []
        previous = progress  # the last unfinished offset seen
        for offset in self._order:
            if offset in self._messages:
                if offset > previous + 1:
                    ranges.append((previous + 1, offset))
                previous = offset
        if self._next_fetch > previous + 1:
            ranges.append((previous + 1, self._next_fetch))
        return done_set.encode(progress, ranges)

    @property
    def in_flight(self) -> int:
        """Messages running now (at most ``concurrency``)."""
        return self._running

    @property
    def unfinished(self) -> int:
        """Messages offered and not done: waiting, ready, running or deferred."""
        return len(self._messages)

    @property
    def window_used(self) -> int:
        """Offsets from the lowest unfinished one to the furthest fetched one, both included (<= window)."""
        return self._next_fetch - self._order[0] if self._order else 0

    @property
    def footprint(self) -> int:
        """Entries held across all the bookkeeping (<= 7 * window + 16), for metrics and tests."""
        return (
            len(self._messages)
            + len(self._order)
            + len(self._lanes)
            + sum(len(queue) for queue in self._lanes.values())
            + len(self._ready)
            + len(self._deferred)
        )

    def stage(self, offset: int) -> Stage | None:
        """Where an offset is; None once it is done (or if it was never offered)."""
        message = self._messages.get(offset)
        return None if message is None else message.stage

    def attempts(self, offset: int) -> int:
        """How many times an unfinished message was started (its delivery count); 0 once done."""
        message = self._messages.get(offset)
        return 0 if message is None else message.attempts
