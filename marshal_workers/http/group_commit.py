"""Group commit of the HTTP service's message records (docs/http-service.md, "Group commit").

Every read writes ``deliver_messages``, every ack ``ack_messages`` and every
cancel ``cancel_messages``.  Written one request at a time, each would wait
for a coordination write of its own (a produce, its delivery report and its
fold: milliseconds), and the server would spend its CPU on round trips.
Here a writer thread keeps one write in flight: the requests that arrive
while it waits for its write's verdict queue, and the next write carries all
of them, one record per kind (as the supervisor's at-most-once message claims
share a ``message_claims`` record).  Each request learns the verdicts of its
own entries when its write is confirmed.  (Two writes in flight were tried
twice and measured: smaller writes, more CPU per message, no faster acks on
the embedded broker; docs/http-service.md, "Group commit".)

Order: within a write the records go deliver, ack, cancel, to the one
coordination partition of the topic; writes go one after another in the
order their entries were queued, and the idempotent producer keeps that
order in the log.  So an entry is folded after every entry submitted before
it, and a hand-out submitted before an ack of it (the client acked what it
was answered) is folded first.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import per_entry

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


@dataclass
class _Queued:
    kind: Kind
    entries: list[codec.MessageEntry]
    done: Future[list[bool]]
    linger: bool = False


# Upper bounds (seconds) of the write latency histogram in /metrics: fine below 10 ms, where a healthy write lies.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


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


Write = Callable[[list[codec.Record]], list[Any]]  # the coordinator's write: the records' verdicts, or raises
Fields = Callable[[], dict[str, Any]]  # the common fields of a record written now


class GroupCommit:
    """Queues message entries and writes them in batches, one write in flight at a time, from its own thread."""

    def __init__(self, write: Write, fields: Fields, topic: str, pending_ms: int) -> None:
        self._write = write
        self._writing = threading.Lock()  # one write at a time: the thread's, or write_queued's
        self._fields = fields
        self._topic = topic
        self._pending_ms = pending_ms
        self._queue: list[_Queued] = []
        self._urgent = False  # a queued entry has a request waiting for its verdict
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="serve-group-commit", daemon=True)
        self.stats = WriteStats()

    def start(self) -> GroupCommit:
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        if self._thread.ident is not None:  # started (a GroupCommit never started is written by write_queued)
            self._thread.join(timeout)

    def submit(self, kind: Kind, entries: Sequence[codec.MessageEntry], linger: bool = False) -> Future[list[bool]]:
        """Queue ``entries`` for the next write: the future gives one verdict per entry once the write is confirmed,
        or the write's exception (CoordinationWriteError: not confirmed in time).

        ``linger``: nobody waits for these verdicts (hand-outs answered already): they wait up to LINGER_S for a
        write someone waits for (an ack's, typically of the same messages) to go with, instead of a write of their
        own."""
        done: Future[list[bool]] = Future()
        if not entries:
            done.set_result([])
            return done
        with self._wake:
            if self._closing and not self._thread.is_alive():
                raise RuntimeError("the group commit is closed: nothing more is written")
            # The writer is woken only when that changes what it does: an entry into an empty queue (it waits for
            # one), the first one somebody waits on (it may be lingering). Not for every entry: each wake-up costs
            # the event loop's thread a hand-over of the GIL.
            wake = not self._queue or (not linger and not self._urgent)
            self._queue.append(_Queued(kind, list(entries), done, linger))
            if not linger:
                self._urgent = True
            if wake:
                self._wake.notify()
        return done

    def snapshot(self) -> WriteStats:
        """A copy of the statistics (for /metrics)."""
        with self._wake:
            return WriteStats(self.stats.writes, self.stats.entries, self.stats.failed, self.stats.seconds,
                              list(self.stats.buckets))  # fmt: skip

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return  # closing, and nothing left to write
                flush_at = time.monotonic() + LINGER_S
                while not self._urgent and not self._closing and (left := flush_at - time.monotonic()) > 0:
                    self._wake.wait(left)  # only lingering entries: wait a moment for one somebody waits on
            self.write_queued()

    def write_queued(self) -> None:
        """One write of everything queued now, on this thread: the writer thread's step (a GroupCommit not
        started is written by calling it)."""
        with self._writing:
            with self._wake:
                batch, self._queue, self._urgent = self._queue, [], False
            if batch:
                self._write_batch(batch)

    def _write_batch(self, batch: list[_Queued]) -> None:
        """The batch's records, written: each request's verdicts once the write is confirmed (or the failure)."""
        records, spans = self._records(batch)
        started = time.monotonic()
        try:
            verdicts = self._write(records)
        except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
            self._fail(batch, exc)
            return
        self._account(time.monotonic() - started, sum(len(q.entries) for q in batch))
        flat: list[bool] = []
        for record, verdict in zip(records, verdicts):
            flat += per_entry(verdict, len(record.messages))  # type: ignore[attr-defined]
        for queued, (start, end) in zip(batch, spans):
            queued.done.set_result(flat[start:end])

    def _fail(self, batch: list[_Queued], exc: Exception) -> None:
        with self._wake:
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
        with self._wake:
            self.stats.writes += 1
            self.stats.entries += entries
            self.stats.seconds += took
            self.stats.buckets[bisect.bisect_left(LATENCY_BUCKETS, took)] += 1
