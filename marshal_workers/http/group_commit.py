"""Group commit of the HTTP service's message records (docs/http-service.md, "Group commit").

Every read writes ``deliver_messages``, every ack ``ack_messages`` and every
cancel ``cancel_messages``.  Written one request at a time, each would wait
for a coordination write of its own (a produce, its delivery report and its
fold: milliseconds), and the server would spend its CPU on round trips.
Here the requests that arrive while a write is in flight queue, and the next
write carries all of them, one record per kind (as the supervisor's
at-most-once message claims share a ``message_claims`` record).  Each request
learns the verdicts of its own entries when its write is confirmed.

It all runs on the event loop's thread, with no thread of its own: a write is
produced from the loop (librdkafka sends it from its own threads), and the
loop learns its verdicts by watching the coordinator's ``own_folds`` socket,
which the delivery reports' thread makes readable once our records are folded.
So a verdict reaches the waiting request in one wake-up of the loop, where a
writer thread cost a wake-up of that thread (and its fight for the GIL with
the loop) and then a hand-over to the loop, per write.

Order: within a write the records go deliver, ack, cancel, to the one
coordination partition of the topic; writes are produced in the order their
entries were queued (one thread produces), and the idempotent producer keeps
that order in the log.  So an entry is folded after every entry submitted
before it, and a hand-out submitted before an ack of it (the client acked
what it was answered) is folded first, whichever write is confirmed first.
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

from marshal_workers.kafka.coordination_log import drain
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import per_entry

MAX_ENTRIES_PER_RECORD = 4096  # a record stays far below Kafka's message size limit
# Entries nobody waits on (hand-outs answered already) wait this long for a write somebody waits on. Short against
# any lease (a third of the pending timeout is left when a message is handed out) and against the 1 s another
# server gives its view of the log before it calls a message never handed out.
LINGER_S = 0.005
# Past its write timeout a write is failed even if no wake-up came: this long after it, the deadline is looked at.
DEADLINE_SLACK_S = 0.05


class Kind(Enum):
    """What a request writes, in the order a write carries them."""

    DELIVER = 0
    ACK = 1
    CANCEL = 2


@dataclass
class _Queued:
    kind: Kind
    entries: list[codec.MessageEntry]
    done: asyncio.Future[list[bool]]


# Upper bounds (seconds) of the write latency histogram in /metrics: fine below 10 ms, where a healthy write lies.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


@dataclass
class WriteStats:
    """For /metrics: writes confirmed, the entries they carried, writes failed, and the confirmed writes' latency
    (produced to verdicts known): its sum and a count per bucket of LATENCY_BUCKETS (not cumulative; the last
    one counts those above every bound)."""

    writes: int = 0
    entries: int = 0
    failed: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))


class Writes(Protocol):
    """What the group commit needs of the coordinator (kafka/coordinator.py's Coordinator has it)."""

    def submit(self, records: Sequence[codec.Record]) -> Any:
        """Produce ``records`` now, after everything produced before; a handle for collect()."""

    def collect(self, pending: Any) -> list[Any] | None:
        """The records' verdicts once every one is folded, else None (no wait); raises CoordinationWriteError
        once the write failed or its timeout passed."""

    def own_folds(self) -> socket.socket:
        """Readable when a record we wrote was folded or a delivery report came: time to collect()."""


Fields = Callable[[], dict[str, Any]]  # the common fields of a record written now


@dataclass
class _Write:
    """A write in flight: what it carries, where each request's verdicts lie among its records' entries."""

    batch: list[_Queued]
    records: list[codec.Record]
    spans: list[tuple[int, int]]
    pending: Any
    started: float
    deadline: asyncio.TimerHandle | None = None


class GroupCommit:
    """Queues message entries and writes them in batches, ``in_flight`` writes at a time (default one).

    Every method runs on ``loop``'s thread.  More than one write in flight: the next write is produced while the
    one before is unconfirmed (a request waits for about one write, not two), still in queue order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, writes: Writes, fields: Fields, topic: str, pending_ms: int,
                 write_timeout_s: float, in_flight: int = 1, linger_s: float = LINGER_S) -> None:  # fmt: skip
        self._loop = loop
        self._writes = writes
        self._fields = fields
        self._topic = topic
        self._pending_ms = pending_ms
        self._write_timeout_s = write_timeout_s
        self._in_flight = in_flight
        self._linger_s = linger_s
        self._queue: list[_Queued] = []
        self._urgent = False  # a queued entry has a request waiting for its verdict
        self._linger_until = 0.0  # loop time: the lingering entries queued go by then at the latest
        self._flying: list[_Write] = []
        self._flush_soon: asyncio.Handle | None = None  # a write at the end of this pass of the loop
        self._linger_timer: asyncio.TimerHandle | None = None
        self._folds: socket.socket | None = None
        self._closing = False
        self._idle = asyncio.Event()
        self.stats = WriteStats()

    def start(self) -> GroupCommit:
        self._folds = self._writes.own_folds()
        self._loop.add_reader(self._folds, self._on_folds)
        return self

    async def close(self, timeout: float) -> bool:
        """Write what is queued, wait (up to ``timeout``) for every write's verdicts, then stop: True if all came."""
        self._closing = True
        self._schedule()
        self._idle.clear()
        if self._queue or self._flying:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                pass
        if self._folds is not None:
            self._loop.remove_reader(self._folds)
        return not (self._queue or self._flying)

    def submit(self, kind: Kind, entries: Sequence[codec.MessageEntry], linger: bool = False) -> asyncio.Future[list[bool]]:
        """Queue ``entries`` for the next write: the future gives one verdict per entry once the write is confirmed,
        or the write's exception (CoordinationWriteError: not confirmed in time).

        ``linger``: nobody waits for these verdicts (hand-outs answered already): they wait up to the linger time
        for a write someone waits for (an ack's, typically of the same messages) to go with, instead of a write
        of their own."""
        done: asyncio.Future[list[bool]] = self._loop.create_future()
        if not entries:
            done.set_result([])
            return done
        if self._closing:
            raise RuntimeError("the group commit is closed: nothing more is written")
        if not self._queue:
            self._linger_until = self._loop.time() + self._linger_s
        self._queue.append(_Queued(kind, list(entries), done))
        if not linger:
            self._urgent = True
        self._schedule()
        return done

    def snapshot(self) -> WriteStats:
        """A copy of the statistics (for /metrics)."""
        stats = self.stats
        return WriteStats(stats.writes, stats.entries, stats.failed, stats.seconds, list(stats.buckets))

    # ------------------------------------------------------------ writing

    def _schedule(self) -> None:
        """Write the queue when that is due: at the end of this pass of the loop (every request that came in it
        goes along) when somebody waits, else when the linger time is up; never past the writes allowed in flight
        (a write confirmed calls this again)."""
        if not self._queue or len(self._flying) >= self._in_flight:
            if self._closing and not self._queue and not self._flying:
                self._idle.set()
            return
        if self._urgent or self._closing or self._loop.time() >= self._linger_until:
            if self._flush_soon is None:
                self._flush_soon = self._loop.call_soon(self._flush)
        elif self._linger_timer is None:
            self._linger_timer = self._loop.call_at(self._linger_until, self._linger_over)

    def _linger_over(self) -> None:
        self._linger_timer = None
        self._schedule()

    def _flush(self) -> None:
        """One write of everything queued."""
        self._flush_soon = None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._queue or len(self._flying) >= self._in_flight:
            return
        batch, self._queue, self._urgent = self._queue, [], False
        records, spans = self._records(batch)
        started = time.monotonic()
        try:
            pending = self._writes.submit(records)
        except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
            self._fail(batch, exc)
            self._schedule()
            return
        write = _Write(batch, records, spans, pending, started)
        write.deadline = self._loop.call_later(self._write_timeout_s + DEADLINE_SLACK_S, self._past_deadline, write)
        self._flying.append(write)

    def _on_folds(self) -> None:
        assert self._folds is not None
        drain(self._folds)
        self._collect()

    def _past_deadline(self, write: _Write) -> None:
        write.deadline = None
        if write in self._flying:
            self._collect()
            if write in self._flying:  # not judged yet (a coordinator's own deadline a little later): look again
                write.deadline = self._loop.call_later(DEADLINE_SLACK_S, self._past_deadline, write)

    def _collect(self) -> None:
        """Answer the requests of every write whose verdicts are in (or that failed), then write what queued."""
        for write in list(self._flying):
            try:
                verdicts = self._writes.collect(write.pending)
            except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
                self._landed(write)
                self._fail(write.batch, exc)
                continue
            if verdicts is not None:
                self._landed(write)
                self._confirm(write, verdicts)
        self._schedule()

    def _landed(self, write: _Write) -> None:
        self._flying.remove(write)
        if write.deadline is not None:
            write.deadline.cancel()

    def _confirm(self, write: _Write, verdicts: list[Any]) -> None:
        """Each request's verdicts."""
        self._account(time.monotonic() - write.started, sum(len(q.entries) for q in write.batch))
        flat: list[bool] = []
        for record, verdict in zip(write.records, verdicts):
            flat += per_entry(verdict, len(record.messages))  # type: ignore[attr-defined]
        for queued, (start, end) in zip(write.batch, write.spans):
            if not queued.done.done():
                queued.done.set_result(flat[start:end])

    def _fail(self, batch: list[_Queued], exc: Exception) -> None:
        self.stats.failed += 1
        for queued in batch:
            if not queued.done.done():
                queued.done.set_exception(exc)

    def _records(self, batch: list[_Queued]) -> tuple[list[codec.Record], list[tuple[int, int]]]:
        """The records of one write (deliver, ack, cancel; at most MAX_ENTRIES_PER_RECORD entries each) and, per
        queued request, where its verdicts lie among the records' entries, in order."""
        fields = self._fields()
        records: list[codec.Record] = []
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

    def _record(self, kind: Kind, fields: dict[str, Any], entries: tuple[codec.MessageEntry, ...]) -> codec.Record:
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
