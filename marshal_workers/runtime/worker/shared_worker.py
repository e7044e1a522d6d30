"""A shared worker: one process that handles the ranges of offsets its supervisor leased for it.

Shared handlers (``@app.handler(topic, shared=True)``, docs/shared-partitions.md)
are not tied to a partition: the supervisor leases ranges ``[start, end)`` of
any partition of the topic in the coordination log and hands them to its
shared workers through their pipes, two at a time, so the next range is
leased while the current one is handled.  A worker reads its ranges from
Kafka itself (payloads never cross the supervisor), handles each message,
and reports the range settled: which offsets failed (to be delivered again,
at least once) and which went to the dead-letter topic.

A worker never handles a message once its lease's deadline has passed (the
supervisor moves the deadline on as it renews the lease): past it, another
worker may hold the range.  Before it gives a range up at the deadline, it
reads the renewals waiting on its pipe (it reads the pipe between fetches, and
a slow handler's fetch may outlast the deadline its range began with).

What passes on the pipe (runtime/messages.py):

supervisor to worker
    :class:`~marshal_workers.runtime.messages.RangeLeased`: handle ``[start, end)`` before ``deadline_ms``
    (monotonic, see channel.monotonic_ms); its messages were delivered ``tries`` times.
    ``Renewed``: the lease now lasts until ``deadline_ms``.
    ``Stop``: finish the range in hand, give the others back, exit.
worker to supervisor
    ``Started``: handling that range now.
    ``RangeProgress``: how far the range in hand is done: every ``PROGRESS_EVERY_S`` at most, and at once when an
    offset failed or was dead-lettered (so the supervisor knows them before the worker's position passes them).
    Between those, the worker stores its position after each message in its ``RangeSlot`` (shared memory):
    if it dies, the supervisor settles the range from there, so a crash repeats only the message in hand.
    ``Settled``: done with ``[start, end)`` (``end`` is short of the lease's when a stop found nothing more to
    read), with its failed and dead-lettered offsets; ``high`` is the partition's end as its fetches saw it
    (or None).
    ``Abandoned``: its deadline passed first; it was left alone from there.
    ``Returned``: never started (a stop): the supervisor cancels it.
    ``Outcomes``: what became of failed handler calls (for the metrics).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import setproctitle
from confluent_kafka import KafkaError, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import ContextLog, group_log, partition_log
from marshal_workers.errors import SendError
from marshal_workers.handlers.app import App, FetchedMessage, HandlerSpec
from marshal_workers.handlers.blocking_calls import blocking
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.message_age import OnTooOld, is_too_old, too_old_error
from marshal_workers.handlers.rate_limits import Throttle
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import RECORD_ERROR, RECORD_HEADERS
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.protocol.dead_letter_groups import OtherGroups
from marshal_workers.protocol.worker_supply import PROGRESS_EVERY_S
from marshal_workers.runtime.channel import RangeSlot, monotonic_ms
from marshal_workers.runtime.messages import (
    Abandoned,
    FromSharedWorker,
    Outcomes,
    RangeLeased,
    RangeProgress,
    Renewed,
    Returned,
    Settled,
    Started,
    Stop,
    ToSharedWorker,
)
from marshal_workers.runtime.worker.alarm import Alarm
from marshal_workers.runtime.worker.process import (
    REAL_EDGES,
    ProcessEdges,
    exit_process,
    finish_worker,
    send_failed,
    take_up_handler,
)
from marshal_workers.runtime.worker.shared_failures import InRange, SharedFailures
from marshal_workers.runtime.worker.stack_dumps import worker_heading

_log = logging.getLogger(__name__)

_FETCH_MOST = 500
_IDLE_WAIT_S = 0.5
# PROGRESS_EVERY_S (protocol/worker_supply.py): how often at most a worker reports its progress inside a range on the
# pipe (and flushes what its handler sent, so its position may move on); the supervisor writes it to the log at the
# same cadence.


@dataclass(frozen=True)
class SharedWorkerSpec:
    """Everything a shared worker needs to start; picklable, built in the supervisor."""

    app_path: str
    topic: str
    index: int  # this worker's number among the topic's shared workers of its supervisor
    settings: Settings


@dataclass
class WorkerRange:
    """A range its pool gave this worker (a RangeLeased message; the lease is the pool's PoolLease), as the worker
    handles it: its deadline, and what became of its messages."""

    partition: int
    start: int
    end: int
    deadline_ms: int
    tries: int
    failed: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    handled: int = 0
    busy_ms: float = 0.0  # fetches that returned messages of it, and its handler calls (range_sizing.py)
    reported: tuple[int, int, int] = (-1, 0, 0)  # (upto, failed, dead) of the last RangeProgress sent


class _SupervisorGone(Exception):
    pass


def shared_worker_main(
    spec: SharedWorkerSpec, connection: Connection, rate_bucket: Any = None, range_slot: Any = None
) -> None:
    """Entry point in the worker process (the target of the fork server's Process).  ``rate_bucket``: the
    handler's shared token bucket (rate_limits.py), if it has a rate_limit; ``range_slot``: the shared array of
    its channel.RangeSlot."""
    exit_process(SharedWorker(spec, connection, rate_bucket, range_slot).run())


class SharedWorker:
    def __init__(
        self,
        spec: SharedWorkerSpec,
        connection: Connection,
        rate_bucket: Any = None,
        range_slot: Any = None,
        edges: ProcessEdges = REAL_EDGES,
    ) -> None:
        self.spec = spec
        self._edges = edges
        self.slot = RangeSlot(range_slot) if range_slot is not None else None  # our position in the range in hand
        self._next_progress_ms = 0
        self.rate_bucket = rate_bucket
        self.throttle: Throttle | None = None  # the handler's rate_limit, if any
        self.max_age_ms = 0  # the handler's max_age, 0: none
        self.connection = connection
        self.log = group_log(_log, spec.settings.require_group())
        self.stopping = False
        self.ranges: collections.deque[WorkerRange] = collections.deque()
        self._consumer: GuardedConsumer | None = None
        self._position: tuple[int, int] | None = None  # (partition, next offset) the consumer reads from
        self._dlq = edges.dead_letters(spec.settings)
        self._other_groups = OtherGroups(spec.settings.require_group(), RECORD_HEADERS)  # redriven for another group
        self.outbox = Outbox(spec.settings)  # app.send's producer: flushed before a range is reported settled
        self.outcomes = OutcomeCounts()  # failed calls, retries, ignored and rejected messages: for the metrics
        self._failures = SharedFailures(self._dlq, self.outcomes, self._log_of, lambda: self.stopping)
        self.in_hand: tuple[int, int] | None = None  # (partition, start) of the range being handled, for SIGUSR2
        self._plain = False  # no rate or age limit: fetches of plain messages take the hot path (_handle_plain)
        self._alarm: Alarm | None = None  # raised near the deadline of the range in hand (started in run)

    def run(self) -> WorkerExit:
        self._edges.start(self.spec.settings, self._stack_dump_heading, self._request_stop)
        setproctitle.setproctitle(
            f"marshal-workers: shared worker {self.spec.settings.group} {self.spec.topic} #{self.spec.index}"
        )
        app: App | None = None
        try:
            app = self._edges.load(self.spec.app_path)
            taken = take_up_handler(app, self.spec.topic, self.outbox, self.rate_bucket, self.spec.settings)
            handler, self.throttle, self.max_age_ms = blocking(taken.handler), taken.throttle, taken.max_age_ms
            self._plain = self.throttle is None and not self.max_age_ms
            self._failures.take_up(handler, app.hooks)
            for hook in app.worker_start_hooks:
                hook()
        except Exception:
            self.log.exception("shared worker for %s cannot start", self.spec.topic)
            return WorkerExit.BOOT_ERROR
        try:
            settings = self.spec.settings
            self._consumer = self._edges.consumer(
                client_profiles.shared_consumer(settings),
                f"shared worker of {settings.require_group()} {self.spec.topic}",
                settings.heartbeat_interval,
            )
            self._consumer.read_without_gaps_if_the_broker_skips(settings.connect_timeout)
            self._alarm = Alarm()
            return self._loop(handler)
        except _SupervisorGone:
            return WorkerExit.SUPERVISOR_GONE
        except SendError as exc:
            return send_failed(self.log, exc)
        finally:
            self._finish(app)

    def _stack_dump_heading(self) -> str:
        at = self.in_hand  # read once: the main thread may move on meanwhile
        range_text = f"shared worker #{self.spec.index}, " + ("between ranges" if at is None else f"range from {at[1]}")
        return worker_heading(
            os.getpid(), self.spec.settings.require_group(), self.spec.topic, None if at is None else at[0], range_text
        )

    def _request_stop(self) -> None:
        self.stopping = True

    def _finish(self, app: App | None) -> None:
        try:
            self._send_outcomes()
        except _SupervisorGone:
            pass
        finish_worker(app, self.log, self._dlq, self._consumer, self.outbox)

    def _send_outcomes(self) -> None:
        counts = self.outcomes.take()
        if counts is not None:
            self._send(Outcomes(counts))

    # ------------------------------------------------------------------ loop

    def _loop(self, handler: HandlerSpec) -> WorkerExit:
        while True:
            if not self.ranges and self._position is not None and not self.stopping:
                self._read_pipe(wait=_IDLE_WAIT_S)  # the next range usually comes now, often where we stand
                if not self.ranges and self._consumer is not None:
                    self._consumer.unassign()  # idle: stop fetching
                    self._position = None
            if not self.stopping:  # stopping: no wait for ranges that will not come
                self._read_pipe(wait=0 if self.ranges else _IDLE_WAIT_S)
            if self.stopping:
                # A stop waits for the range in hand (_handle_range finishes it); the rest was never begun.
                for leased in self.ranges:
                    self._send(Returned(leased.partition, leased.start, leased.end))
                return WorkerExit.STOPPED
            if self.ranges:
                self.in_hand = (self.ranges[0].partition, self.ranges[0].start)
                self._handle_range(handler, self.ranges[0])
                self.ranges.popleft()
                self.in_hand = None

    def _read_pipe(self, wait: float) -> None:
        try:
            ready = self.connection.poll(wait)
            while ready:
                self._on_message(self.connection.recv())
                ready = self.connection.poll(0)
        except (EOFError, OSError):
            raise _SupervisorGone() from None

    def _on_message(self, message: ToSharedWorker) -> None:
        if isinstance(message, RangeLeased):
            self.ranges.append(
                WorkerRange(message.partition, message.start, message.end, message.deadline_ms, message.tries)
            )
        elif isinstance(message, Renewed):
            for leased in self.ranges:
                if leased.partition == message.partition and leased.start == message.start:
                    leased.deadline_ms = max(leased.deadline_ms, message.deadline_ms)
                    if self.in_hand == (leased.partition, leased.start) and self._alarm is not None:
                        self._arm(leased)
        elif isinstance(message, Stop):
            self.stopping = True

    def _send(self, message: FromSharedWorker) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, OSError):
            raise _SupervisorGone() from None

    # ---------------------------------------------------------------- ranges

    def _handle_range(self, handler: HandlerSpec, leased: WorkerRange) -> None:
        """Handle every message of ``leased`` while its lease holds, then report it settled (or abandoned)."""
        assert self._consumer is not None
        self._send(Started(leased.partition, leased.start))
        if self.slot is not None:
            self.slot.begin(leased.partition, leased.start)
        self._next_progress_ms = monotonic_ms() + round(PROGRESS_EVERY_S * 1000)
        setproctitle.setproctitle(
            f"marshal-workers: shared worker {self.spec.settings.group} "
            f"{self.spec.topic}[{leased.partition}] @{leased.start}"
        )
        if self._position != (leased.partition, leased.start):
            self._consumer.assign([TopicPartition(self.spec.topic, leased.partition, leased.start)])
        self._position = (leased.partition, leased.start)
        next_offset: int | None = leased.start
        end_seen: int | None = None  # the partition's end when the last fetch reached it
        assert self._alarm is not None
        self._arm(leased)  # raised near the deadline or the next progress report: till then no clock per message
        plain = self._plain and leased.tries < handler.max_deliveries
        records: list[Any] = []
        errors: list[Any] = []
        while next_offset is not None and next_offset < leased.end:
            if self._ran_out(leased):
                return self._abandon(leased, next_offset)
            if (self.stopping or len(self.ranges) > 1) and self._at_end(leased.partition, next_offset, end_seen):
                # Read to the partition's end inside the lease: don't wait there for messages while a stop or
                # another range waits.
                return self._leave_at_the_end(leased, next_offset)
            fetched_at = time.perf_counter()
            records = self._consumer.consume(min(leased.end - next_offset, _FETCH_MOST), 0.1)
            self._read_pipe(wait=0)  # renewals (and a stop, which waits for this range to end)
            # The errors in C (map, any, all: a KafkaError is true; never list.count(None) or ``None in``, which
            # compare an error with None, and that raises), not a Python loop: a fetch seldom has one.
            errors = list(map(RECORD_ERROR, records))
            if plain and records and not any(errors) and not self._other_groups.offsets(records):
                next_offset = self._handle_plain(handler, leased, records, next_offset)
            else:
                next_offset, end_seen = self._handle_records(handler, leased, records, next_offset, end_seen)
            if not all(errors):  # a message among them
                # Busy with messages, not waiting for them: the rate the pool sizes ranges by (a poll that timed out
                # at the partition's end says nothing about the handler).
                leased.busy_ms += (time.perf_counter() - fetched_at) * 1000
        if next_offset is not None:
            self._settle(leased, leased.end)
            if records and records[-1].offset() + (errors[-1] is None) > leased.end:
                # Offsets without a message (transaction markers, compaction) let the last fetch, counted in
                # messages, read past the range: the consumer stands beyond its end, so the next range seeks even
                # if it starts there (it used to read on, never saw those messages, and its lease ran out).
                self._position = None
        return None

    def _handle_plain(
        self, handler: HandlerSpec, leased: WorkerRange, records: list[Any], next_offset: int
    ) -> int | None:
        """The hot path, for a fetch of messages only (no error, none redriven for another group) of a handler with
        no rate or age limit, in a range delivered fewer than max_deliveries times: per message a check of a flag
        (the alarm: the lease's deadline or the next progress report is near), the call, a count and the position
        in the slot (once what the handler sent is flushed).  A failure takes the general path for that
        message (retries, dead letters).  The next offset to read, or None if the lease ran out (abandoned)."""
        assert self._alarm is not None
        function, wrap, due, end, outbox = handler.function, FetchedMessage, self._alarm.due, leased.end, self.outbox
        topic, partition = self.spec.topic, leased.partition
        # The slot's position, stored in place (RangeSlot.advance without its call: ~50 ns a message).
        fields, upto = (self.slot.fields, RangeSlot.UPTO) if self.slot is not None else (None, 0)
        handled = 0
        try:
            for record in records:
                offset = record.offset()
                if offset < next_offset:
                    continue
                if offset >= end:
                    return end
                if due[0]:  # the lease's deadline or the next progress report is near: look at the clock
                    if self._ran_out(leased):
                        self._abandon(leased, offset)
                        return None
                    if monotonic_ms() >= self._next_progress_ms:
                        self._report_progress(leased, next_offset)
                        self._arm(leased)
                try:
                    function(wrap(record, 1, topic, partition, offset, record.value()))
                except Exception as exc:  # noqa: BLE001 - a handler is user code: any error goes to the retry policy
                    error = exc
                else:
                    handled += 1
                    next_offset = offset + 1
                    if fields is not None and not outbox.pending:  # what it sent is in Kafka: it counts as done
                        fields[upto] = next_offset
                    continue
                # Outside the except clause: a retry's error must not chain to this one (each traceback its own).
                self._handle_message(handler, leased, record, error)
                next_offset = offset + 1
                self._progressed(leased, next_offset)  # a failure or dead letter goes on the pipe at once
            return next_offset
        finally:
            leased.handled += handled

    def _handle_records(
        self, handler: HandlerSpec, leased: WorkerRange, records: list[Any], next_offset: int, end_seen: int | None
    ) -> tuple[int | None, int | None]:
        """A fetch with an error (the partition's end, markers), messages redriven for another group, a rate or age
        limit, or a range delivered max_deliveries times.  The next offset to read (None if the range was reported
        already: the lease ran out, or a stop came while waiting for the rate limit) and the partition's end seen."""
        not_ours = self._other_groups.offsets(records)  # one partition: the range's
        for record in records:
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self.log.warning("%s[%d]: fetch error: %s", self.spec.topic, leased.partition, error)
                elif record.offset() >= leased.end:
                    next_offset = leased.end  # the offsets left hold no message (transaction markers)
                else:
                    end_seen = record.offset()
                continue
            offset = record.offset()
            if offset < next_offset:
                continue
            if offset >= leased.end:
                next_offset = leased.end
                break
            if not_ours and offset in not_ours:  # redriven for another group: done here without a call
                self.outcomes.other_group += 1
                leased.handled += 1
                next_offset = offset + 1
                self._progressed(leased, next_offset)
                continue
            if self.max_age_ms and is_too_old(record.timestamp(), int(time.time() * 1000), self.max_age_ms):
                self._too_old(handler, leased, record)
                next_offset = offset + 1
                self._progressed(leased, next_offset)
                continue
            if (
                self.throttle is not None
                and not self.throttle.acquire(1, lambda: self._still_waiting(leased))
                and self.stopping
            ):
                # Asked to stop while waiting for the rate limit: settle what was handled, give the rest back.
                self._leave_at_the_end(leased, offset)
                return None, end_seen
            if self._ran_out(leased):
                self._abandon(leased, offset)
                return None, end_seen
            self._handle_message(handler, leased, record)
            next_offset = offset + 1
            self._progressed(leased, next_offset)
        return next_offset, end_seen

    def _ran_out(self, leased: WorkerRange) -> bool:
        """Whether ``leased``'s deadline has passed, renewals included: past the deadline it knows, the worker reads
        its pipe first.  The pipe is read between fetches, and a fetch's messages are handled without reading it
        (up to _FETCH_MOST of them: seconds of a slow handler's work, longer than a short lease), so a renewal its
        supervisor confirmed in time may be waiting there; without it the worker abandoned a lease its supervisor
        held, and the offsets handled since the last progress record were handled again."""
        if monotonic_ms() < leased.deadline_ms:
            return False
        self._read_pipe(wait=0)  # Renewed moves leased.deadline_ms on (and re-arms the alarm)
        return monotonic_ms() >= leased.deadline_ms

    def _arm(self, leased: WorkerRange) -> None:
        """Raise the alarm near the lease's deadline or the next progress report, whichever comes first."""
        assert self._alarm is not None
        self._alarm.set(min(leased.deadline_ms, self._next_progress_ms) / 1000)

    def _progressed(self, leased: WorkerRange, upto: int) -> None:
        """Done with every offset of ``leased`` below ``upto`` (but its failed and dead ones): say so.  A failure or
        a dead letter goes on the pipe at once, before the slot moves past it; otherwise the slot moves on after
        each message (once what the handler sent is flushed, at least once: at the next report), and the pipe
        hears of it every PROGRESS_EVERY_S."""
        if (len(leased.failed), len(leased.dead)) != leased.reported[1:] or monotonic_ms() >= self._next_progress_ms:
            self._report_progress(leased, upto)
        elif self.slot is not None and not self.outbox.pending:
            self.slot.advance(upto)

    def _report_progress(self, leased: WorkerRange, upto: int) -> None:
        self.outbox.flush()  # what the calls sent (app.send) is in Kafka before their messages count as done
        self._next_progress_ms = monotonic_ms() + round(PROGRESS_EVERY_S * 1000)
        if (upto, len(leased.failed), len(leased.dead)) != leased.reported:
            self._send(RangeProgress(leased.partition, leased.start, upto, tuple(leased.failed), tuple(leased.dead)))
            leased.reported = (upto, len(leased.failed), len(leased.dead))
        if self.slot is not None:
            self.slot.advance(upto)

    def _settle(self, leased: WorkerRange, end: int) -> None:
        """Report ``[leased.start, end)`` handled (the lease's offsets from ``end`` on go back untried)."""
        assert self._consumer is not None
        self._position = (leased.partition, end)
        high = self._consumer.fetched_end(self.spec.topic, leased.partition)
        self.outbox.flush()  # what the range's calls sent (app.send), before it is reported handled
        self._send_outcomes()
        self._send(
            Settled(
                leased.partition,
                leased.start,
                end,
                tuple(leased.failed),
                tuple(leased.dead),
                leased.handled,
                None if high < 0 else high,
                round(leased.busy_ms, 3),
            )
        )

    def _at_end(self, partition: int, next_offset: int, end_seen: int | None) -> bool:
        """Read to the partition's end: its end-of-partition event said so in this range, or the end the last fetch
        response carried does.  (A range that starts where the last one ended may never get the event: the
        consumer, not re-assigned, reported that end already, in the range before.)"""
        if end_seen is not None and end_seen <= next_offset:
            return True
        assert self._consumer is not None
        return 0 <= self._consumer.fetched_end(self.spec.topic, partition) <= next_offset

    def _leave_at_the_end(self, leased: WorkerRange, next_offset: int) -> None:
        """The partition read to its end inside the lease: settle what was handled and give the rest back, rather
        than wait for messages that may not come before the shutdown timeout, or hold up the next range."""
        if next_offset > leased.start:
            self._settle(leased, next_offset)
        else:
            self._position = None
            self._send(Returned(leased.partition, leased.start, leased.end))

    def _abandon(self, leased: WorkerRange, offset: int) -> None:
        self.log.warning(
            "%s[%d]: the lease on %d..%d ran out at offset %d (is the supervisor stopped?): leaving the rest",
            self.spec.topic,
            leased.partition,
            leased.start,
            leased.end - 1,
            offset,
        )
        self._position = None
        self._send(Abandoned(leased.partition, leased.start, leased.end))

    def _still_waiting(self, leased: WorkerRange) -> bool:
        """While waiting for a token: renewals and a stop read, and the lease still holds."""
        self._read_pipe(wait=0)
        return not self.stopping and monotonic_ms() < leased.deadline_ms

    def _too_old(self, handler: HandlerSpec, leased: WorkerRange, record: Any) -> None:
        """A message past max_age: not handled but skipped (handled, as far as the lease is concerned) or
        dead-lettered (on_too_old="dlq"); counted either way."""
        self.outcomes.too_old += 1
        if handler.on_too_old is OnTooOld.DLQ:
            error = too_old_error(record.timestamp(), int(time.time() * 1000), self.max_age_ms)
            self._note(leased, record, self._failures.dead_letter(handler, record, error, leased.tries + 1))
        else:
            leased.handled += 1

    def _handle_message(
        self, handler: HandlerSpec, leased: WorkerRange, record: Any, error: Exception | None = None
    ) -> None:
        """Call the handler, retrying by its policy (shared_failures.py), and note what became of the message."""
        self._note(leased, record, self._failures.handle(handler, record, leased.tries, leased.deadline_ms, error))

    @staticmethod
    def _note(leased: WorkerRange, record: Any, fate: InRange) -> None:
        if fate is InRange.HANDLED:
            leased.handled += 1
        elif fate is InRange.FAILED:
            leased.failed.append(record.offset())
        else:
            leased.dead.append(record.offset())

    def _log_of(self, record: Any) -> ContextLog:
        """The log for lines about ``record``: they carry its topic and partition besides the group."""
        return partition_log(_log, self.spec.settings.require_group(), record.topic(), record.partition())
