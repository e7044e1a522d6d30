"""What a worker loop sees of the world, faked for unit tests in one process: no broker, no fork, no supervisor.

* FakeClock: monotonic seconds that move only when a test (or a fake wait) moves them;
* FakeAlarm: the one-call loop's alarm, raised by the fake clock at the time it was set to (the real one raises it
  a little early, alarm.py);
* FakeLink: SupervisorLink's interface over a recorded list of records that arrive at given times, a slot of plain
  ints that records every progress store, and a lease that ends at a given time;
* DeadLetters: a DeadLetterWriter that keeps what it was given;
* RecordingHandler: a handler that keeps the offsets it was called with and fails on some;
* FakeConsumer: a GuardedConsumer over a few partitions of messages held in memory (real confluent_kafka Messages),
  for a worker's shell (Worker, SharedWorker) run in the test's process through fake ProcessEdges (edges_for).

A loop under test is built exactly as worker.py builds it, with the real Failures and Admission on the fake link.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage
from fake_record import FakeRecord

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import partition_log
from marshal_workers.handlers.app import App, HandlerSpec, Message
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.hooks import Hooks
from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.protocol import done_set
from marshal_workers.runtime.channel import SLOT_SIZE, Field, WorkerSpec
from marshal_workers.runtime.worker.admission import Admission
from marshal_workers.runtime.worker.batch_loop import BatchLoop
from marshal_workers.runtime.worker.failures import Failures
from marshal_workers.runtime.worker.instrumentation import LatencySampling
from marshal_workers.runtime.worker.lane_runner import LaneRunner
from marshal_workers.runtime.worker.one_call_loop import OneCallLoop
from marshal_workers.runtime.worker.process import ProcessEdges

TOPIC, PARTITION = "orders", 3


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.alarms: list[FakeAlarm] = []
        self._lock = threading.Lock()  # handlers on lanes read it from their threads

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += max(seconds, 0.0)
        for alarm in self.alarms:
            alarm.tick(self.now)


class FakeAlarm:
    """Alarm's interface (due, set, raise_now) on the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.due = [True]
        self.at = math.inf
        clock.alarms.append(self)

    def set(self, at: float) -> None:
        self.at = at
        self.due[0] = self.clock() >= at

    def raise_now(self) -> None:
        self.due[0] = True

    def tick(self, now: float) -> None:
        if now >= self.at:
            self.due[0] = True


class Fields(list):  # type: ignore[type-arg]
    """The slot's int64 fields as a list that tells ``on_progress`` of every store of NEXT_OFFSET."""

    def __init__(self, start: int, on_progress: Callable[[int], None]) -> None:
        super().__init__([0] * SLOT_SIZE)
        super().__setitem__(Field.NEXT_OFFSET, start)
        self.on_progress = on_progress

    def __setitem__(self, index: Any, value: Any) -> None:
        if index == Field.NEXT_OFFSET:
            self.on_progress(value)
        super().__setitem__(index, value)


class FakeOutbox:
    def __init__(self) -> None:
        self.pending = False
        self.flushes = 0

    def flush(self) -> None:
        self.pending = False
        self.flushes += 1


class DeadLetters:
    """A DeadLetterWriter that keeps the offsets it was given."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self._lock = threading.Lock()

    def write(self, _topic: str, records: Sequence[Any], _headers: Any) -> None:
        with self._lock:
            self.offsets.extend(r.offset() for r in records)

    def close(self) -> None:
        pass


def records(offsets: Sequence[int], keys: Sequence[bytes | None] | None = None) -> list[Any]:
    return [FakeRecord(TOPIC, PARTITION, o, key=None if keys is None else keys[i]) for i, o in enumerate(offsets)]


class FakeLink:
    """SupervisorLink's interface (link.py) for a loop in a unit test.

    ``arrivals``: (fake time, record), in offset order: a fetch returns what has arrived; with nothing there it
    waits (moves the clock) up to its ``wait`` for the next arrival.  The lease holds until ``lease_end`` (fake
    seconds); past it, waiting for the lease returns False (a stop, the third time: the supervisor's).  ``stop_when(link)`` is
    asked at every housekeeping: True asks the worker to stop, as the supervisor's stop flag does.
    """

    def __init__(
        self,
        clock: FakeClock,
        arrivals: Sequence[tuple[float, Any]],
        start_offset: int = 0,
        lease_end: float = math.inf,
        stop_when: Callable[[FakeLink], bool] = lambda _link: False,
        claims: Sequence[ClaimAnswer] = (),
        settings: Settings | None = None,
    ) -> None:
        self.clock = clock
        self.spec = WorkerSpec("app:app", TOPIC, PARTITION, start_offset, settings or Settings(group="billing"))
        self.arrivals = list(arrivals)
        self.lease_end = lease_end
        self.stop_when = stop_when
        self.claims = list(claims)  # the supervisor's answers to AMO claims, in turn; CLAIMED once they run out
        self.progress: list[tuple[float, int]] = []  # every store of NEXT_OFFSET: (when, offset)
        self.published: list[tuple[float, int, list[int]]] = []  # every done set published: (when, offset, runs)
        self.claimed: list[int] = []  # the ends of the AMO batches claimed
        self.fields = Fields(start_offset, lambda offset: self.progress.append((self.clock(), offset)))
        self.log = partition_log(logging.getLogger("tests.worker_fakes"), "billing", TOPIC, PARTITION)
        self.outbox = FakeOutbox()
        self.outcomes = OutcomeCounts()
        self.consumer = None
        self.stopping = False
        self.recycle_reason: str | None = None
        self.lease_until = int(lease_end * 1000) if lease_end != math.inf else 2**62
        self.next_housekeeping = 0.0
        self.not_ours: set[int] = set()
        self.handled = 0
        self.lapsed_waits = 0  # times a loop waited for the lease after it ended
        self._alarm: FakeAlarm | None = None

    # stopping
    def watch_with(self, alarm: Any) -> None:
        self._alarm = alarm

    def request_stop(self) -> None:
        self.stopping = True
        if self._alarm is not None:
            self._alarm.raise_now()

    # lifecycle limits
    def fetch_size(self, batch_size: int) -> int:
        return batch_size

    def count_handled(self, count: int) -> None:
        self.handled += count

    # reading
    def fetch(self, most: int, wait: float = 0.1) -> list[Any]:
        self.housekeeping()
        if self.arrivals and self.arrivals[0][0] > self.clock():
            self.clock.advance(min(wait, self.arrivals[0][0] - self.clock()))
        elif not self.arrivals:
            self.clock.advance(wait)
        got = []
        while self.arrivals and len(got) < most and self.arrivals[0][0] <= self.clock():
            got.append(self.arrivals.pop(0)[1])
        return got

    def read_range(self, end: int) -> list[Any] | None:
        raise NotImplementedError  # give_up_on is not run on the fake

    def passes_by(self, offset: int) -> bool:
        if offset not in self.not_ours:
            return False
        self.not_ours.discard(offset)
        self.outcomes.other_group += 1
        return True

    # the lease
    def lease_valid(self, now: float) -> bool:
        return now < self.lease_end

    def lease_holds(self) -> bool:
        return self.clock() < self.lease_end or self.wait_for_lease()

    def wait_for_lease(self) -> bool:
        if self.clock() < self.lease_end:
            return True
        self.lapsed_waits += 1  # the real link waits here until the lease is back or a stop comes
        if self.lapsed_waits >= 3:
            self.stopping = True  # the lease never comes back: the supervisor stops the worker in the end
        return False

    def next_look(self) -> float:
        return min(self.lease_until / 1000, self.next_housekeeping)

    # the pipe
    def claim_batch(self, end: int) -> WorkerExit | None:
        answer = self.claims.pop(0) if self.claims else ClaimAnswer.CLAIMED
        if answer is ClaimAnswer.REFUSED:
            return WorkerExit.LOST
        self.claimed.append(end)
        return None

    def send_outcomes(self) -> None:
        self.outcomes.take()

    # housekeeping and progress
    def housekeeping(self) -> None:
        now = self.clock()
        if now >= self.next_housekeeping:
            self.next_housekeeping = now + 0.5
        if self.stop_when(self):
            self.stopping = True

    def sleep(self, seconds: float) -> bool:
        if self.stopping:
            return False
        self.clock.advance(seconds)
        self.housekeeping()
        return not self.stopping

    def set_title(self, offset: int) -> None:
        pass

    def report_sent(self, next_offset: int) -> int:
        self.outbox.flush()
        self.fields[Field.NEXT_OFFSET] = next_offset
        return 0

    def publish_done(self, progress: int, runs: list[int]) -> None:
        self.published.append((self.clock(), progress, list(runs)))

    # what the tests read
    @property
    def next_offset(self) -> int:
        return int(self.fields[Field.NEXT_OFFSET])

    def reported_done(self) -> set[int]:
        """Every offset the last published position (progress and done set) says is done."""
        _, progress, runs = self.published[-1]
        done = set(range(self.spec.start_offset, progress))
        for start, stop in done_set.decode(progress, runs):
            done.update(range(start, stop))
        return done


def failures_on(link: FakeLink, dead_letters: DeadLetters, max_age_ms: int = 0) -> Failures:
    return Failures(link, dead_letters, Hooks(), max_age_ms)  # type: ignore[arg-type]


def admission_on(link: FakeLink, failures: Failures) -> Admission:
    return Admission(link, failures, None, 0)  # type: ignore[arg-type]


def run_partition_loop(loop: str, link: FakeLink, dead_letters: DeadLetters, handler: HandlerSpec) -> WorkerExit:
    """Run the partition worker's ``loop`` ("one call", "batch", or one whose name starts with "lanes") on the fake
    link, as worker.py builds it."""
    clock, failures = link.clock, failures_on(link, dead_letters)
    if loop.startswith("lanes"):
        return LaneRunner(link, failures, handler, clock=clock).run()  # type: ignore[arg-type]
    sampling = LatencySampling(handler)
    if loop == "one call":
        return OneCallLoop(link, failures, admission_on(link, failures), sampling, FakeAlarm(clock)).run()  # type: ignore[arg-type]
    return BatchLoop(link, failures, admission_on(link, failures), sampling).run()  # type: ignore[arg-type]


class RecordingHandler:
    """A handler of TOPIC that records the offsets it handled and fails on ``failing`` with ``error``."""

    def __init__(self, failing: Sequence[int] = (), error: Callable[[], Exception] = lambda: ValueError("bad")) -> None:
        self.failing, self.error = set(failing), error
        self.handled: list[int] = []
        self.calls: list[int] = []

    def handle(self, msg: Message) -> None:
        self.calls.append(msg.offset)
        if msg.offset in self.failing:
            raise self.error()
        self.handled.append(msg.offset)

    def handle_batch(self, msgs: list[Message]) -> None:
        for msg in msgs:
            self.handle(msg)


class FakeConsumer:
    """GuardedConsumer's interface over messages in memory: ``offsets`` per partition of ``topic`` (gaps allowed:
    compaction, markers), each partition ending one past its last offset.  At a partition's end a fetch gives a
    PARTITION_EOF event once, as a consumer with enable.partition.eof does; then nothing (without waiting).
    ``on_fetch(consumer)`` runs as each fetch answers (``at``: where the next one reads): a test does there what
    the world does meanwhile (a stop, a renewal)."""

    def __init__(
        self,
        topic: str,
        offsets: dict[int, Sequence[int]],
        on_fetch: Callable[[FakeConsumer], None] = lambda _consumer: None,
    ) -> None:
        self.topic = topic
        self.offsets = {p: sorted(found) for p, found in offsets.items()}
        self.on_fetch = on_fetch
        self.at: tuple[int, int] | None = None  # (partition, next offset) read from; None: unassigned
        self.fetched: list[int] = []  # the offsets of every message a fetch returned
        self.fetches = 0
        self.last_got = 0  # the messages the last fetch returned
        self.closed = False
        self._eof_told: tuple[int, int] | None = None

    def end(self, partition: int) -> int:
        found = self.offsets.get(partition, [])
        return found[-1] + 1 if found else 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        (tp,) = partitions
        self.at = (tp.partition, tp.offset)

    def unassign(self) -> None:
        self.at = None

    def seek(self, tp: TopicPartition) -> None:
        self.at = (tp.partition, tp.offset)

    def read_without_gaps_if_the_broker_skips(self, timeout: float) -> None:
        pass

    def consume(self, most: int = 1, timeout: float = -1) -> list[KafkaMessage]:
        got = self._fetch(most)
        self.fetches += 1
        self.last_got = sum(1 for m in got if m.error() is None)
        self.on_fetch(self)
        return got

    def _fetch(self, most: int) -> list[KafkaMessage]:
        if self.at is None:
            return []
        partition, position = self.at
        found = [o for o in self.offsets.get(partition, []) if o >= position][:most]
        got = [
            KafkaMessage(
                topic=self.topic, partition=partition, offset=o, key=None, value=b"{}", timestamp=(1, 1_700_000_000_000)
            )
            for o in found
        ]
        self.fetched += found
        position = found[-1] + 1 if found else max(position, self.end(partition))
        self.at = (partition, position)
        if position >= self.end(partition) and len(got) < most and self._eof_told != self.at:
            self._eof_told = self.at
            got.append(
                KafkaMessage(
                    topic=self.topic, partition=partition, offset=position, error=KafkaError(KafkaError._PARTITION_EOF)
                )
            )
        return got

    def poll(self, timeout: float = -1) -> KafkaMessage | None:
        """One message, or None (a worker's consumer reports no end-of-partition events)."""
        got = [m for m in self.consume(1, timeout) if m.error() is None]
        return got[0] if got else None

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, self.end(tp.partition)

    def fetched_end(self, _topic: str, partition: int) -> int:
        return self.end(partition)

    def close(self) -> None:
        self.closed = True


def edges_for(app: App, consumer: FakeConsumer, dead_letters: DeadLetters) -> ProcessEdges:
    """A worker process's edges in a unit test: no process-wide set-up (signals, logging, death with the parent),
    ``app`` as the loaded app, ``consumer`` as its reader and ``dead_letters`` as its dead-letter writer."""
    return ProcessEdges(
        start=lambda *_args: None,
        load=lambda _path: app,
        consumer=lambda *_args, **_options: consumer,
        dead_letters=lambda _settings: dead_letters,  # type: ignore[arg-type,return-value]
    )
