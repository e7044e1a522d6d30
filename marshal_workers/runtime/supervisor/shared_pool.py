"""Shared partitions in a supervisor: the range-lease policy and the shared workers that use the leases.

Whole partitions are claimed, heartbeated and handed to one worker each by
the supervisor's partition policy.  A shared handler's topic is never claimed
whole: this pool runs ``processes`` workers for it and keeps each of them
supplied with two leased ranges (the one it handles and the next, so it never
waits for a claim), all through the coordination log (docs/shared-partitions.md):

* claim: ``claim_ranges`` for the free ranges the fold shows, spread over the
  partitions and picked at random among the lowest so members do not all race
  for the same one;
* renew: ``renew_ranges`` every third of the pending timeout, for every lease held whose deadline has not
  passed (one past it may have lapsed in the log: it is left to lapse);
* settle: ``ack_ranges`` when a worker is done with a range (its failed and
  dead-lettered offsets included), ``cancel_ranges`` for ranges it never began;
* progress: ``progress_ranges`` every ``PROGRESS_EVERY_S`` for the ranges in hand that moved on (one record
  per topic for all of them), from what the workers report on their pipes and store in their range slots: what
  it marks is done however the lease ends, so a lapse (a frozen or killed supervisor) gives back only the rest;
* on a worker's crash: the range it was handling is acked with the offsets it
  had done (its range slot says how far) done and every other one failed (at
  least once: delivered again with one try more; at most once: lost), the
  others cancelled.

Each of those decisions (and the deadline's safety margin) is the range-lease member's, which the HTTP
service shares (protocol/range_member.py); their order (claim, renew, settle, progress) is the member core's
``RangeLeasing`` (member/range_leasing.py), which the simulator drives too.  This pool is its shell: it does the
writes, reads the clocks and keeps the workers supplied.  The pool never blocks the supervisor's loop: writes go
through :class:`InFlightWrites` and their verdicts come back in a later pass.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import ContextLog
from marshal_workers.handlers.app import App, HandlerSpec, Mode
from marshal_workers.kafka.committed_offsets import OffsetStore, PartitionEnds
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.member.range_leasing import RangeLeasing
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.observe.metrics import SharedStats
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_member import RangeMember
from marshal_workers.protocol.range_sizing import RangeSizing
from marshal_workers.protocol.restarts import RestartPolicy
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.channel import RangeSlot
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
from marshal_workers.runtime.supervisor.assignments import signal_process
from marshal_workers.runtime.worker.shared_worker import SharedWorkerSpec, shared_worker_main

T = TypeVar("T")


@dataclass
class SharedWorkerHandle:
    index: int
    process: BaseProcess | None = None
    connection: Connection | None = None
    leases: list[PoolLease] = field(default_factory=list)
    crashes_in_a_row: int = 0
    restart_at: float | None = 0.0  # monotonic; None: not to be (re)started
    handled: int = 0
    slot: RangeSlot | None = None  # its position in the range in hand (shared memory), for its progress
    settled_at: tuple[int, int] | None = None  # (partition, end) of the last range it settled: where it reads next
    # The slot as read before its pipe was last drained: the worker says a failure on the pipe before its slot moves
    # past it, so every failure below this position is in what the pool has read (a slot read after the drain may
    # be past a failure still in the pipe, and its progress would mark that offset done).
    slot_seen: tuple[int, int, int] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None


@dataclass
class SharedCounters:
    """What became of the messages (the leases' counts are the core's: RangeLeasing.counters)."""

    handled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    worker_restarts: int = 0


@dataclass
class SharedTopic:
    """One shared handler's topic: its workers and what the pool knows of its partitions."""

    handler: HandlerSpec
    workers: list[SharedWorkerHandle]
    # Partition ends, as last asked (ListOffsets; ends.ends).  They may under-report the end (Tansu,
    # docs/brokers.md): the end that workers' fetches saw, as acks carry it into the log, counts too.
    ends: PartitionEnds = field(default_factory=PartitionEnds)
    initial: dict[int, int] = field(default_factory=dict)  # where a partition never leased starts
    counters: SharedCounters = field(default_factory=lambda: SharedCounters())
    leasing: RangeLeasing[SharedWorkerHandle] = field(init=False)  # its leases: claims, renewals, settlements

    def lease_through(self, shell: SharedPool, rng: random.Random, log: ContextLog) -> None:
        """Its leases, as long as the handler's pending timeout, sized by the workers' measured rates."""
        handler = self.handler
        lease_ms = round(handler.pending_timeout * 1000)
        member = RangeMember(handler.topic, lease_ms, handler.mode is Mode.AMO)
        sizing = RangeSizing(handler.range_size, lease_ms, adaptive=handler.adaptive_ranges)
        self.leasing = RangeLeasing(member, sizing, self.workers, shell, rng, log)


class SharedPool:
    """The shared handlers of one supervisor: their workers and their leases."""

    def __init__(
        self,
        app: App,
        app_path: str,
        settings: Settings,
        log: ContextLog,
        partition_counts: Callable[[str], int | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: monotonic seconds, the clock of the workers' lease deadlines (channel.monotonic_ms); a unit
        test's fake clock."""
        self.app_path = app_path
        self.settings = settings
        self.log = log
        self.partition_counts = partition_counts
        self.restart_policy = RestartPolicy(limit=settings.crash_limit)
        self.topics = {
            topic: SharedTopic(handler, [SharedWorkerHandle(i) for i in range(settings.shared_processes)])
            for topic, handler in app.handlers.items()
            if handler.shared
        }
        self.stopping = False
        self.record_outcomes: Callable[[str, dict[str, Any]], None] | None = None  # workers' reports (metrics)
        self.boot_failed = False  # a worker could not start (an on_worker_start hook failed)
        self._context: BaseContext | None = None
        self.rate_buckets: dict[str, Any] = {}  # rate-limited topic -> its token bucket (set by the supervisor)
        self._coordinator: Coordinator | None = None
        self._writes: InFlightWrites | None = None
        self._offsets: OffsetStore | None = None
        self._clock = clock
        rng = random.Random()
        for shared in self.topics.values():
            shared.lease_through(self, rng, log)

    def attach(
        self, context: BaseContext, coordinator: Coordinator, writes: InFlightWrites, offsets: OffsetStore
    ) -> None:
        """The supervisor's fork server and Kafka clients, once they exist."""
        self._context, self._coordinator, self._writes, self._offsets = context, coordinator, writes, offsets

    # ------------------------------------------------------------- the loop

    def waitables(self) -> list[object]:
        """What the supervisor's loop waits on for us: workers' pipes and exits."""
        found: list[object] = []
        for shared in self.topics.values():
            for worker in shared.workers:
                if worker.process is not None:
                    found.append(worker.process.sentinel)
                if worker.connection is not None:
                    found.append(worker.connection)
        return found

    def step(self) -> None:
        """One pass of the supervisor's loop: workers' news, exits, starts, then claims, renewals, settlements."""
        if not self.topics or self._coordinator is None:
            return
        now = self._clock()
        for topic, shared in self.topics.items():
            for worker in shared.workers:
                self._read_worker(topic, shared, worker, now)
                self._reap(topic, shared, worker, now)
                if worker.process is None and worker.restart_at is not None and worker.restart_at <= now:
                    self._start_worker(topic, worker)
            self._ask_high_watermarks(topic, shared, now)
            # ms in monotonic_ms's unit (channel.py): the clock the workers check their leases' deadlines on
            shared.leasing.step(now, int(now * 1000), self._require_coordinator().now_ms())

    def begin_stop(self) -> None:
        """Stop claiming; every worker finishes the range in hand and gives the others back."""
        self.stopping = True
        for shared in self.topics.values():
            shared.leasing.stopping = True
            for worker in shared.workers:
                worker.restart_at = None
                if worker.connection is not None:
                    try:
                        worker.connection.send(Stop())
                    except OSError:
                        pass

    def stopped(self) -> bool:
        """Every worker gone and every lease settled in the log (or given up on)."""
        return all(worker.process is None for shared in self.topics.values() for worker in shared.workers) and all(
            shared.leasing.stopped() for shared in self.topics.values()
        )

    def hold_back(self, topics: set[str]) -> None:
        """Lease no more ranges of ``topics`` (an operator paused them, or drained us); the others again."""
        for topic, shared in self.topics.items():
            shared.leasing.held_back = topic in topics

    def signal_workers(self, signum: int) -> None:
        for shared in self.topics.values():
            for worker in shared.workers:
                signal_process(worker.process, signum)

    def kill_workers(self) -> None:
        """Past the shutdown timeout: kill every worker; what they held is settled once more, then left to lapse."""
        for shared in self.topics.values():
            shared.leasing.last_tries = True
        self.signal_workers(signal.SIGKILL)

    def state(self) -> list[dict[str, Any]]:
        """For the SIGUSR1 dump: per shared topic, its workers and their leases."""
        return [
            {
                "topic": topic,
                "workers": [
                    {
                        "pid": None if w.process is None else w.process.pid,
                        "leases": [[r.partition, r.start, r.end, r.tries, r.started] for r in w.leases],
                        "handled": w.handled,
                        "range_size": shared.leasing.sizing.size_for(w.index),
                    }
                    for w in shared.workers
                ],
            }
            for topic, shared in self.topics.items()
        ]

    # -------------------------------------------------------------- workers

    def _start_worker(self, topic: str, worker: SharedWorkerHandle) -> None:
        assert self._context is not None
        ours, theirs = self._context.Pipe(duplex=True)
        worker.slot = RangeSlot.create(self._context)
        process = self._context.Process(  # type: ignore[attr-defined]
            target=shared_worker_main,
            args=(
                SharedWorkerSpec(self.app_path, topic, worker.index, self.settings),
                theirs,
                self.rate_buckets.get(topic),
                worker.slot.array,
            ),
            name=f"shared worker {topic} #{worker.index}",
            daemon=True,
        )
        process.start()
        theirs.close()
        worker.process, worker.connection, worker.restart_at = process, ours, None
        worker.slot_seen = None

    def _read_worker(self, topic: str, shared: SharedTopic, worker: SharedWorkerHandle, now: float) -> None:
        """Its slot (``slot_seen``), then everything on its pipe: in that order, so that every failure below the
        slot's position has been read (progress_of)."""
        worker.slot_seen = worker.slot.read() if worker.slot is not None else None
        connection = worker.connection
        if connection is None:
            return
        try:
            while connection.poll(0):
                self._on_worker_message(topic, shared, worker, connection.recv(), now)
        except (EOFError, OSError):
            pass  # it exited: _reap settles what it held

    def _on_worker_message(
        self, topic: str, shared: SharedTopic, worker: SharedWorkerHandle, message: FromSharedWorker, now: float
    ) -> None:
        if isinstance(message, Outcomes):
            if isinstance(message.counts, dict) and self.record_outcomes is not None:
                self.record_outcomes(topic, message.counts)
            return
        if not isinstance(message, (Started, RangeProgress, Settled, Abandoned, Returned)):
            return
        leased = next((r for r in worker.leases if r.partition == message.partition and r.start == message.start), None)
        if leased is None:
            return
        if isinstance(message, Started):
            leased.started = True
            return
        if isinstance(message, RangeProgress):
            leased.started = True
            if leased.start <= message.upto <= leased.end and message.upto >= leased.upto:
                leased.upto, leased.failed, leased.dead = message.upto, message.failed, message.dead
            return
        leasing = shared.leasing
        if isinstance(message, Settled):
            messages = message.handled + len(message.failed) + len(message.dead)
            leasing.settled(
                worker, leased, message.end, message.failed, message.dead, message.high, messages, message.busy_ms, now
            )
            worker.handled += message.handled
            worker.crashes_in_a_row = 0
            shared.counters.handled += message.handled
            shared.counters.failed += len(message.failed)
            shared.counters.dead_lettered += len(message.dead)
        elif isinstance(message, Returned):
            leasing.returned(worker, leased)
        else:
            leasing.abandoned(worker, leased)  # its lease lapses in the log: handled again (ALO) or lost (AMO)

    def _reap(self, topic: str, shared: SharedTopic, worker: SharedWorkerHandle, now: float) -> None:
        process = worker.process
        if process is None or process.is_alive():
            return
        self._read_worker(topic, shared, worker, now)  # what it said before it went, and its slot as it left it
        process.join()
        code = process.exitcode if process.exitcode is not None else -1
        process.close()
        if worker.connection is not None:
            worker.connection.close()
        worker.process = worker.connection = None
        worker.settled_at = None  # its successor's consumer starts nowhere
        shared.leasing.worker_died(worker)  # what it began and did not report done: one try more each
        if code == WorkerExit.BOOT_ERROR:
            self.log.error("a shared worker for %s could not start (see its error above): stopping", topic)
            self.boot_failed = True  # every worker would fail the same way: the supervisor stops
            return
        if self.stopping:
            return
        if code not in (WorkerExit.STOPPED, WorkerExit.SUPERVISOR_GONE):
            worker.crashes_in_a_row += 1
        delay = self.restart_policy.delay(max(worker.crashes_in_a_row, 1)) or self.settings.sick_cooldown
        self.log.warning("shared worker %s #%d exited (code %s): restarting in %.1fs", topic, worker.index, code, delay)
        shared.counters.worker_restarts += 1
        worker.restart_at = now + (0.0 if code == WorkerExit.STOPPED else delay)

    # ------------------------------------------- the shell RangeLeasing drives

    def holder(self) -> MemberId:
        coordinator = self._require_coordinator()
        return MemberId(coordinator.client, coordinator.instance)

    def fields(self) -> dict[str, Any]:
        return self._require_coordinator().record_fields()

    def read(self, query: Callable[[WorldState], T]) -> T:
        return self._require_coordinator().read(query)

    def ends(self, topic: str) -> dict[int, int]:
        return self.topics[topic].ends.ends

    def initial(self, topic: str) -> dict[int, int]:
        return self.topics[topic].initial

    def learn_starts(self, topic: str, partitions: list[int]) -> None:
        self._require_offsets().learn_start_offsets(topic, partitions, self.topics[topic].initial, self.log)

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        assert self._writes is not None
        self._writes.submit(what, records, on_verdicts, on_failure)

    def leased(self, worker: SharedWorkerHandle, leased: PoolLease) -> None:
        self._tell(worker, RangeLeased(leased.partition, leased.start, leased.end, leased.deadline_ms, leased.tries))

    def renewed(self, worker: SharedWorkerHandle, leased: PoolLease) -> None:
        self._tell(worker, Renewed(leased.partition, leased.start, leased.deadline_ms))

    def dropped(self, worker: SharedWorkerHandle, leased: PoolLease) -> None:
        pass  # the worker said so itself, or is gone

    def progress_of(self, worker: SharedWorkerHandle, leased: PoolLease) -> int:
        """How far ``leased`` is done (every offset below, but its failed ones): its worker's last RangeProgress, or
        further if its range slot, as read before the pipe was drained, says so (the failures below that position came
        on the pipe before it, so the pool has read them)."""
        upto = max(leased.upto, leased.start)
        found = worker.slot_seen if leased.started else None
        if found is not None and found[:2] == (leased.partition, leased.start):
            upto = max(upto, min(found[2], leased.end))
        return upto

    def _tell(self, worker: SharedWorkerHandle, message: ToSharedWorker) -> None:
        if worker.connection is None:
            return
        try:
            worker.connection.send(message)
        except OSError:
            pass  # it is exiting: _reap settles its leases

    # --------------------------------------------------------- partition ends

    def _ask_high_watermarks(self, topic: str, shared: SharedTopic, now: float) -> None:
        """Keep each partition's end offset fresh, without blocking."""
        shared.ends.refresh(self._require_offsets(), topic, self.partition_counts(topic), now)

    def stats(self) -> list[SharedStats]:
        """For the metrics endpoint (its thread): counts of ours, low-water marks and losses from the log."""
        if self._coordinator is None or not self.topics:
            return []
        now_ms = round(time.time() * 1000)
        marks = self._coordinator.read(lambda world: world.shared_marks(now_ms))
        found = []
        for topic, shared in list(self.topics.items()):
            c, leases = shared.counters, shared.leasing.counters
            found.append(
                SharedStats(
                    topic=topic,
                    leases_held=shared.leasing.leases_held(),
                    workers=sum(1 for w in shared.workers if w.process is not None),
                    ranges={
                        "claimed": leases.claimed,
                        "refused": leases.refused,
                        "acked": leases.acked,
                        "ack_refused": leases.acks_refused,
                        "cancelled": leases.cancelled,
                        "abandoned": leases.abandoned,
                    },
                    messages={"handled": c.handled, "failed": c.failed, "dead_lettered": c.dead_lettered},
                    worker_restarts=c.worker_restarts,
                    low_water_marks={p: low for (t, p), (low, _) in marks.items() if t == topic},
                    lost={p: lost for (t, p), (_, lost) in marks.items() if t == topic},
                )
            )
        return found

    def _require_coordinator(self) -> Coordinator:
        assert self._coordinator is not None
        return self._coordinator

    def _require_offsets(self) -> OffsetStore:
        assert self._offsets is not None
        return self._offsets

    def low_water_marks(self) -> list[tuple[str, int, int]]:
        """(topic, partition, low-water mark) of every shared partition: committed as the group's offsets."""
        coordinator = self._require_coordinator()

        def marks(world: WorldState) -> list[tuple[str, int, int]]:
            return [
                (topic, partition, shared.low)
                for (topic, partition), shared in world.shared.items()
                if topic in self.topics and shared.low is not None
            ]

        return coordinator.read(marks)
