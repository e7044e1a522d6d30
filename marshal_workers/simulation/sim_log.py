"""The simulated coordination log: ordered partitions, writes that take a while, the broker's record time.

A write is encoded with the real codec (``codec.encode``), routed as a member routes it (md5 of the topic), and
appended after a latency drawn from the run's seeded random source; its record time is the broker's
LogAppendTime: the virtual clock at the append.  Each partition's records are in append order, and one
writer's records to one partition stay in the order written (as a Kafka producer keeps them).  Every reader
folds ``Entry.record``, decoded once from the bytes by the real codec (``codec.decode``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from marshal_workers.protocol import codec
from marshal_workers.simulation.clock import VirtualClock

EPOCH_MS = 1_764_000_000_000  # record times are ms since the epoch; a simulation starts here


@dataclass
class SimWrite:
    """Records one member submitted together, and the verdicts its own fold gives them (None: not yet)."""

    writer: object  # the member instance that wrote them
    records: list[codec.Record]
    deadline: float  # virtual seconds: not confirmed by then, it failed
    verdicts: list[object | None] = field(default_factory=list)
    # With the fleet's shared fold (shared_fold.py): where each record landed and the verdict the fold gave it
    # there, which its writer learns once it has read past it.
    positions: list[int | None] = field(default_factory=list)
    folded: list[object | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.verdicts = [None] * len(self.records)
        self.positions = [None] * len(self.records)
        self.folded = [None] * len(self.records)

    def read_up_to(self, position: int) -> None:
        """Its writer has read the log's first ``position`` records: the verdicts of those of ours are known."""
        for index, landed in enumerate(self.positions):
            if landed is not None and landed < position and self.verdicts[index] is None:
                self.verdicts[index] = self.folded[index]

    @property
    def decided(self) -> bool:
        return all(v is not None for v in self.verdicts)


@dataclass(slots=True)
class Entry:
    """One record in the log."""

    partition: int
    offset: int
    value: bytes
    record: codec.Record
    at: int  # record time (LogAppendTime), ms since the epoch
    appended: float  # virtual seconds
    origin: SimWrite | None  # the write it belongs to, for its writer's verdict
    index: int  # its place in that write


@dataclass(frozen=True)
class Latency:
    """Write latency: ``base`` plus an exponential tail of mean ``mean_extra`` (seconds)."""

    base: float = 0.002
    mean_extra: float = 0.003

    def draw(self, rng: random.Random) -> float:
        return self.base + rng.expovariate(1 / self.mean_extra) if self.mean_extra > 0 else self.base


class SimulatedLog:
    """The coordination topic: ``partitions`` ordered logs, written through ``submit``."""

    def __init__(
        self,
        partitions: int,
        clock: VirtualClock,
        rng: random.Random,
        latency: Latency,
        on_append: Callable[[Entry], None],
    ) -> None:
        self.partitions: list[list[Entry]] = [[] for _ in range(partitions)]
        self.clock = clock
        self.rng = rng
        self.latency = latency
        self._on_append = on_append
        self._last_append: dict[tuple[int, int], float] = {}  # (writer id, partition) -> its latest append time
        self.records = 0
        self.bytes = 0
        self._stalled_until = [0.0] * partitions  # virtual seconds: nothing is appended to a stalled partition

    def stall(self, partition: int, until: float) -> None:
        """Nothing is appended to ``partition`` before ``until``: what arrives waits, in order (stall-log)."""
        self._stalled_until[partition] = max(self._stalled_until[partition], until)

    def submit(self, writer_id: int, write: SimWrite, lost: bool, partitions: list[int] | None = None) -> None:
        """Send a write's records; each is appended after its latency, unless the writer's writes are ``lost``.
        ``partitions``: where each record goes (a checkpoint, a record about no topic); default: by its topic."""
        now = self.clock.now
        for index, record in enumerate(write.records):
            value = codec.encode(record)
            if partitions is not None:
                partition = partitions[index]
            else:
                partition = codec.coordination_partition(record.topic, len(self.partitions))  # type: ignore[union-attr]
            if lost:
                continue
            key = (writer_id, partition)
            when = max(now + self.latency.draw(self.rng), self._last_append.get(key, 0.0))
            self._last_append[key] = when
            self.clock.at(when, functools.partial(self._append, partition, value, write, index))

    def _append(self, partition: int, value: bytes, write: SimWrite, index: int) -> None:
        clock = self.clock
        stalled_until = self._stalled_until[partition]
        if clock.now < stalled_until:  # appended when the stall ends, after what arrived before it (ties: in order)
            clock.at(stalled_until, lambda: self._append(partition, value, write, index))
            return
        log = self.partitions[partition]
        entry = Entry(partition, len(log), value, codec.decode(value), EPOCH_MS + clock.now_ms, clock.now, write, index)
        log.append(entry)
        self.records += 1
        self.bytes += len(value)
        self._on_append(entry)

    def values(self) -> list[tuple[int, bytes, int]]:
        """Every record as (partition, value, record time), partition by partition: to time the real fold."""
        return [(e.partition, e.value, e.at) for log in self.partitions for e in log]
