"""What passes between a supervisor and one of its workers.

* A slot: a few int64 fields in shared memory.  The worker writes its
  progress (next offset, counts, the high watermark it sees); the
  supervisor writes the lease.  Single writer per field, so no lock.
* A pipe, for AMO: the worker sends the offset after the batch it wants to
  claim, the supervisor answers a ClaimAnswer (member/at_most_once.py; as messages.ClaimMessages and
  messages.ClaimVerdict; the worker's outcome counts go the same way).  EOF
  on it means the supervisor is gone.
* A stop request: the supervisor sets the slot's STOP_REQUESTED, then sends
  SIGTERM.  The signal interrupts a worker at once; the flag covers a worker
  forked just before the request, which inherits the fork server's ignored
  SIGTERM until it installs its handler (it reads the flag right after).
"""

from __future__ import annotations

import enum
import time
from array import array
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.observe.latency import LATENCY_BOUNDS
from marshal_workers.protocol.done_set import MAX_RUNS, Range, Runs, above, decode, encode

NOT_YET = -1  # a field that has no value yet


def monotonic_ms() -> int:
    """The clock of the times in a slot.  CLOCK_MONOTONIC is one clock for every process of a host, so
    the supervisor and its workers agree on it, and a wall-clock step cannot stretch a lease."""
    return int(time.monotonic() * 1000)


class Field(enum.IntEnum):
    NEXT_OFFSET = 0  # worker: the next offset to process (everything before it is done)
    LEASE_UNTIL_MS = 1  # supervisor: process nothing at or after this time (monotonic_ms)
    PROCESSED = 2  # worker: messages handled
    DEAD_LETTERED = 3  # worker: messages sent to the dead-letter topic
    HIGH_WATERMARK = 4  # worker: the partition's high watermark from its last fetch
    # The timed call in progress: with a time limit, a batch handler, or on concurrent lanes (their oldest call):
    CALL_STARTED_MS = 5  # worker: start of the handler call in progress (monotonic_ms); 0 between calls
    CALL_END_OFFSET = 6  # worker: the offset after the message(s) of that call
    LATENCY_SUM_NS = 7  # worker (metrics on): total time spent in handler calls
    STOP_REQUESTED = 8  # supervisor: 1 = finish the message or batch in hand and exit (SIGTERM follows)
    CALL_FIRST_OFFSET = 9  # worker: the first offset of the tracked call (with CALL_STARTED_MS)
    IN_FLIGHT = 10  # worker: handler calls running now (concurrency > 1)
    WINDOW_USED = 11  # worker: offsets from the lowest unfinished message to the furthest fetched one
    # worker, one message per call (not on lanes): the offset after the message in hand, stored just before its
    # call (one store, no clock: the supervisor notes when it first sees it); a call runs while it is above
    # NEXT_OFFSET.  Its retries, and with at most once the rest of its claimed batch, keep it there.
    HANDLING_END = 12
    FETCH_STALLS = (
        13  # worker: times the broker answered its fetches without records while behind (guarded_consumer.py)
    )


# Handler latency histogram (metrics on): after the Field entries, one count per bound of LATENCY_BOUNDS and
# one for +Inf, each the number of handler calls that took at most that long (not cumulative).
LATENCY_FIRST_BUCKET = len(Field)
# The done set (done_set runs) behind a sequence lock, after the histogram: the worker writes it now and
# then, the supervisor reads it for heartbeats, releases and restarts.  [sequence, offset, length, runs...]
_DONE_SEQUENCE = LATENCY_FIRST_BUCKET + len(LATENCY_BOUNDS) + 1
_DONE_OFFSET = _DONE_SEQUENCE + 1
_DONE_LENGTH = _DONE_SEQUENCE + 2
_DONE_RUNS = _DONE_SEQUENCE + 3
SLOT_SIZE = _DONE_RUNS + MAX_RUNS
_READ_TRIES = 100


class Slot:
    """Typed access to a worker's shared fields."""

    def __init__(self, array: Any) -> None:
        self.array = array  # the shared RawArray (what is passed to the worker)
        # The same memory as a memoryview: item access costs half of a ctypes array's, per message.
        self.fields = memoryview(array).cast("B").cast("q")

    @classmethod
    def create(cls, context: BaseContext, next_offset: int) -> Slot:
        array = context.RawArray("q", SLOT_SIZE)  # zeroed
        slot = cls(array)
        array[Field.NEXT_OFFSET] = next_offset
        array[Field.HIGH_WATERMARK] = NOT_YET
        return slot

    def get(self, field: Field) -> int:
        return int(self.fields[field])

    def set(self, field: Field, value: int) -> None:
        self.fields[field] = value

    def publish_done(self, offset: int, runs: list[int]) -> None:
        """The worker's position: every offset below ``offset`` is done, and ``runs`` above it (done_set).

        A sequence lock: odd while writing, so a reader never takes half of one write and half of another.
        """
        fields = self.fields
        fields[_DONE_SEQUENCE] += 1
        fields[_DONE_OFFSET] = offset
        fields[_DONE_LENGTH] = len(runs)
        fields[_DONE_RUNS : _DONE_RUNS + len(runs)] = memoryview(array("q", runs))
        fields[_DONE_SEQUENCE] += 1

    def read_done(self) -> tuple[int, Runs] | None:
        """The last published (offset, runs), or None if never published (or a write never finished)."""
        fields = self.fields
        for _ in range(_READ_TRIES):
            sequence = fields[_DONE_SEQUENCE]
            if sequence % 2:
                continue
            offset, length = fields[_DONE_OFFSET], fields[_DONE_LENGTH]
            runs = tuple(fields[_DONE_RUNS : _DONE_RUNS + min(max(length, 0), MAX_RUNS)].tolist())
            if fields[_DONE_SEQUENCE] == sequence:
                return (offset, runs) if sequence else None
        return None  # a writer killed mid-write: what it wrote is not to be trusted

    def position(self) -> tuple[int, list[int]]:
        """(offset, done runs) for a heartbeat or release: the worker's next offset, with the done set above it.

        NEXT_OFFSET and the done set are written at different moments; both only move forward, so the
        higher offset is true and the done ranges above it are true too.
        """
        offset = self.get(Field.NEXT_OFFSET)
        published = self.read_done()
        if published is None:
            return offset, []
        published_offset, runs = published
        offset = max(offset, published_offset)
        return offset, encode(offset, above(decode(published_offset, runs), offset))

    def latency_counts(self) -> list[int]:
        """Handler calls per latency bucket (LATENCY_BOUNDS, then +Inf); not cumulative."""
        return self.fields[LATENCY_FIRST_BUCKET:_DONE_SEQUENCE].tolist()


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to start; picklable, built in the supervisor."""

    app_path: str
    topic: str
    partition: int
    start_offset: int
    settings: Settings
    # Messages [start, end) whose handler call the hard time limit killed more often than its retries
    # allow: the worker applies on_error to them without calling the handler again.
    give_up_on: tuple[int, int] | None = None
    give_up_reason: str = "time_limit"  # or "worker_lost": its worker died on them crash_limit times in a row
    # Offsets at or above start_offset that are done already (a previous owner handled them out of order).
    skip: tuple[Range, ...] = ()

    @property
    def group(self) -> str:
        return self.settings.require_group()


class RangeSlot:
    """A shared worker's position inside the range in hand, in shared memory (docs/shared-partitions.md).

    The worker stores, after each message it is done with, the offset up to which every offset of the range is
    done (but the failed and dead-lettered ones, which it reports on the pipe before it stores past them); its
    supervisor reads it when the worker died, so a crash repeats only the message in hand, and at its progress
    cadence, for the ``progress_ranges`` it writes.  One writer (the worker); a sequence lock around a new range, so
    a reader never takes one range's start with another's offset.
    """

    _SEQUENCE, _PARTITION, _START, UPTO = range(4)  # UPTO: a hot loop stores ``fields[UPTO] = upto`` itself

    def __init__(self, array: Any) -> None:
        self.array = array  # the shared RawArray (what is passed to the worker)
        self.fields = memoryview(array).cast("B").cast("q")

    @classmethod
    def create(cls, context: BaseContext) -> RangeSlot:
        return cls(context.RawArray("q", 4))  # zeroed: sequence 0, nothing stored

    def begin(self, partition: int, start: int) -> None:
        """A new range in hand: nothing of it done yet."""
        fields = self.fields
        fields[self._SEQUENCE] += 1
        fields[self._PARTITION] = partition
        fields[self._START] = start
        fields[self.UPTO] = start
        fields[self._SEQUENCE] += 1

    def advance(self, upto: int) -> None:
        """Everything of the range in hand below ``upto`` is done (but what the pipe said failed or dead)."""
        self.fields[self.UPTO] = upto

    def read(self) -> tuple[int, int, int] | None:
        """(partition, start, upto) of the range in hand, or None if none was begun (or a write never finished)."""
        fields = self.fields
        for _ in range(_READ_TRIES):
            sequence = fields[self._SEQUENCE]
            if sequence % 2:
                continue
            found = (fields[self._PARTITION], fields[self._START], fields[self.UPTO])
            if fields[self._SEQUENCE] == sequence:
                return found if sequence else None
        return None
