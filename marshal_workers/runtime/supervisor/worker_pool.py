"""The worker pool: forking, stopping, reaping and restarting the workers of whole partitions.

One worker per partition held, forked from a fork server started before any
Kafka client exists (librdkafka is not fork-safe), with the application
preloaded.  What a worker's exit means (release, restart with backoff, apply
a time limit) is decided here too; what an exit means for the partition
(forget it, release it, as sick or handed over) is the member core's
(member/partition_holding.py ``settle_exit``), and the release itself the
partition claims' (partition_claims.py), asked through :class:`Releases`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.handlers.app import App, Mode, OnError
from marshal_workers.member.partition_holding import settle_exit
from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol import done_set
from marshal_workers.protocol.health import PartitionHealth
from marshal_workers.protocol.restarts import RestartPolicy
from marshal_workers.runtime.channel import Field, Slot, WorkerSpec, monotonic_ms
from marshal_workers.runtime.supervisor.assignments import Assignment, Table
from marshal_workers.runtime.worker.worker import WorkerExit, worker_main

_log = logging.getLogger(__name__)
START_BUDGET_S = 0.02  # seconds per pass of the loop spent starting the workers of new claims


class Releases(Protocol):
    """What the pool asks of the partition claims when a worker exits."""

    def release(self, assignment: Assignment, sick: bool = False) -> None: ...
    def release_handed_over(self, assignment: Assignment) -> None: ...
    def forget(self, assignment: Assignment) -> None: ...
    def owns(self, assignment: Assignment) -> bool: ...


StartProcess = Callable[[WorkerSpec, Slot, Any, str], tuple[BaseProcess, Connection]]
"""Start a worker process: (its spec, its slot, its topic's rate bucket or None, its name) -> (process, our pipe)."""


def fork_server_starter(context: BaseContext) -> StartProcess:
    """Workers forked from ``context``'s fork server, each with a duplex pipe to us."""

    def start(spec: WorkerSpec, slot: Slot, rate_bucket: Any, name: str) -> tuple[BaseProcess, Connection]:
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(  # type: ignore[attr-defined]
            target=worker_main, args=(spec, slot.array, theirs, rate_bucket), name=name, daemon=True
        )
        process.start()
        theirs.close()
        return process, ours

    return start


class WorkerPool:
    """The supervisor's component that runs the workers of whole partitions (component.py's interface)."""

    def __init__(
        self,
        table: Table,
        releases: Releases,
        app: App,
        app_path: str,
        settings: Settings,
        time_limits: dict[str, tuple[float, float]],
        counters: Counters,
        log: Any,
        start_process: StartProcess,
        fail: Callable[[int], None],
        rate_buckets: dict[str, Any] | None = None,
    ) -> None:
        """``time_limits``: (soft, hard) seconds per topic; ``fail(exit_code)``: a worker could not start, so the
        supervisor stops with that code; ``rate_buckets``: rate-limited topic -> its token bucket (rate_limits.py)."""
        self.table = table
        self.releases = releases
        self.app = app
        self.app_path = app_path
        self.settings = settings
        self.time_limits = time_limits
        self.counters = counters
        self.log = log
        self._start_process = start_process
        self._fail = fail
        self.rate_buckets = rate_buckets or {}
        self.restart_policy = RestartPolicy(limit=settings.crash_limit)

    # --------------------------------------------------------- the component

    def waitables(self) -> list[object]:
        """The exit sentinels of the workers running."""
        return [a.process.sentinel for a in self.table.assignments.values() if a.process is not None]

    def step(self, now: float) -> None:
        """Start the workers of new claims, reap those that exited, enforce time limits, restart those due."""
        self._start_queued_workers()
        self._reap_workers()
        self._watch_calls()
        self._enforce_time_limits()
        self._restart_due_workers(now)

    def begin_stop(self) -> None:
        """Nothing: the partition claims ask every worker to finish what it holds (the member core's begin_stop);
        each partition is released as its worker is reaped here."""

    def stopped(self) -> bool:
        """Every partition released (or forgotten): its worker exited."""
        return not self.table.assignments

    def signal_workers(self, signum: int) -> None:
        for assignment in self.table.assignments.values():
            assignment.signal_worker(signum)

    def kill_workers(self) -> None:
        """SIGKILL every worker; each is released at its last progress when reaped."""
        self.signal_workers(signal.SIGKILL)

    # ------------------------------------------------------------- workers

    def _start_worker(self, assignment: Assignment) -> None:
        # AMO: messages before claimed_end were claimed; whatever became of them, they are never handled again.
        # ALO: what the last worker did out of order is skipped (its done set, as published in the slot).
        offset, runs = assignment.slot.position()
        start, skip = done_set.resume_past(max(offset, assignment.claimed_end), done_set.decode(offset, runs))
        slot = assignment.slot
        slot.set(Field.NEXT_OFFSET, start)
        slot.set(Field.CALL_STARTED_MS, 0)  # a killed worker's call must not time the new one out
        slot.set(Field.STOP_REQUESTED, 0)
        slot.set(Field.IN_FLIGHT, 0)
        slot.set(Field.HANDLING_END, 0)  # nor look like a call the new one is in
        assignment.call = None
        spec = WorkerSpec(
            self.app_path,
            assignment.topic,
            assignment.partition,
            start,
            self.settings,
            assignment.give_up_on,
            assignment.give_up_reason,
            skip=tuple(skip),
        )
        assignment.give_up_on = None
        if assignment.restart_at is not None:
            self.counters.worker_restarts[assignment.restart_reason] += 1
        name = f"worker {assignment.topic}[{assignment.partition}]"
        process, ours = self._start_process(spec, assignment.slot, self.rate_buckets.get(assignment.topic), name)
        assignment.process, assignment.connection = process, ours
        assignment.started_offset, assignment.restart_at = start, None
        assignment.health = PartitionHealth()  # a new worker is judged afresh

    def _start_queued_workers(self) -> None:
        """Start the workers of partitions just claimed, for up to START_BUDGET_S per pass of the loop.

        A fork waits for the fork server, which competes for the CPU with every worker starting: starting
        a hundred in one pass once held the loop for seconds, and the heartbeats with it.
        """
        budget_ends = time.monotonic() + START_BUDGET_S
        while self.table.to_start and time.monotonic() < budget_ends:
            assignment = self.table.to_start.popleft()
            current = self.table.assignments.get(assignment.key) is assignment and not assignment.lost
            if current and assignment.process is None and self.table.running and not self.table.stop_signalled:
                self._start_worker(assignment)

    def _restart_due_workers(self, now: float) -> None:
        if not self.table.running:
            return
        for assignment in self.table.assignments.values():
            if assignment.restart_at is not None and assignment.restart_at <= now and assignment.process is None:
                self._start_worker(assignment)

    def _reap_workers(self) -> None:
        """Deal with the workers that exited: only those whose sentinel the loop's wait found readable (asking
        every process is_alive() built a selector per worker on every pass of the loop)."""
        ready = self.table.ready
        for assignment in list(self.table.assignments.values()):
            process = assignment.process
            if process is None or process.sentinel not in ready or process.is_alive():
                continue
            process.join()
            code = process.exitcode
            process.close()
            assignment.process = None
            if assignment.connection is not None:
                assignment.connection.close()
                assignment.connection = None
            self._after_exit(assignment, code if code is not None else -1)

    def _after_exit(self, assignment: Assignment, code: int) -> None:
        where = f"{assignment.topic}[{assignment.partition}]"
        if code == WorkerExit.BOOT_ERROR and not assignment.lost:
            self.log.error("the worker for %s could not start (see its error above): stopping", where)
            self.releases.release(assignment)
            self._fail(ExitCode.WORKER_BOOT_ERROR)  # the others would fail the same way: the supervisor stops
        elif settle_exit(assignment, self.releases, code == WorkerExit.RELEASE, stopping=not self.table.running):
            return  # forgotten (lost), released as sick, handed over, or released at its progress (a stop)
        elif code == WorkerExit.LOST:
            self._after_lost_claim(assignment)
        elif assignment.timed_out is not None:
            self._after_time_limit(assignment)
        elif code == WorkerExit.RECYCLE and assignment.next_offset > assignment.started_offset:
            assignment.restart_at = time.monotonic()  # a lifecycle limit, not a crash: a fresh worker now
            assignment.restart_reason = "lifecycle"
            assignment.crashes_in_a_row = 0
        else:
            self._after_crash(assignment, code)

    def _after_crash(self, assignment: Assignment, code: int) -> None:
        made_progress = assignment.next_offset > assignment.started_offset
        assignment.crashes_in_a_row = 1 if made_progress else assignment.crashes_in_a_row + 1
        delay = self.restart_policy.delay(assignment.crashes_in_a_row)
        where = f"{assignment.topic}[{assignment.partition}]"
        in_hand = self._poison_in_hand(assignment) if delay is None and not made_progress else None
        if in_hand is not None:
            what = (
                "that message"
                if in_hand[1] - in_hand[0] == 1
                else f"its batch (offsets {in_hand[0]}..{in_hand[1] - 1})"
            )
            self.log.error(
                "worker for %s died %d times in a row at offset %d (%s): dead-lettering %s as WorkerLost",
                where,
                assignment.crashes_in_a_row,
                assignment.next_offset,
                _describe_exit(code),
                what,
            )
            assignment.give_up_on, assignment.give_up_reason = in_hand, "worker_lost"
            assignment.crashes_in_a_row = 0
            assignment.restart_at, assignment.restart_reason = time.monotonic(), "poison"
            return
        if delay is None:
            self.log.error(
                "worker for %s crashed %d times in a row: releasing it as sick", where, assignment.crashes_in_a_row
            )
            self.releases.release(assignment, sick=True)
            return
        self.log.warning(
            "worker for %s exited with %s at offset %d: restarting in %.1fs",
            where,
            _describe_exit(code),
            assignment.next_offset,
            delay,
        )
        assignment.restart_at, assignment.restart_reason = time.monotonic() + delay, "crash"

    def _poison_in_hand(self, assignment: Assignment) -> tuple[int, int] | None:
        """The offsets ``[first, end)`` a worker keeps dying on, to be dead-lettered rather than the partition
        released as sick; None if that is not what to do.

        At least once with on_error="dlq", one call at a time: one message per call, the message at the worker's
        progress; a batch, the batch of the call it died in (its slot still tells which).  At most once never
        hands a message out twice, so it cannot loop; on concurrent lanes, which call killed the worker is not
        known, so the partition is released as sick.
        """
        handler = self.app.handlers[assignment.topic]
        if handler.mode is not Mode.ALO or handler.on_error is not OnError.DLQ or handler.runs_on_lanes:
            return None
        if not handler.batch:
            return assignment.next_offset, assignment.next_offset + 1
        slot = assignment.slot
        first, end = slot.get(Field.CALL_FIRST_OFFSET), slot.get(Field.CALL_END_OFFSET)
        if slot.get(Field.CALL_STARTED_MS) <= 0 or not assignment.next_offset <= first < end:
            return None  # it died between calls, or the slot holds an older call: nothing known to be in hand
        return first, end

    def _watch_calls(self) -> None:
        """Note each worker's handler call in flight (every pass of the loop: a few reads of shared memory per
        partition)."""
        now = time.monotonic()
        for assignment in self.table.assignments.values():
            assignment.watch_call(now)

    def _enforce_time_limits(self) -> None:
        """Kill a worker whose handler call has run past the hard time limit (it may be stuck in C code)."""
        now_ms = monotonic_ms()
        for assignment in self.table.assignments.values():
            limit = self.time_limits[assignment.topic][1]
            started = assignment.slot.get(Field.CALL_STARTED_MS)
            if not limit or assignment.process is None or started <= 0 or assignment.timed_out is not None:
                continue
            if now_ms - started > limit * 1000:
                slot = assignment.slot
                killed = (slot.get(Field.CALL_FIRST_OFFSET), slot.get(Field.CALL_END_OFFSET))
                if assignment.slot.get(Field.CALL_STARTED_MS) != started:
                    continue  # that call just ended (another began): the offsets may be the next call's
                assignment.timed_out = killed
                self.log.error(
                    "%s[%d]: handler call on offsets %d..%d ran past time_limit (%gs): killing its worker",
                    assignment.topic,
                    assignment.partition,
                    assignment.timed_out[0],
                    assignment.timed_out[1] - 1,
                    limit,
                )
                self.counters.time_limit_kills += 1
                assignment.signal_worker(signal.SIGKILL)

    def _after_time_limit(self, assignment: Assignment) -> None:
        """A killed call is retried by the handler's error policy: again, then dead letter or release.

        AMO needs nothing: the killed messages were claimed, and a new worker starts after the claim.
        (A release already due, sick, hand-over or shutdown, is made by _after_exit instead of this.)
        """
        killed, assignment.timed_out = assignment.timed_out, None
        assert killed is not None
        # Counted per first message: a batch refetched after a restart may be longer (more has arrived).
        same = assignment.last_killed is not None and killed[0] == assignment.last_killed[0]
        assignment.time_limit_kills = assignment.time_limit_kills + 1 if same else 1
        assignment.last_killed = killed
        handler = self.app.handlers[assignment.topic]
        where = f"{assignment.topic}[{assignment.partition}]"
        assignment.restart_reason = "time_limit"
        if handler.mode is Mode.AMO or assignment.time_limit_kills <= handler.retries:
            assignment.restart_at = time.monotonic() + handler.retry_policy.backoff_delay(assignment.time_limit_kills)
        elif handler.on_error is OnError.RELEASE:
            self.log.error(
                "%s: offset %d timed out %d times: releasing it", where, killed[0], assignment.time_limit_kills
            )
            self.releases.release(assignment, sick=True)
        else:
            self.log.error(
                "%s: offset %d timed out %d times: dead-lettering it", where, killed[0], assignment.time_limit_kills
            )
            assignment.give_up_on, assignment.time_limit_kills, assignment.last_killed = killed, 0, None
            assignment.give_up_reason = "time_limit"
            assignment.restart_at = time.monotonic()

    def _after_lost_claim(self, assignment: Assignment) -> None:
        """An AMO claim was refused: gone if someone else owns it, else (a lapsed lease) start again."""
        if not self.releases.owns(assignment):
            self.releases.forget(assignment)
        else:
            assignment.restart_at, assignment.restart_reason = time.monotonic(), "lost_claim"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
