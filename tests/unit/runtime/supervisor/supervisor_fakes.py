"""What the supervisor's components are built with in unit tests: no broker, no fork.

A coordinator whose world the test folds (records are built as a real member's), coordination writes recorded for
the test to decide (by folding them, as the log would, or by hand), offsets looked up from a dict, worker processes
that are plain objects the test makes exit, and a multiprocessing context that starts such objects, each with the
worker's end of a real pipe for the test to speak for it.
"""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.kafka.committed_offsets import OffsetLookupError
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.channel import Slot, WorkerSpec

HB_S = 1.0
NOW_S = 1_000.0  # the coordinator's clock (wall time) when a test starts


def settings(**overrides: Any) -> Settings:
    return Settings(**{"group": "g", "client_id": "c", "heartbeat_interval": HB_S, **overrides})


def new_slot(start: int) -> Slot:
    """A worker's shared memory, as the supervisor creates it (fork context: no server needed)."""
    return Slot.create(multiprocessing.get_context("fork"), start)


class FoldedCoordinator(Coordinator):
    """A Coordinator whose WorldState is folded by the test (``world``), on a clock the test moves (``now_s``)."""

    def __init__(self, config: Settings | None = None, instance: str = "i1") -> None:
        self.now_s = NOW_S
        super().__init__(config or settings(), instance=instance, clock=lambda: self.now_s)
        self.world = WorldState("g", round(HB_S * 1000))
        self.partition_count = 1
        self._release_events, self._release_events_writer = socket.socketpair()

    @property
    def me(self) -> MemberId:
        return MemberId(self.client, self.instance)

    def read(self, query: Callable[[WorldState], Any]) -> Any:
        return query(self.world)

    def release_events(self) -> socket.socket:
        return self._release_events

    def fold(self, *records: codec.Record) -> list[Any]:
        """Fold records as the log would, in order; their verdicts."""
        return [self.world.apply(record, record.ts) for record in records]

    def close(self) -> None:
        self._release_events.close()
        self._release_events_writer.close()


def record_of(who: MemberId, ts: int) -> dict[str, Any]:
    """The common fields of a record written by ``who`` at ``ts``."""
    return {"v": codec.VERSION, "ts": ts, "group": "g", "client": who.client, "instance": who.instance}


@dataclass
class Write:
    what: str
    records: list[codec.Record]
    on_verdicts: Callable[[list[Any]], None]
    on_failure: Callable[[Exception], None]
    options: dict[str, Any]

    @property
    def claims(self) -> list[tuple[str, int, int]]:
        """A message-claim write's (topic, partition, end offset) claims."""
        assert self.what == "message claim"
        return [(r.topic, e.partition, e.offset) for r in self.records for e in r.claims]  # type: ignore[attr-defined]


@dataclass
class RecordedWrites:
    """InFlightWrites' submit(), kept for the test to decide."""

    writes: list[Write] = field(default_factory=list)

    def submit(self, what: str, records: list[codec.Record], on_verdicts: Any, on_failure: Any, **options: Any) -> None:
        self.writes.append(Write(what, list(records), on_verdicts, on_failure, options))

    def of(self, what: str) -> list[Write]:
        return [w for w in self.writes if w.what == what]

    def fold_all(self, coordinator: FoldedCoordinator) -> None:
        """Decide every write in order as the log would: fold its records, give their verdicts."""
        while self.writes:
            write = self.writes.pop(0)
            write.on_verdicts(coordinator.fold(*write.records))


@dataclass
class FakeOffsets:
    """The group's committed offsets (None: never committed), auto_offset_reset's answer, and partitions' ends."""

    committed: dict[tuple[str, int], int | None] = field(default_factory=dict)
    reset_to: int = 0
    unknown: bool = False  # Kafka does not answer: every lookup fails
    commits: list[list[tuple[str, int, int]]] = field(default_factory=list)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)  # ListOffsets' latest; a partition not here: 0

    def committed_many(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        if self.unknown:
            raise OffsetLookupError("no broker answers")
        return {key: self.committed.get(key) for key in keys}

    def reset_offsets(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int | OffsetLookupError]:
        return dict.fromkeys(keys, self.reset_to)

    def commit(self, offsets: list[tuple[str, int, int]]) -> None:
        self.commits.append(list(offsets))

    def request_ends(self, topic: str, partitions: Sequence[int]) -> dict[Any, Future[Any]]:
        """ListOffsets answered at once: a future per partition, its result carrying ``offset``."""
        answers: dict[Any, Future[Any]] = {}
        for partition in partitions:
            answers[TopicPartition(topic, partition)] = future = Future()
            future.set_result(_Offset(self.ends.get((topic, partition), 0)))
        return answers

    def learn_start_offsets(self, topic: str, partitions: Sequence[int], starts: dict[int, int], log: Any) -> None:
        """Where shared partitions never leased start: the committed offset, else auto_offset_reset's."""
        for partition in partitions:
            committed = self.committed.get((topic, partition))
            starts[partition] = self.reset_to if committed is None else committed

    def poll(self) -> None:
        pass


@dataclass(frozen=True)
class _Offset:
    offset: int


class FakeProcess:
    """A worker process that is not one: the test says when it exits, and with what code."""

    def __init__(self, spec: Any, name: str, connection: Connection | None = None) -> None:
        self.spec = spec
        self.name = name
        self.connection = connection  # the worker's end of its pipe, for the test to speak for it
        self.sentinel = object()  # what the loop's wait would find readable when it exits
        self.exitcode: int | None = None
        self.pid = None  # never signalled: signal_process skips a process without a pid
        self.closed = False

    def start(self) -> None:
        pass

    def exit(self, code: int) -> None:
        """The worker exits with ``code``; its end of the pipe closes with it."""
        self.exitcode = code
        if self.connection is not None:
            self.connection.close()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self) -> None:
        assert self.exitcode is not None, "joined a worker that is still running"

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeStarter:
    """WorkerPool's start_process: records each start, and hands out the worker's end of a real pipe."""

    started: list[FakeProcess] = field(default_factory=list)
    pipes: list[Connection] = field(default_factory=list)

    def __call__(self, spec: WorkerSpec, slot: Slot, rate_bucket: Any, name: str) -> tuple[Any, Connection]:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        process = FakeProcess(spec, name)
        self.started.append(process)
        self.pipes.append(theirs)
        return process, ours


class _WorkersEnd:
    """The worker's end of a pipe as the parent holds it: the parent closes it once the child has its copy; here
    the test is the child, so that close leaves it open."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def close(self) -> None:
        pass


@dataclass
class FakeContext:
    """A multiprocessing context whose processes are FakeProcess (SharedPool's fork server): real pipes and real
    shared memory, no fork.  ``started``: every process, in order; the test closes their pipes (close_all)."""

    started: list[FakeProcess] = field(default_factory=list)
    _pipes: list[Connection] = field(default_factory=list)

    def Pipe(self, duplex: bool = True) -> tuple[Connection, _WorkersEnd]:
        ours, theirs = multiprocessing.Pipe(duplex=duplex)
        self._pipes += [ours, theirs]
        return ours, _WorkersEnd(theirs)

    def RawArray(self, typecode: str, size: int) -> Any:
        return multiprocessing.get_context("fork").RawArray(typecode, size)

    def Process(self, target: Any, args: tuple[Any, ...], name: str, daemon: bool) -> FakeProcess:
        spec, theirs = args[0], args[1]
        process = FakeProcess(spec, name, theirs.connection)
        self.started.append(process)
        return process

    def close_all(self) -> None:
        for connection in self._pipes:
            connection.close()
