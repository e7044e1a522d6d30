"""What passes between a supervisor and one of its workers.

* A slot: a few int64 fields in shared memory.  The worker writes its
  progress (next offset, counts, the high watermark it sees); the
  supervisor writes the lease.  Single writer per field, so no lock.
* A pipe, for AMO: the worker sends the offset after the batch it wants to
  claim, the supervisor answers True (claimed: process it) or False (the
  partition is not ours: stop).  EOF on it means the supervisor is gone.
* Signals from the supervisor: SIGTERM asks the worker to finish the message
  or batch in hand and exit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

from marshal_workers.config import Settings

NOT_YET = -1  # a field that has no value yet


class Field(enum.IntEnum):
    NEXT_OFFSET = 0  # worker: the next offset to process (everything before it is done)
    LEASE_UNTIL_MS = 1  # supervisor: process nothing at or after this wall-clock time
    PROCESSED = 2  # worker: messages handled
    DEAD_LETTERED = 3  # worker: messages sent to the dead-letter topic
    HIGH_WATERMARK = 4  # worker: the partition's high watermark from its last fetch
    LAST_PROGRESS_MS = 5  # worker: wall-clock time of its last progress


class Slot:
    """Typed access to a worker's shared fields."""

    def __init__(self, array: Any) -> None:
        self.array = array  # the shared RawArray (what is passed to the worker)
        # The same memory as a memoryview: item access costs half of a ctypes array's, per message.
        self.fields = memoryview(array).cast("B").cast("q")

    @classmethod
    def create(cls, context: BaseContext, next_offset: int) -> Slot:
        array = context.RawArray("q", len(Field))  # type: ignore[attr-defined]
        slot = cls(array)
        for field in Field:
            array[field] = NOT_YET
        array[Field.NEXT_OFFSET] = next_offset
        array[Field.LEASE_UNTIL_MS] = 0
        array[Field.PROCESSED] = array[Field.DEAD_LETTERED] = 0
        return slot

    def get(self, field: Field) -> int:
        return int(self.fields[field])

    def set(self, field: Field, value: int) -> None:
        self.fields[field] = value


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to start; picklable, built in the supervisor."""

    app_path: str
    topic: str
    partition: int
    start_offset: int
    settings: Settings

    @property
    def group(self) -> str:
        return self.settings.require_group()
