"""Group commit of the HTTP service's message records (docs/http-service.md, "Group commit").

Every read writes ``deliver_messages``, every ack ``ack_messages`` and every
cancel ``cancel_messages``.  Written one request at a time, each would wait
for a coordination write of its own (a produce, its delivery report and its
fold: milliseconds), and the server would spend its CPU on round trips.
Here writer threads keep a few writes in flight (the server: one): the
requests that arrive while every writer waits for its write's verdict queue,
and the next write carries all of them, one record per kind (as the
supervisor's at-most-once message claims share a ``message_claims`` record).
Each request learns the verdicts of its own entries when its write is
confirmed.  With two in flight, a request waits for about one write (its
own), not also for the rest of the one in flight when it came, but writes
are smaller (served_topic.WRITES_IN_FLIGHT says why the server keeps one).

Order: within a write the records go deliver, ack, cancel, to the one
coordination partition of the topic; writes are produced one after another
in the order their entries were queued (taking the queue and producing it is
one step under a lock), and the idempotent producer keeps that order in the
log.  So an entry is folded after every entry submitted before it, and a
hand-out submitted before an ack of it (the client acked what it was
answered) is folded first, whichever write is confirmed first.
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
# The coordinator's send: produce now (after everything sent before), and return the wait for the verdicts.
Send = Callable[[list[codec.Record]], Callable[[], list[Any]]]
Fields = Callable[[], dict[str, Any]]  # the common fields of a record written now


class GroupCommit:
    """Queues message entries and writes them in batches, ``in_flight`` writes in flight at a time (default one).

    More than one needs ``send`` (the write in two steps): each write is produced, under a lock, in the order its
    entries were queued, so the log folds them in that order whichever write is confirmed first; the next write
    need not wait for the one before to be confirmed, so a request waits for about one write, not two."""

    def __init__(self, write: Write, fields: Fields, topic: str, pending_ms: int, send: Send | None = None,
                 in_flight: int = 1) -> None:  # fmt: skip
        assert send is not None or in_flight == 1, "writes in flight together are produced in order by send"
        self._send: Send = send or (lambda records: lambda: write(records))
        self._in_flight = in_flight
        self._sending = threading.Lock()  # taking a batch and producing it: one writer at a time, in queue order
        self._fields = fields
        self._topic = topic
        self._pending_ms = pending_ms
        self._queue: list[_Queued] = []
        self._urgent = False  # a queued entry has a request waiting for its verdict
        self._wake = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.stats = WriteStats()

    def start(self) -> GroupCommit:
        for n in range(self._in_flight):
            name = "serve-group-commit" if n == 0 else f"serve-group-commit-{n + 1}"
            self._threads.append(threading.Thread(target=self._run, name=name, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)

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
            if self._closing and not any(thread.is_alive() for thread in self._threads):
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
            with self._sending:  # the other writers wait here: one takes the queue and produces at a time
                with self._wake:
                    while not self._queue and not self._closing:
                        self._wake.wait()
                    if not self._queue:
                        return  # closing, and nothing left to write
                    flush_at = time.monotonic() + LINGER_S
                    while not self._urgent and not self._closing and (left := flush_at - time.monotonic()) > 0:
                        self._wake.wait(left)  # only lingering entries: wait a moment for one somebody waits on
                    batch, self._queue, self._urgent = self._queue, [], False
                sent = self._produce(batch)
            if sent is not None:
                self._confirm(batch, *sent)

    def write_queued(self) -> None:
        """One write of everything queued now, on this thread: the writer thread's step (a GroupCommit not
        started is written by calling it)."""
        with self._sending:
            with self._wake:
                batch, self._queue, self._urgent = self._queue, [], False
            sent = self._produce(batch) if batch else None
        if sent is not None:
            self._confirm(batch, *sent)

    def _produce(self, batch: list[_Queued]) -> tuple[list[codec.Record], list[tuple[int, int]], Callable[[], list[Any]],
                                                     float] | None:  # fmt: skip
        """The batch's records, sent: (records, each request's span of verdicts, the wait, when); None if the
        send failed (every request of the batch has heard)."""
        records, spans = self._records(batch)
        started = time.monotonic()
        try:
            return records, spans, self._send(records), started
        except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
            self._fail(batch, exc)
            return None

    def _confirm(self, batch: list[_Queued], records: list[codec.Record], spans: list[tuple[int, int]],
                 wait: Callable[[], list[Any]], started: float) -> None:  # fmt: skip
        """Each request's verdicts once the write is confirmed (or the failure)."""
        try:
            verdicts = wait()
        except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
            self._fail(batch, exc)
            return
        took = time.monotonic() - started
        self._account(took, sum(len(q.entries) for q in batch))
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
