"""Group commit of the HTTP service's message records (docs/http-service.md, "Group commit").

Every read writes ``deliver_messages``, every ack ``ack_messages`` and every
cancel ``cancel_messages``.  Written one request at a time, each would wait
for a coordination write of its own (a produce, its delivery report and its
fold: a round trip to the broker), and the server would spend its CPU on
round trips.  Here one write is in flight at a time: the requests that
arrive while it waits for its verdict queue, and the next write carries all
of them, one record per kind (as the supervisor's at-most-once message
claims share a ``message_claims`` record).  Each request learns the verdicts
of its own entries when its write is confirmed.  (Two writes in flight were
tried twice and measured: smaller writes, more CPU per message, no faster
acks on the embedded broker; docs/http-service.md, "Group commit".)

It all runs on the event loop that serves the requests: a write is produced
from the loop (a produce never blocks), and the loop learns of its verdict
from the coordinator's ``own_folds`` socket, which the delivery report's
thread wakes once it has folded the record.  No thread of its own: under
load the loop's thread holds the GIL nearly all the time, and every other
Python thread a verdict passed through had to wait for it (each such hand-
over measured 0.1 to 0.5 ms; docs/http-service.md).

Order: within a write the records go deliver, ack, cancel, to the one
coordination partition of the topic; writes go one after another in the
order their entries were queued, and the idempotent producer keeps that
order in the log.  So an entry is folded after every entry submitted before
it, and a hand-out submitted before an ack of it (the client acked what it
was answered) is folded first.
"""

from __future__ import annotations

import asyncio
import bisect
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.kafka.coordination_reader import drain
from marshal_workers.kafka.coordination_writer import PendingWrite
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import per_entry

MessageRecord = codec.DeliverMessages | codec.AckMessages | codec.CancelMessages
MAX_ENTRIES_PER_RECORD = 4096  # a record stays far below Kafka's message size limit
# Entries nobody waits on (hand-outs answered already) wait this long for a write somebody waits on. Short against
# any lease (a third of the pending timeout is left when a message is handed out) and against the 1 s another
# server gives its view of the log before it calls a message never handed out.
LINGER_S = 0.005


class Kind(Enum):
    """What a request writes, in the order a write carries them."""

    DELIVER = 0
    ACK = 1
    CANCEL = 2


class Writes(Protocol):
    """What the group commit needs of the coordinator (Coordinator has it): produce records without waiting,
    their verdicts once in (None: not yet; CoordinationWriteError: failed or past the write's deadline), and a
    socket readable whenever a verdict may have come."""

    def submit(self, records: Sequence[codec.Record]) -> PendingWrite: ...

    def collect(self, pending: PendingWrite) -> list[Any] | None: ...

    def own_folds(self) -> socket.socket: ...


Fields = Callable[[], dict[str, Any]]  # the common fields of a record written now


@dataclass
class _Queued:
    kind: Kind
    entries: list[codec.MessageEntry]
    done: asyncio.Future[list[bool]]


@dataclass
class _InFlight:
    pending: PendingWrite
    batch: list[_Queued]
    records: list[MessageRecord]
    spans: list[tuple[int, int]]  # per queued request, where its verdicts lie among the records' entries
    started: float
    deadline: asyncio.TimerHandle


# Upper bounds (seconds) of the write latency histogram in /metrics: fine below 10 ms, where a healthy write lies.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass
class WriteStats:
    """For /metrics: writes confirmed, the entries they carried, writes failed, and the confirmed writes' latency
    (submitted to verdicts known): its sum and a count per bucket of LATENCY_BUCKETS (not cumulative; the last
    one counts those above every bound)."""

    writes: int = 0
    entries: int = 0
    failed: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))


class GroupCommit:
    """Queues message entries and writes them in batches, one write in flight at a time, on ``loop``.

    Every method is called on the loop's thread (the request handlers' and /metrics')."""

    def __init__(
        self, writes: Writes, fields: Fields, topic: str, pending_ms: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._writes = writes
        self._fields = fields
        self._topic = topic
        self._pending_ms = pending_ms
        self._loop = loop
        self._queue: list[_Queued] = []
        self._urgent = False  # a queued entry has a request waiting for its verdict
        self._in_flight: _InFlight | None = None
        self._next_write: asyncio.Handle | None = None  # a write of the queue is scheduled: soon, or after the linger
        self._lingering = False  # that write waits for the linger
        self._folds: socket.socket | None = None  # watched by the loop while a write is in flight
        self._closing = False
        self._idle = asyncio.Event()  # nothing queued or in flight (close() waits for it)
        self._idle.set()
        self.stats = WriteStats()

    def submit(
        self, kind: Kind, entries: Sequence[codec.MessageEntry], linger: bool = False
    ) -> asyncio.Future[list[bool]]:
        """Queue ``entries`` for the next write: the future gives one verdict per entry once the write is confirmed,
        or the write's exception (CoordinationWriteError: not confirmed in time).

        ``linger``: nobody waits for these verdicts (hand-outs answered already): they wait up to LINGER_S for a
        write someone waits for (an ack's, typically of the same messages) to go with, instead of a write of their
        own."""
        done: asyncio.Future[list[bool]] = self._loop.create_future()
        if not entries:
            done.set_result([])
            return done
        if self._closing and self._idle.is_set():
            raise RuntimeError("the group commit is closed: nothing more is written")
        self._queue.append(_Queued(kind, list(entries), done))
        self._idle.clear()
        if not linger:
            self._urgent = True
        self._schedule()
        return done

    async def close(self) -> None:
        """Write what is queued (lingering entries at once), wait for the verdicts, then take no more."""
        self._closing = True
        self._schedule()
        await self._idle.wait()
        self._stop_watching()

    def snapshot(self) -> WriteStats:
        """A copy of the statistics (for /metrics)."""
        stats = self.stats
        return WriteStats(stats.writes, stats.entries, stats.failed, stats.seconds, list(stats.buckets))

    # ------------------------------------------------------------------ writing

    def _schedule(self) -> None:
        """The next write, if one is due: at the end of this pass of the loop when somebody waits (every request
        the pass handles goes with it), after LINGER_S when only hand-outs wait; never while one is in flight."""
        if self._in_flight is not None or not self._queue:
            return
        if self._urgent or self._closing:
            if self._next_write is not None and self._lingering:
                self._next_write.cancel()  # somebody waits now: no more lingering
                self._next_write = None
            if self._next_write is None:
                self._next_write, self._lingering = self._loop.call_soon(self._write_queued), False
        elif self._next_write is None:
            self._next_write, self._lingering = self._loop.call_later(LINGER_S, self._write_queued), True

    def _write_queued(self) -> None:
        """One write of everything queued now."""
        if self._next_write is not None:
            self._next_write.cancel()  # called at once (a write was decided): not again later
            self._next_write = None
        if self._in_flight is not None or not self._queue:
            return
        batch, self._queue, self._urgent = self._queue, [], False
        records, spans = self._records(batch)
        started = time.monotonic()
        try:
            pending = self._writes.submit(records)
        except CoordinationWriteError as exc:  # refused at once (the producer failed): every request hears it
            self._next()
            self._failed(batch, exc)
            return
        self._watch()
        # collect() raises past the write's deadline: look once then, should no report ever come.
        deadline = self._loop.call_later(max(0.0, pending.deadline - started) + 0.001, self._verdicts_in)
        self._in_flight = _InFlight(pending, batch, records, spans, started, deadline)

    def _verdicts_in(self) -> None:
        """The own_folds socket woke (or the deadline came): hand out the in-flight write's verdicts if they are
        all in."""
        if self._folds is not None:
            drain(self._folds)
        flight = self._in_flight
        if flight is None:
            return
        try:
            verdicts = self._writes.collect(flight.pending)
        except CoordinationWriteError as exc:
            self._in_flight = None
            flight.deadline.cancel()
            self._next()
            self._failed(flight.batch, exc)
            return
        if verdicts is None:
            return
        self._in_flight = None
        flight.deadline.cancel()
        self._account(time.monotonic() - flight.started, sum(len(q.entries) for q in flight.batch))
        # The next write first, then the answers: what queued meanwhile waited a whole write already, and an answer
        # set here wakes its request only in the loop's next pass, after a write scheduled for "soon" would have to
        # wait behind every one of them (a pass of 20 answers is 2 ms at 64 clients).
        self._next()
        flat: list[bool] = []
        for record, verdict in zip(flight.records, verdicts):
            flat += per_entry(verdict, len(record.messages))
        for queued, (start, end) in zip(flight.batch, flight.spans):
            if not queued.done.done():
                queued.done.set_result(flat[start:end])

    def _next(self) -> None:
        """A write is decided: the next one now if somebody waits in the queue, lingering if only hand-outs do,
        else idle."""
        if not self._queue:
            self._idle.set()
        elif self._urgent or self._closing:
            self._write_queued()
        else:
            self._schedule()

    def _failed(self, batch: list[_Queued], exc: Exception) -> None:
        self.stats.failed += 1
        for queued in batch:
            if not queued.done.done():
                queued.done.set_exception(exc)

    def _watch(self) -> None:
        if self._folds is None:
            self._folds = self._writes.own_folds()
            self._loop.add_reader(self._folds, self._verdicts_in)

    def _stop_watching(self) -> None:
        if self._folds is not None:
            self._loop.remove_reader(self._folds)
            self._folds = None

    def _records(self, batch: list[_Queued]) -> tuple[list[MessageRecord], list[tuple[int, int]]]:
        """The records of one write (deliver, ack, cancel; at most MAX_ENTRIES_PER_RECORD entries each) and, per
        queued request, where its verdicts lie among the records' entries, in order."""
        fields = self._fields()
        records: list[MessageRecord] = []
        spans: dict[int, tuple[int, int]] = {}
        position = 0
        for kind in Kind:
            entries: list[codec.MessageEntry] = []
            for index, queued in enumerate(batch):
                if queued.kind is kind:
                    spans[index] = (position + len(entries), position + len(entries) + len(queued.entries))
                    entries += queued.entries
            for start in range(0, len(entries), MAX_ENTRIES_PER_RECORD):
                chunk = tuple(entries[start : start + MAX_ENTRIES_PER_RECORD])
                records.append(self._record(kind, fields, chunk))
            position += len(entries)
        return records, [spans[index] for index in range(len(batch))]

    def _record(self, kind: Kind, fields: dict[str, Any], entries: tuple[codec.MessageEntry, ...]) -> MessageRecord:
        if kind is Kind.DELIVER:
            return codec.DeliverMessages(**fields, topic=self._topic, pending_ms=self._pending_ms, messages=entries)
        if kind is Kind.ACK:
            return codec.AckMessages(**fields, topic=self._topic, messages=entries)
        return codec.CancelMessages(**fields, topic=self._topic, messages=entries)

    def _account(self, took: float, entries: int) -> None:
        self.stats.writes += 1
        self.stats.entries += entries
        self.stats.seconds += took
        self.stats.buckets[bisect.bisect_left(LATENCY_BUCKETS, took)] += 1
