"""A partition worker's link to its supervisor: everything a worker loop asks of the world around the handler.

* the slot (runtime/channel.py): progress written here, the lease and a stop request read from here;
* the pipe: AMO batch claims (``ask_to_claim``), the outcome counts for the metrics (``send_outcomes``), and EOF
  when the supervisor is gone (``check_supervisor``): each in one method;
* the partition's reader (``fetch``), which also sets aside messages redriven for another group;
* the lease: a loop acts on a message only while ``lease_holds``;
* housekeeping every half second, and the lifecycle limits (max_messages_per_worker, max_memory_per_worker) that
  end a worker with a recycle.

Every loop (one_call_loop.py, batch_loop.py, lane_runner.py) is given one, so a unit test can give it a fake one.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from typing import Any

import setproctitle
from confluent_kafka import KafkaError, TopicPartition

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import ContextLog
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import RECORD_ERROR, RECORD_HEADERS, take_fetched
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.protocol.dead_letter_groups import OtherGroups
from marshal_workers.runtime.channel import Field, Slot, WorkerSpec
from marshal_workers.runtime.messages import ClaimBatch, ClaimVerdict, Outcomes
from marshal_workers.runtime.worker.alarm import Alarm

_HOUSEKEEPING_INTERVAL_S = 0.5
_LEASE_POLL_S = 0.01


class SupervisorGone(Exception):
    """The supervisor's end of the pipe is closed: it is gone, and the worker exits."""


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # not Linux: no memory limit


class SupervisorLink:
    """One partition worker's slot, pipe, reader and lease (see the module's docstring)."""

    def __init__(self, spec: WorkerSpec, slot: Slot, connection: Connection, log: ContextLog, outbox: Outbox) -> None:
        self.spec = spec
        self.slot = slot
        self.fields = slot.fields  # the loops' stores of progress and counts, one item store each
        self.connection = connection
        self.log = log
        self.outbox = outbox  # app.send's producer: flushed before progress past what was sent is reported
        self.outcomes = OutcomeCounts()  # failed calls, retries, ignored and rejected messages: for the metrics
        self.consumer: GuardedConsumer | None = None  # the partition's reader, once the worker opened it
        self.stopping = False  # asked to stop (SIGTERM, the slot's flag) or a lifecycle limit reached
        self.recycle_reason: str | None = None  # why the worker ends for a fresh one, if it does
        self.lease_until = 0  # the lease's end as last read from the slot (monotonic_ms)
        self.next_housekeeping = 0.0  # monotonic seconds
        # Fetched messages redriven for another group (dead_letter_groups.py), until passed by: one set for the
        # worker's life, filled by fetch, emptied by the loops as they get to them (passes_by).
        self.not_ours: set[int] = set()
        self._other_groups = OtherGroups(spec.group, RECORD_HEADERS)
        self._first_fetched = False
        self._handled_total = 0
        self._alarm: Alarm | None = None

    # ------------------------------------------------------------ stopping

    def watch_with(self, alarm: Alarm) -> None:
        """The alarm a loop looks at between messages: a stop raises it."""
        self._alarm = alarm

    def request_stop(self) -> None:
        """Finish the message in hand, then stop (in a signal handler too: no lock)."""
        self.stopping = True
        if self._alarm is not None:
            self._alarm.raise_now()  # the one-call loop notices at its next message

    def check_stop_flag(self) -> None:
        if self.slot.get(Field.STOP_REQUESTED):
            self.stopping = True

    # ------------------------------------------------------------ lifecycle limits

    def fetch_size(self, batch_size: int) -> int:
        """A batch never runs past max_messages_per_worker, so the restart falls on a message boundary."""
        limit = self.spec.settings.max_messages_per_worker
        return batch_size if not limit else max(1, min(batch_size, limit - self._handled_total))

    def count_handled(self, count: int) -> None:
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
        self.recycle_reason = reason
        self.stopping = True

    # ------------------------------------------------------------ reading

    def fetch(self, most: int, wait: float = 0.1) -> list[Any]:
        """Up to ``most`` messages: wait up to ``wait`` seconds for the first, then take what is already fetched."""
        consumer = self.consumer
        assert consumer is not None
        self.housekeeping()
        batch = take_fetched(consumer, most, wait)
        if not batch:
            return []
        self.publish_high_watermark()
        # The errors in C (map, any), not a Python loop: this is per message, and a batch almost never has one.  Not
        # errors.count(None): that compares each KafkaError with None, which raises (SystemError).  A KafkaError is true.
        errors = list(map(RECORD_ERROR, batch))
        good = batch if not any(errors) else [m for m, e in zip(batch, errors) if e is None]
        if good and not self._first_fetched:
            self._first_fetched = True
            if good[0].offset() != self.spec.start_offset:
                self.log.warning(
                    "asked for offset %d, got %d first: offsets before it are gone (retention or compaction); "
                    "auto_offset_reset=%s applied",
                    self.spec.start_offset,
                    good[0].offset(),
                    self.spec.settings.auto_offset_reset,
                )
        if len(good) != len(batch):
            for error in errors:
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    self.log.warning("fetch error: %s", error)
        # Every loop passes these by as it gets to them (passes_by): the one rule of dead_letter_groups.py.
        others = self._other_groups.offsets(good)
        if others:
            self.not_ours.update(others)
            self.log.debug(
                "%d fetched message(s) from offset %d redriven for another group: passed by", len(others), min(others)
            )
        return good

    def read_range(self, end: int) -> list[Any] | None:
        """The messages from where the reader stands up to ``end``, read while the lease holds (the messages
        redriven for another group left out, and counted); None if asked to stop first.  A message at or past
        ``end`` (the rest is gone: retention) is left to be read again."""
        consumer = self.consumer
        assert consumer is not None
        records: list[Any] = []
        while not records or records[-1].offset() + 1 < end:
            if self.stopping or not self.wait_for_lease():
                return None
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            offset = message.offset()
            assert offset is not None  # a record, not an error event
            if offset >= end:  # the rest is gone (retention): handle this one normally
                consumer.seek(TopicPartition(self.spec.topic, self.spec.partition, offset))
                break
            records.append(message)
        # A batch's range may hold messages redriven for another group (passed by, never in the call): not ours.
        others = self._other_groups.offsets(records)
        if others:
            records = [r for r in records if r.offset() not in others]
            self.outcomes.other_group += len(others)
        return records

    def passes_by(self, offset: int) -> bool:
        """Is the fetched message at ``offset`` redriven for another group?  Then it is counted (outcome
        other_group) and forgotten here, and the caller passes it by: done, without a call."""
        not_ours = self.not_ours
        if offset not in not_ours:
            return False
        not_ours.discard(offset)
        self.outcomes.other_group += 1
        return True

    # ------------------------------------------------------------ the lease

    def lease_valid(self, now: float) -> bool:
        """Does the lease hold at ``now`` (monotonic seconds)?  The slot is read only once the last value read has
        passed."""
        if now * 1000 < self.lease_until:
            return True
        self.lease_until = self.slot.get(Field.LEASE_UNTIL_MS)
        return now * 1000 < self.lease_until

    def lease_holds(self) -> bool:
        """True when the lease holds now, after waiting while it has lapsed; False if asked to stop meanwhile."""
        return time.monotonic() * 1000 < self.lease_until or self.wait_for_lease()

    def wait_for_lease(self) -> bool:
        """True when the lease is valid; waits while it has lapsed; False if asked to stop meanwhile."""
        while True:
            self.lease_until = self.slot.get(Field.LEASE_UNTIL_MS)
            if time.monotonic() * 1000 < self.lease_until:
                return True
            if self.stopping:
                return False
            self.check_supervisor()
            time.sleep(_LEASE_POLL_S)

    def next_look(self) -> float:
        """When a loop should next look up from its messages (monotonic seconds): the lease's end or housekeeping."""
        return min(self.lease_until / 1000, self.next_housekeeping)

    # ------------------------------------------------------------ the pipe

    def claim_batch(self, end: int) -> WorkerExit | None:
        """AMO: claim the messages before ``end`` through the supervisor; None once claimed, else how to exit."""
        while True:
            answer = self.ask_to_claim(end)
            if answer is ClaimAnswer.CLAIMED:
                return None
            if answer is ClaimAnswer.REFUSED:
                self.log.warning("claim of messages before offset %d refused: the partition is not ours", end)
                return WorkerExit.LOST
            # Kafka is slow or away.  The log keeps the highest claim, so asking again for the same end is safe.
            # Asked to stop meanwhile, still ask again while the lease holds: the claim may land yet, and a clean
            # stop that left a landed claim unhandled would lose its messages (Kafka slow, no fault at all).
            self.log.warning("claim of messages before offset %d not confirmed in time: asking again", end)
            if not self.wait_for_lease():
                # The lease lapsed while stopping, nothing handled.  Should the claim still land, these messages
                # count as claimed (lost), as after any stop while Kafka does not answer; otherwise the next owner
                # starts at them.
                return WorkerExit.STOPPED

    def ask_to_claim(self, end: int) -> ClaimAnswer:
        """Ask the supervisor to claim every message before ``end``; wait for its answer."""
        try:
            self.connection.send(ClaimBatch(end))
            # Blocking: the supervisor always answers (within an HB: UNCONFIRMED at worst) or its end closes the
            # pipe.  A signal runs its handler and the read goes on, as the old poll(0.1) loop did, without a
            # selector built every 0.1 s.
            verdict: ClaimVerdict = self.connection.recv()
            return verdict.answer
        except (EOFError, OSError):
            raise SupervisorGone() from None

    def check_supervisor(self) -> None:
        """The supervisor writes nothing on our pipe unless asked: readable means EOF, it is gone."""
        if self.connection.poll(0):
            try:
                self.connection.recv()
            except (EOFError, OSError):
                raise SupervisorGone() from None

    def send_outcomes(self) -> None:
        """What became of failed calls since the last time, to the supervisor for its metrics."""
        counts = self.outcomes.take()
        if counts is not None:
            try:
                self.connection.send(Outcomes(counts))
            except OSError:
                pass  # the supervisor is gone: check_supervisor deals with it

    # ------------------------------------------------------------ housekeeping and progress

    def housekeeping(self) -> None:
        """Every half second: is the supervisor there, where is the partition's end, the process title."""
        now = time.monotonic()
        if now < self.next_housekeeping:
            return
        self.next_housekeeping = now + _HOUSEKEEPING_INTERVAL_S
        self.check_stop_flag()
        self.check_supervisor()
        self._check_memory()
        self.publish_high_watermark()
        self.set_title(self.slot.get(Field.NEXT_OFFSET))
        self.send_outcomes()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` (before a retry), looking after the worker meanwhile; False (at once) if asked to
        stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, _HOUSEKEEPING_INTERVAL_S / 5))
            self.housekeeping()
        return False

    def set_title(self, offset: int) -> None:
        spec = self.spec
        setproctitle.setproctitle(f"marshal-workers: worker {spec.group} {spec.topic}[{spec.partition}] @{offset}")

    def publish_high_watermark(self) -> None:
        """The partition's end as the last fetch response told it (the supervisor computes lag from it)."""
        assert self.consumer is not None
        high = self.consumer.fetched_end(self.spec.topic, self.spec.partition)
        if high >= 0:
            self.slot.set(Field.HIGH_WATERMARK, high)

    def report_sent(self, next_offset: int) -> int:
        """Progress up to ``next_offset`` once Kafka has what the handlers sent (SendError if it has not); 0."""
        self.outbox.flush()
        self.fields[Field.NEXT_OFFSET] = next_offset
        return 0

    def publish_done(self, progress: int, runs: list[int]) -> None:
        """The position of a worker on lanes: everything before ``progress`` done, and the done set ``runs`` above
        it (done_set.py), for the supervisor's heartbeats and release."""
        self.slot.publish_done(progress, runs)
