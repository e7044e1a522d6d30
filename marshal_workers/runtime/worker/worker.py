"""A worker: one process, one partition, the application's handler.

Forked by the fork server with the application preloaded.  It owns its Kafka
consumer (assigned to its partition, never a group member), checks the lease
before each message or batch, and reports progress through its slot.  It
never writes to the coordination topic: AMO claims go through the supervisor.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

import setproctitle
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import ContextLog, configure_logging, partition_log
from marshal_workers.errors import SendError, TimeLimitExceeded, WorkerLost
from marshal_workers.handlers.app import App, HandlerSpec, Message, Mode, OnError, effective_time_limits
from marshal_workers.handlers.failure_logs import apart_from, log_dead_letter, log_ignored, log_release, log_retry
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.hooks import Hooks, run_hooks
from marshal_workers.handlers.loader import load_app
from marshal_workers.handlers.message_age import OnTooOld, is_too_old, split_by_age, too_old_error
from marshal_workers.handlers.rate_limits import Throttle
from marshal_workers.handlers.retry_policy import Action, next_step
from marshal_workers.kafka.dead_letters import DeadLetterWriter, error_headers
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import client_config
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.protocol.dead_letter_groups import OtherGroups
from marshal_workers.runtime.channel import ClaimAnswer, Field, Slot, WorkerSpec
from marshal_workers.runtime.messages import ClaimMessages, ClaimVerdict, Outcomes
from marshal_workers.runtime.worker.alarm import Alarm
from marshal_workers.runtime.worker.instrumentation import Instruments, instrument
from marshal_workers.runtime.worker.lane_runner import LaneRunner
from marshal_workers.runtime.worker.stack_dumps import dump_stacks_on_sigusr2, worker_heading

_log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_HOUSEKEEPING_INTERVAL_S = 0.5
_LEASE_POLL_S = 0.01
_LATENCY_SAMPLE_INTERVAL_S = 0.1  # metrics on: how often a fetch's handler calls are timed


_ERROR_OF = KafkaMessage.error  # a fetched record's error, None for a message (the method descriptor: no lookup)


class _SupervisorGone(Exception):
    pass


class _Outcome(enum.Enum):
    """What became of a message (or batch) after the handler and the error policy."""

    DONE = "done"  # handled, or dead-lettered: progress moves past it
    RELEASE = "release"  # on_error="release": stop, and release the partition at it
    STOP = "stop"  # asked to stop while retrying: it is not done


class _Admit(enum.Enum):
    """What the limits (rate_limit, max_age) and the group (a message redriven for another) say about the next
    message."""

    CALL = "call"  # call the handler on it
    PASS = "pass"  # past max_age, or redriven for another group: done without a call
    STOP = "stop"  # asked to stop while waiting for a token: not begun


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # not Linux: no memory limit


def _wall_ms() -> int:
    """Now, as Kafka timestamps count: wall-clock milliseconds."""
    return int(time.time() * 1000)


def _exit_for(outcome: _Outcome) -> WorkerExit:
    return WorkerExit.RELEASE if outcome is _Outcome.RELEASE else WorkerExit.STOPPED


def worker_main(spec: WorkerSpec, slot_array: Any, connection: Connection, rate_bucket: Any = None) -> None:
    """Entry point in the worker process (the target of the fork server's Process).  ``rate_bucket``: the
    handler's shared token bucket (rate_limits.py), if it has a rate_limit."""
    code = Worker(spec, Slot(slot_array), connection, rate_bucket).run()
    # Exit now, without joining threads: a handler call stuck in a thread (concurrency) must not keep the
    # process alive once the worker is done, nor keep the fork server alive after the supervisor died (every
    # child of the fork server holds its keep-alive pipe).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def consumer_settings(spec: WorkerSpec) -> dict[str, Any]:
    return client_config(
        spec.settings,
        "consumer",
        **{
            "group.id": spec.group,  # for the committed offsets the supervisor keeps as a backup; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Where to go if the resume offset is gone (retention deleted it): the user's choice, not
            # librdkafka's default ("latest"), which would skip a whole backlog.
            "auto.offset.reset": spec.settings.auto_offset_reset,
            # librdkafka waits fetch.queue.backoff.ms (1000 ms by default in 2.x) before refilling its queue
            # once queued.min.messages is reached, which caps a fast consumer near 20k msgs/s.
            "fetch.queue.backoff.ms": 10,
            "fetch.wait.max.ms": 100,
            # One partition per consumer: 64 MB of read-ahead (the default) is memory, not speed.
            "queued.max.messages.kbytes": 16384,
        },
    )


def finish_worker(
    app: App | None, log: Any, dlq: DeadLetterWriter, consumer: GuardedConsumer | None, outbox: Outbox
) -> None:
    """A worker's last steps (both kinds): the on_worker_stop hooks, then its sends, dead letters and consumer
    closed."""
    for hook in app.worker_stop_hooks if app else []:
        try:
            hook()
        except Exception:
            log.exception("on_worker_stop hook failed")
    outbox.close(log)
    dlq.close()
    if consumer is not None:
        consumer.close()


def take_up_handler(worker: Any, app: App, topic: str) -> HandlerSpec:
    """The handler a worker (of either kind) runs, and what it needs from the app: its hooks, app.send's outbox,
    the rate limit's shared bucket and the age limit."""
    handler = app.handler_in_worker(topic)
    worker.hooks = app.hooks
    app.outbox = worker.outbox
    if handler.rate_limit and worker.rate_bucket is not None:
        worker.throttle = Throttle(worker.rate_bucket, handler.rate_limit)
    worker.max_age_ms = round(handler.max_age * 1000) if handler.max_age else 0
    return handler


def send_failed(log: Any, error: SendError) -> WorkerExit:
    """A handler's output was not confirmed: exit as a crash, progress still before the input it came from."""
    log.error("a message sent by a handler was not confirmed (%s): the worker stops without reporting progress past "
              "its input, which is handled again", error)  # fmt: skip
    return WorkerExit.SEND_FAILED


def give_up_error(spec: WorkerSpec, handler: HandlerSpec) -> Exception:
    """Why messages are given up on without a call (WorkerSpec.give_up_on): the dead letters' error."""
    if spec.give_up_reason == "worker_lost":
        return WorkerLost(f"the worker died on it {spec.settings.crash_limit} times in a row")
    return TimeLimitExceeded(f"the handler ran past its time limit {handler.retries + 1} times")


def die_with_parent() -> None:
    """SIGKILL when the fork server dies, which it does as soon as the supervisor dies."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe EOF check still catches it
    if os.getppid() != parent:
        os._exit(WorkerExit.SUPERVISOR_GONE)


class Worker:
    def __init__(self, spec: WorkerSpec, slot: Slot, connection: Connection, rate_bucket: Any = None) -> None:
        self.spec = spec
        self.rate_bucket = rate_bucket
        self.throttle: Throttle | None = None  # the handler's rate_limit, if any
        self.max_age_ms = 0  # the handler's max_age, 0: none
        self.slot = slot
        self.connection = connection
        self.outcomes = OutcomeCounts()  # failed calls, retries, ignored and rejected messages: for the metrics
        self.hooks = Hooks()  # the app's, once it is loaded
        self._partition_hooks_due = False
        self.stopping = False
        self.log: ContextLog = partition_log(_log, spec.group, spec.topic, spec.partition)
        self._lease_until = 0
        self._next_housekeeping = 0.0
        self._dlq = DeadLetterWriter(spec.settings)
        self.outbox = Outbox(spec.settings)  # app.send's producer: flushed before progress is reported
        # Fetched messages redriven for another group (dead_letter_groups.py), until passed by: one set for the
        # worker's life, filled by _fetch, emptied by the loops as they get to them.
        self._other_groups = OtherGroups(spec.group)
        self.not_ours: set[int] = set()
        self._dead_letters_in_a_row = 0  # dlq_limit: dead letters since the last message that was not one
        self._dead_letters_end = -1  # the offset after the last dead letter
        self._first_fetched = False
        self._partition = TopicPartition(spec.topic, spec.partition)
        self._handled_total = 0
        self._recycle_reason: str | None = None
        self._consumer: GuardedConsumer | None = None
        self._timed: HandlerSpec | None = None  # metrics on: the handler, timing each call
        self._next_timed_fetch = 0.0
        self._alarm: Alarm | None = None  # _consume_alo's next look at the lease and housekeeping

    # ------------------------------------------------------------ lifecycle

    def run(self) -> WorkerExit:
        self._init_process()
        try:
            app = load_app(self.spec.app_path)
            handler = take_up_handler(self, app, self.spec.topic)
            # Skipping what a previous owner did out of order takes the lanes, whatever the concurrency.
            on_lanes = handler.runs_on_lanes or bool(self.spec.skip)
            if on_lanes:
                effective_time_limits(handler, self.spec.settings)  # refuses a soft limit past the hard one
            else:
                handler, self._timed = self._instrumented(handler)
            for hook in app.worker_start_hooks:
                hook()
        except Exception:
            self.log.exception("worker cannot start")
            return WorkerExit.BOOT_ERROR
        run_hooks(app.hooks.on_partition_claimed, self.spec.topic, self.spec.partition)
        self._partition_hooks_due = True  # on_partition_released runs as the worker stops
        try:
            self._consumer = self._open_consumer()
            self.log.info("worker started at offset %d (%s%s)", self.spec.start_offset, handler.mode.value,
                          f", concurrency {handler.concurrency}" if on_lanes else "")  # fmt: skip
            if on_lanes:
                code = LaneRunner(self, handler).run()
            elif self.spec.give_up_on is not None and not self._give_up_on(handler, *self.spec.give_up_on):
                return WorkerExit.STOPPED
            else:
                code = self._consume(handler)
            if code is WorkerExit.STOPPED and self._recycle_reason is not None:
                self.log.info("worker restarts: %s", self._recycle_reason)
                return WorkerExit.RECYCLE
            return code
        except _SupervisorGone:
            return WorkerExit.SUPERVISOR_GONE
        except SendError as exc:
            return send_failed(self.log, exc)
        finally:
            self._finish(app)

    def _instrumented(self, handler: HandlerSpec) -> tuple[HandlerSpec, HandlerSpec | None]:
        """The handler with its time limits, and (metrics on) the same also timing each call."""
        soft, hard = effective_time_limits(handler, self.spec.settings)
        # The call in progress is published with its start for a time limit (the hard one is enforced by the
        # supervisor; the health monitor judges a long call by either), and for a batch: if the worker dies in it,
        # the supervisor knows which batch to dead-letter as WorkerLost (worker_pool.py; a few writes per call).
        limits = Instruments(soft_time_limit=soft, track_calls=bool(soft or hard) or handler.batch)
        plain = replace(handler, function=instrument(handler.function, handler.batch, self.slot, limits))
        if not self.spec.settings.metrics_port:
            return plain, None
        timed = replace(limits, latency=True)
        return plain, replace(handler, function=instrument(handler.function, handler.batch, self.slot, timed))

    def _sampled(self, handler: HandlerSpec, records: list[Any]) -> HandlerSpec:
        """The handler for this fetch's messages: the timed one when a latency sample is due.

        Every call of a fetch is timed once _LATENCY_SAMPLE_INTERVAL_S has passed
        since the last timed fetch: a fast handler pays a fraction of a percent
        for the histogram (timing every call cost a third of its throughput), a
        slow one, whose fetches last longer than that, is timed at every call.
        """
        if self._timed is None or not records or time.monotonic() < self._next_timed_fetch:
            return handler
        self._next_timed_fetch = time.monotonic() + _LATENCY_SAMPLE_INTERVAL_S
        return self._timed

    def _init_process(self) -> None:
        configure_logging(self.spec.settings.log_level, self.spec.settings.log_format)
        die_with_parent()
        dump_stacks_on_sigusr2(self._stack_dump_heading)  # sent by the supervisor on its own SIGUSR2
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which stops us in order
        # Until the line above we ignored SIGTERM (as the fork server does): a stop asked for meanwhile is in the slot.
        self._check_stop_flag()
        self._set_title(self.spec.start_offset)

    def _stack_dump_heading(self) -> str:
        spec = self.spec
        return worker_heading(os.getpid(), spec.group, spec.topic, spec.partition,
                              f"at offset {self.slot.get(Field.NEXT_OFFSET)}")  # fmt: skip

    def _request_stop(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self._alarm is not None:
            self._alarm.raise_now()  # _consume_alo notices at its next message

    def _check_stop_flag(self) -> None:
        if self.slot.get(Field.STOP_REQUESTED):
            self.stopping = True

    def _set_title(self, offset: int) -> None:
        spec = self.spec
        setproctitle.setproctitle(f"marshal-workers: worker {spec.group} {spec.topic}[{spec.partition}] @{offset}")

    def _finish(self, app: App | None) -> None:
        if self._partition_hooks_due:
            run_hooks(self.hooks.on_partition_released, self.spec.topic, self.spec.partition)
        self.send_outcomes()
        finish_worker(app, self.log, self._dlq, self._consumer, self.outbox)

    # -------------------------------------------------------------- loops

    def _consume(self, handler: HandlerSpec) -> WorkerExit:
        if handler.mode is Mode.ALO and not handler.batch:
            return self._consume_alo(handler)
        return self._consume_batches(handler)

    def _consume_alo(self, handler: HandlerSpec) -> WorkerExit:
        """At least once, one message per call: handle, then record progress; the heartbeat carries it.

        Progress is stored after each message, unless the handlers sent messages (app.send) not yet flushed: then
        it waits (``unreported``) until the outbox is flushed, once for the fetch, or before looking up from it."""
        fields, next_offset, processed = self.slot.fields, int(Field.NEXT_OFFSET), int(Field.PROCESSED)
        handling_end = int(Field.HANDLING_END)
        wrap, now, outbox = Message, time.monotonic, self.outbox  # the slot's clock (monotonic_ms)
        self._alarm = Alarm()
        due = self._alarm.due
        plain = handler
        limits = self.throttle is not None or bool(self.max_age_ms)  # rate_limit or max_age: one check a message
        while not self.stopping:
            records = self._fetch(self._fetch_size(plain))
            if self.max_age_ms and records:
                records = self._drop_old_run(plain, records)
            handler = self._sampled(plain, records)
            function = handler.function
            handled = unreported = 0
            limited = limits or bool(self.not_ours)  # or a message for another group in this fetch
            self._set_check_at()
            for record in records:
                # The lease's end, housekeeping or a stop (SIGTERM raises it too): the alarm says when to look.
                if due[0]:
                    if unreported:
                        unreported = self._report_sent(unreported)
                    if self.stopping:
                        break
                    self._housekeeping()
                    if now() * 1000 >= self._lease_until and not self._wait_for_lease():
                        break
                    self._set_check_at()
                    if self.stopping:
                        break
                if limited:
                    admitted = self._admit(handler, record)
                    if admitted is _Admit.STOP:
                        break  # asked to stop while waiting for the rate limit: this message is not begun
                    if admitted is _Admit.PASS:  # done: progress moves past it once what was sent is flushed
                        if outbox.pending:
                            unreported = record.offset() + 1
                        else:
                            fields[next_offset] = record.offset() + 1
                        handled += 1
                        continue
                # The hot path: a store before the call (a call in flight: the supervisor's health monitor), the
                # call, a store after it.  Retries and dead letters only after a failure.
                end = record.offset() + 1
                fields[handling_end] = end
                try:
                    function(wrap(record))
                except Exception as exc:
                    outcome = self._recover(handler, [record], exc)
                    if outcome is not _Outcome.DONE:
                        if unreported:
                            self._report_sent(unreported)
                        fields[processed] += handled
                        return _exit_for(outcome)
                if outbox.pending:
                    unreported = end
                else:
                    fields[next_offset] = end
                handled += 1
            if unreported:
                self._report_sent(unreported)
            fields[processed] += handled
            self._count_handled(handled)
        return WorkerExit.STOPPED

    def _report_sent(self, next_offset: int) -> int:
        """Progress up to ``next_offset`` once Kafka has what the handlers sent (SendError if it has not)."""
        self.outbox.flush()
        self.slot.fields[Field.NEXT_OFFSET] = next_offset
        return 0

    def _set_check_at(self) -> None:
        """When _consume_alo next looks up from its messages: the lease's end or housekeeping, now if stopping."""
        assert self._alarm is not None
        if self.stopping:
            self._alarm.raise_now()
        else:
            self._alarm.set(min(self._lease_until / 1000, self._next_housekeeping))

    def _consume_batches(self, handler: HandlerSpec) -> WorkerExit:
        """Batch handlers, and at most once: fetch a batch, (AMO: claim it first), handle it, record progress."""
        at_most_once = handler.mode is Mode.AMO
        plain = handler
        while not self.stopping:
            records = self._fetch(self._fetch_size(plain))
            handler = self._sampled(plain, records)
            if self.stopping:
                break  # fetched, not begun: the next owner gets them
            if not records or not self._wait_for_lease():
                continue
            end = records[-1].offset() + 1
            ours, passed = self._without_other_groups(records) if self.not_ours else (records, 0)
            fresh, old = split_by_age(ours, _wall_ms(), self.max_age_ms) if self.max_age_ms else (ours, [])
            # The batch's tokens before its claim: stopped while waiting, nothing is claimed or begun.
            if self.throttle is not None and fresh and not self._take_tokens(len(fresh)):
                break
            if at_most_once:
                refused = self._claim_batch(end)
                if refused is not None:
                    return refused
                # Claimed: whatever happens now, these messages are never handled again.  A claim answered
                # late (our supervisor was frozen) may come after another owner took over: the lease says.
                if not self._wait_for_lease():
                    return WorkerExit.STOPPED
            if old:
                self.too_old(handler, old)
                self.slot.fields[Field.PROCESSED] += len(old)
            self.slot.fields[Field.PROCESSED] += passed
            outcome = _Outcome.DONE
            if fresh:
                outcome = self._handle(handler, fresh) if handler.batch else self._handle_each(handler, fresh)
            if outcome is not _Outcome.DONE:
                return _exit_for(outcome)
            if handler.batch:
                self.slot.fields[Field.PROCESSED] += len(fresh)
            self.outbox.flush()  # what the handlers sent (app.send), before progress past their inputs
            self.slot.fields[Field.NEXT_OFFSET] = end
            self._count_handled(len(records))
        return WorkerExit.STOPPED

    def _handle_each(self, handler: HandlerSpec, records: list[Any]) -> _Outcome:
        """At most once, one message per call: handle every message of a claimed batch, stopping or not (a
        clean stop finishes the claim).  As lean as _consume_alo: one call per message, housekeeping when due."""
        fields, function, wrap, now = self.slot.fields, handler.function, Message, time.monotonic
        handling_end = int(Field.HANDLING_END)
        handled = 0
        try:
            for record in records:
                if now() >= self._next_housekeeping:
                    self._housekeeping()
                fields[handling_end] = record.offset() + 1  # a call in flight (the batch's end moves NEXT_OFFSET)
                try:
                    function(wrap(record))
                except Exception as exc:
                    outcome = self._recover(handler, [record], exc)
                    if outcome is not _Outcome.DONE:
                        return outcome
                handled += 1
            return _Outcome.DONE
        finally:
            fields[Field.PROCESSED] += handled

    # ------------------------------------------------------- rate and age

    def _admit(self, handler: HandlerSpec, record: Any) -> _Admit:
        """One message under max_age and rate_limit: for another group or too old (done without a call), or its
        token taken (or a stop came while waiting for it)."""
        if self.not_ours and self.passes_by(record.offset()):
            return _Admit.PASS
        if self.max_age_ms and is_too_old(record.timestamp(), _wall_ms(), self.max_age_ms):
            self.too_old(handler, [record])
            return _Admit.PASS
        if self.throttle is not None and not self._take_tokens(1):
            return _Admit.STOP
        return _Admit.CALL

    def _take_tokens(self, count: int) -> bool:
        """Wait for ``count`` tokens of the handler's rate limit, looking after the worker meanwhile; then make
        sure the lease still holds.  False if asked to stop first."""
        assert self.throttle is not None
        if not self.throttle.acquire(count, self._still_waiting):
            return False
        return time.monotonic() * 1000 < self._lease_until or self._wait_for_lease()

    def _still_waiting(self) -> bool:
        self._housekeeping()
        return not self.stopping

    def _drop_old_run(self, handler: HandlerSpec, records: list[Any]) -> list[Any]:
        """The fetch's leading messages past max_age, done together (one dead-letter write for all of them, not
        one each: an old backlog goes by at the speed of a batch); the rest is left to the loop's own check.
        The run ends at a message for another group: that one is passed by, never dead-lettered here."""
        now_ms, count, not_ours = _wall_ms(), 0, self.not_ours
        while (count < len(records) and is_too_old(records[count].timestamp(), now_ms, self.max_age_ms)
               and not (not_ours and records[count].offset() in not_ours)):  # fmt: skip
            count += 1
        if not count or (time.monotonic() * 1000 >= self._lease_until and not self._wait_for_lease()):
            return records  # none, or the lease is in doubt: the loop looks at the lease before each message
        self.too_old(handler, records[:count])
        self.slot.fields[Field.NEXT_OFFSET] = records[count - 1].offset() + 1
        self.slot.fields[Field.PROCESSED] += count
        self._count_handled(count)
        return records[count:]

    def passes_by(self, offset: int) -> bool:
        """Is the fetched message at ``offset`` redriven for another group?  Then it is counted (outcome
        other_group) and forgotten here, and the caller passes it by: done, without a call."""
        not_ours = self.not_ours
        if offset not in not_ours:
            return False
        not_ours.discard(offset)
        self.outcomes.other_group += 1
        return True

    def _without_other_groups(self, records: list[Any]) -> tuple[list[Any], int]:
        """The messages of a fetch that are this group's, and how many were passed by (for another group)."""
        ours = [r for r in records if not self.passes_by(r.offset())]
        return ours, len(records) - len(ours)

    def too_old(self, handler: HandlerSpec, records: list[Any]) -> None:
        """Messages past the handler's max_age: not handled; counted, and dead-lettered if on_too_old="dlq".
        They do not count towards dlq_limit (that bounds failures in a row)."""
        self.outcomes.too_old += len(records)
        if handler.on_too_old is OnTooOld.DLQ:
            now_ms = _wall_ms()
            self._write_dead_letters(handler, records, [too_old_error(r.timestamp(), now_ms, self.max_age_ms)
                                                        for r in records])  # fmt: skip
        self.log.debug("%d message(s) from offset %d older than max_age: %s", len(records), records[0].offset(),
                       "dead-lettered" if handler.on_too_old is OnTooOld.DLQ else "skipped")  # fmt: skip

    # ----------------------------------------------------- lifecycle limits

    def _open_consumer(self) -> GuardedConsumer:
        """The worker's reader of its partition, placed at its start offset."""
        spec = self.spec
        consumer = GuardedConsumer(
            consumer_settings(spec),
            f"worker of {spec.group} {spec.topic}[{spec.partition}]",
            spec.settings.heartbeat_interval,
            on_stall=lambda stalls: self.slot.set(Field.FETCH_STALLS, stalls),
        )
        consumer.assign([TopicPartition(spec.topic, spec.partition, spec.start_offset)])
        consumer.read_without_gaps_if_the_broker_skips(spec.settings.connect_timeout)
        return consumer

    def _fetch_size(self, handler: HandlerSpec) -> int:
        """A batch never runs past max_messages_per_worker, so the restart falls on a message boundary."""
        limit = self.spec.settings.max_messages_per_worker
        return handler.batch_size if not limit else max(1, min(handler.batch_size, limit - self._handled_total))

    def _count_handled(self, count: int) -> None:
        self._handled_total += count
        limit = self.spec.settings.max_messages_per_worker
        if limit and self._handled_total >= limit:
            self._recycle(f"handled {self._handled_total} messages (max_messages_per_worker)")

    def _check_memory(self) -> None:
        limit = self.spec.settings.max_memory_per_worker
        if limit and self._handled_total:  # a fresh worker always gets to handle something first
            rss = _resident_bytes()
            if rss is not None and rss > limit:
                self._recycle(f"resident memory {rss // 2**20} MB passed max_memory_per_worker")

    def _recycle(self, reason: str) -> None:
        """Finish the message in hand, then exit for a fresh worker that starts exactly where this one stopped."""
        self._recycle_reason = reason
        self.stopping = True

    def _fetch(self, most: int, wait: float = 0.1) -> list[Any]:
        """Up to ``most`` messages: wait up to ``wait`` seconds for the first, then take what is already fetched."""
        assert self._consumer is not None
        self._housekeeping()
        first = self._consumer.poll(wait)
        if first is None:
            return []
        batch = [first, *self._consumer.consume(most - 1, 0)] if most > 1 else [first]
        self._publish_high_watermark()
        # The errors in C (map, count), not a Python loop: this is per message, and a batch almost never has one.
        errors = list(map(_ERROR_OF, batch))
        good = batch if errors.count(None) == len(errors) else [m for m, e in zip(batch, errors) if e is None]
        if good and not self._first_fetched:
            self._first_fetched = True
            if good[0].offset() != self.spec.start_offset:
                self.log.warning(
                    "asked for offset %d, got %d first: offsets before it are gone (retention or compaction); "
                    "auto_offset_reset=%s applied", self.spec.start_offset, good[0].offset(),
                    self.spec.settings.auto_offset_reset,
                )  # fmt: skip
        if len(good) != len(batch):
            for error in errors:
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    self.log.warning("fetch error: %s", error)
        # Every loop passes these by as it gets to them (passes_by): the one rule of dead_letter_groups.py.
        others = self._other_groups.offsets(good)
        if others:
            self.not_ours.update(others)
            self.log.debug("%d fetched message(s) from offset %d redriven for another group: passed by",
                           len(others), min(others))  # fmt: skip
        return good

    # ------------------------------------------------------------- leases

    def _wait_for_lease(self) -> bool:
        """True when the lease is valid; waits while it has lapsed; False if asked to stop meanwhile."""
        while True:
            self._lease_until = self.slot.get(Field.LEASE_UNTIL_MS)
            if time.monotonic() * 1000 < self._lease_until:
                return True
            if self.stopping:
                return False
            self._check_supervisor()
            time.sleep(_LEASE_POLL_S)

    def _claim_batch(self, end: int) -> WorkerExit | None:
        """AMO: claim the messages before ``end`` through the supervisor; None once claimed, else how to exit."""
        while True:
            answer = self._claim_messages(end)
            if answer is ClaimAnswer.CLAIMED:
                return None
            if answer is ClaimAnswer.REFUSED:
                self.log.warning("claim of messages before offset %d refused: the partition is not ours", end)
                return WorkerExit.LOST
            # Kafka is slow or away.  The log keeps the highest claim, so asking again for the same end is safe.
            # Asked to stop meanwhile, still ask again while the lease holds: the claim may land yet, and a clean
            # stop that left a landed claim unhandled would lose its messages (Kafka slow, no fault at all).
            self.log.warning("claim of messages before offset %d not confirmed in time: asking again", end)
            if not self._wait_for_lease():
                # The lease lapsed while stopping, nothing handled.  Should the claim still land, these messages
                # count as claimed (lost), as after any stop while Kafka does not answer; otherwise the next owner
                # starts at them.
                return WorkerExit.STOPPED

    def _claim_messages(self, end: int) -> ClaimAnswer:
        """Ask the supervisor to claim every message before ``end``; wait for its answer."""
        try:
            self.connection.send(ClaimMessages(end))
            # Blocking: the supervisor always answers (within an HB: UNCONFIRMED at worst) or its end closes the
            # pipe.  A signal runs its handler and the read goes on, as the old poll(0.1) loop did, without a
            # selector built every 0.1 s.
            verdict: ClaimVerdict = self.connection.recv()
            return verdict.answer
        except (EOFError, OSError):
            raise _SupervisorGone() from None

    def _check_supervisor(self) -> None:
        """The supervisor writes nothing on our pipe unless asked: readable means EOF, it is gone."""
        if self.connection.poll(0):
            try:
                self.connection.recv()
            except (EOFError, OSError):
                raise _SupervisorGone() from None

    def _housekeeping(self) -> None:
        """Every half second: is the supervisor there, where is the partition's end, the process title."""
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + _HOUSEKEEPING_INTERVAL_S
        self._check_stop_flag()
        self._check_supervisor()
        self._check_memory()
        self._publish_high_watermark()
        self._set_title(self.slot.get(Field.NEXT_OFFSET))
        self.send_outcomes()

    def send_outcomes(self) -> None:
        """What became of failed calls since the last time, to the supervisor for its metrics."""
        counts = self.outcomes.take()
        if counts is not None:
            try:
                self.connection.send(Outcomes(counts))
            except OSError:
                pass  # the supervisor is gone: _check_supervisor deals with it

    def _publish_high_watermark(self) -> None:
        """The partition's end as the last fetch response told it (the supervisor computes lag from it)."""
        assert self._consumer is not None
        _, high = self._consumer.get_watermark_offsets(self._partition, cached=True)
        if high >= 0:
            self.slot.set(Field.HIGH_WATERMARK, high)

    # ---------------------------------------------------------- time limits

    def _give_up_on(self, handler: HandlerSpec, start: int, end: int) -> bool:
        """Apply on_error to messages [start, end) without calling the handler: their calls were killed by the
        hard time limit more often than ``retries`` allows.  False if asked to stop first."""
        assert self._consumer is not None
        records: list[Any] = []
        while not records or records[-1].offset() + 1 < end:
            if self.stopping or not self._wait_for_lease():
                return False
            message = self._consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            if message.offset() >= end:  # the rest is gone (retention): handle this one normally
                self._consumer.seek(TopicPartition(self.spec.topic, self.spec.partition, message.offset()))
                break
            records.append(message)
        error = give_up_error(self.spec, handler)
        # A batch's range may hold messages redriven for another group (passed by, never in the call): not ours.
        others = self._other_groups.offsets(records)
        if others:
            records = [r for r in records if r.offset() not in others]
            self.outcomes.other_group += len(others)
        if records:
            self._dead_letter(handler, records, error)
        self.slot.fields[Field.NEXT_OFFSET] = max(self.slot.fields[Field.NEXT_OFFSET], end)
        return True

    # ------------------------------------------------------ handler errors

    def _handle(self, handler: HandlerSpec, records: list[Any]) -> _Outcome:
        """Call the handler on one message (or on the batch); recover from a failure by the policy."""
        try:
            handler.call(records)
            return _Outcome.DONE
        except Exception as exc:
            return self._recover(handler, records, exc)

    def _recover(self, handler: HandlerSpec, records: list[Any], error: Exception) -> _Outcome:
        """After a first failure: retry as the handler's policy says (retry_policy.py), then dead-letter (DONE)
        or give the partition up; a message the handler ignored is done, one it rejected dead-lettered.  Each
        failed call is logged once, with its traceback (failure_logs.py)."""
        offset, failures, first = records[0].offset(), 1, error
        while True:
            self.outcomes.failed(error)
            step = next_step(handler.retry_policy, error, failures)
            if step.action is Action.IGNORE:
                self.outcomes.ignored += len(records)
                log_ignored(self.log, handler.name, offset, error)
                return _Outcome.DONE
            if step.action is Action.REJECT:
                self.outcomes.rejected += len(records)
                self._dead_letter(handler, records, error)
                return _Outcome.DONE
            if step.action is Action.GIVE_UP:
                break
            log_retry(self.log, handler.name, offset, error, failures, step.delay)
            if not self._sleep_unless_stopped(step.delay):
                return _Outcome.STOP  # not done: the next owner handles it again
            self.outcomes.retries += 1
            failures += 1
            try:
                handler.call(records, failures)
                return _Outcome.DONE
            except Exception as exc:
                # Called while the first failure is being handled (the loops call _recover in their except
                # clause, which keeps the hot path lean): Python would chain each retry's error to it.
                error = apart_from(exc, first)
        if handler.on_error is OnError.RELEASE or self.over_dlq_limit(handler, records):
            log_release(self.log, handler.name, offset, error)
            return _Outcome.RELEASE
        self._dead_letter(handler, records, error)
        return _Outcome.DONE

    def _sleep_unless_stopped(self, seconds: float) -> bool:
        """Wait before a retry, looking after the worker meanwhile; False (at once) if asked to stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, _HOUSEKEEPING_INTERVAL_S / 5))
            self._housekeeping()
        return False

    def over_dlq_limit(self, handler: HandlerSpec, records: list[Any]) -> bool:
        """Have ``dlq_limit`` messages in a row gone to the dead-letter topic just before ``records``?  Then they
        are not dead-lettered: the partition is released as sick at them.  "In a row" is read off the offsets
        (the dead letters ended where these begin), so a handled message costs nothing here."""
        limit = handler.dlq_limit
        if not limit:
            return False
        first = records[0].offset()
        if first != self._dead_letters_end:
            self._dead_letters_in_a_row = 0
        if self._dead_letters_in_a_row < limit:
            return False
        self.log.error(
            "%d messages in a row went to %s (dlq_limit): releasing the partition as sick at offset %d instead",
            self._dead_letters_in_a_row, handler.dlq_topic, first,
        )  # fmt: skip
        return True

    def _write_dead_letters(self, handler: HandlerSpec, records: list[Any], errors: list[Exception]) -> None:
        """Write the messages to the dead-letter topic, each with its error, and make sure they are there (or crash
        trying: progress stays before them, so they are handled again); counted, and the on_dead_letter hooks run."""
        self._dlq.write(handler.dlq_topic, records, [error_headers(handler.name, r, e) for r, e in zip(records, errors)])
        self.slot.fields[Field.DEAD_LETTERED] += len(records)
        for record, error in zip(records, errors) if self.hooks.on_dead_letter else ():
            run_hooks(self.hooks.on_dead_letter, Message(record), error)

    def _dead_letter(self, handler: HandlerSpec, records: list[Any], error: Exception) -> None:
        """Write the messages to the dead-letter topic and make sure they are there, or crash trying."""
        self._write_dead_letters(handler, records, [error] * len(records))
        self._dead_letters_in_a_row += len(records)
        self._dead_letters_end = records[-1].offset() + 1
        log_dead_letter(self.log, handler.name, records[0].offset(), error, len(records), handler.dlq_topic)
