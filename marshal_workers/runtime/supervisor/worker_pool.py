"""The worker pool: forking, stopping, reaping and restarting the workers of whole partitions.

One worker per partition held, forked from a fork server started before any
Kafka client exists (librdkafka is not fork-safe), with the application
preloaded.  What a worker's exit means (release, restart with backoff, apply
a time limit, forget a lost partition) is decided here too, with the
partition policy's release (partition_claims.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import signal
import time
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.handlers.app import Mode, OnError
from marshal_workers.handlers.loader import split_app_path
from marshal_workers.protocol import done_set
from marshal_workers.protocol.health import PartitionHealth, watch_call
from marshal_workers.runtime.channel import Field, WorkerSpec, monotonic_ms
from marshal_workers.runtime.supervisor.assignments import Assignment, Phase, SupervisorState, signal_process
from marshal_workers.runtime.worker.worker import WorkerExit, worker_main

_log = logging.getLogger(__name__)
START_BUDGET_S = 0.02  # seconds per pass of the loop spent starting the workers of new claims


class WorkerPool(SupervisorState):
    """The Supervisor's part that runs workers (a mixin: the state is the supervisor's)."""

    if TYPE_CHECKING:  # provided by the other parts

        def _release(self, assignment: Assignment, sick: bool = False) -> None: ...
        def _release_handed_over(self, assignment: Assignment) -> None: ...
        def _forget(self, assignment: Assignment) -> None: ...
        def _owns(self, assignment: Assignment) -> bool: ...

    def _start_fork_server(self) -> BaseContext:
        context = multiprocessing.get_context("forkserver")
        module, _ = split_app_path(self.app_path)
        context.set_forkserver_preload(["marshal_workers.runtime.worker.forkserver_preload", "marshal_workers.runtime.worker.worker", module])
        multiprocessing.forkserver.ensure_running()
        return context

    def _start_worker(self, assignment: Assignment) -> None:
        assert self._context is not None
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
            self.app_path, assignment.topic, assignment.partition, start, self.settings, assignment.give_up_on,
            assignment.give_up_reason,
            skip=tuple(skip),
        )
        assignment.give_up_on = None
        if assignment.restart_at is not None:
            self.counters.worker_restarts[assignment.restart_reason] += 1
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(spec, assignment.slot.array, theirs, self.rate_buckets.get(assignment.topic)),
            name=f"worker {assignment.topic}[{assignment.partition}]",
            daemon=True,
        )
        process.start()
        theirs.close()
        assignment.process, assignment.connection = process, ours
        assignment.started_offset, assignment.restart_at = start, None
        assignment.health = PartitionHealth()  # a new worker is judged afresh

    def _start_queued_workers(self) -> None:
        """Start the workers of partitions just claimed, for up to START_BUDGET_S per pass of the loop.

        A fork waits for the fork server, which competes for the CPU with every worker starting: starting
        a hundred in one pass once held the loop for seconds, and the heartbeats with it.
        """
        budget_ends = time.monotonic() + START_BUDGET_S
        while self._to_start and time.monotonic() < budget_ends:
            assignment = self._to_start.popleft()
            current = self.assignments.get(assignment.key) is assignment and not assignment.lost
            if current and assignment.process is None and self.phase is Phase.RUNNING and not self._stop_signalled:
                self._start_worker(assignment)

    def _restart_due_workers(self, now: float) -> None:
        if self.phase is not Phase.RUNNING:
            return
        for assignment in self.assignments.values():
            if assignment.restart_at is not None and assignment.restart_at <= now and assignment.process is None:
                self._start_worker(assignment)

    def _reap_workers(self) -> None:
        """Deal with the workers that exited: only those whose sentinel the loop's wait found readable (asking
        every process is_alive() built a selector per worker on every pass of the loop)."""
        ready = self.ready
        for assignment in list(self.assignments.values()):
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
        if assignment.lost:
            self._forget(assignment)
        elif code == WorkerExit.BOOT_ERROR:
            self.log.error("the worker for %s could not start (see its error above): stopping", where)
            self.exit_code = ExitCode.WORKER_BOOT_ERROR
            self._release(assignment)
            if self.phase is Phase.RUNNING:
                self._begin_graceful_stop()
        elif code == WorkerExit.RELEASE or assignment.unhealthy:
            self._release(assignment, sick=True)
        elif assignment.handing_over:
            self._release_handed_over(assignment)
        elif code == WorkerExit.LOST:
            self._after_lost_claim(assignment)
        elif self.phase is not Phase.RUNNING:
            self._release(assignment)  # stopped (or killed past the timeout): hand over at its progress
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
            what = "that message" if in_hand[1] - in_hand[0] == 1 else f"its batch (offsets {in_hand[0]}..{in_hand[1] - 1})"
            self.log.error(
                "worker for %s died %d times in a row at offset %d (%s): dead-lettering %s as WorkerLost",
                where, assignment.crashes_in_a_row, assignment.next_offset, _describe_exit(code), what,
            )  # fmt: skip
            assignment.give_up_on, assignment.give_up_reason = in_hand, "worker_lost"
            assignment.crashes_in_a_row = 0
            assignment.restart_at, assignment.restart_reason = time.monotonic(), "poison"
            return
        if delay is None:
            self.log.error("worker for %s crashed %d times in a row: releasing it as sick", where, assignment.crashes_in_a_row)
            self._release(assignment, sick=True)
            return
        self.log.warning(
            "worker for %s exited with %s at offset %d: restarting in %.1fs",
            where, _describe_exit(code), assignment.next_offset, delay,
        )  # fmt: skip
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
        """Note each worker's handler call in flight, and when it was first seen if the worker does not say when it
        began (every pass of the loop: a few reads of shared memory per partition)."""
        now = time.monotonic()
        for assignment in self.assignments.values():
            self._watch_call(assignment, now)

    def _watch_call(self, assignment: Assignment, now: float) -> None:
        slot = assignment.slot
        if assignment.process is None:
            assignment.call = None
            return
        assignment.call = watch_call(
            assignment.call, slot.get(Field.CALL_STARTED_MS), slot.get(Field.HANDLING_END), slot.get(Field.NEXT_OFFSET),
            now,
        )  # fmt: skip

    def _enforce_time_limits(self) -> None:
        """Kill a worker whose handler call has run past the hard time limit (it may be stuck in C code)."""
        now_ms = monotonic_ms()
        for assignment in self.assignments.values():
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
                    assignment.topic, assignment.partition, assignment.timed_out[0], assignment.timed_out[1] - 1, limit,
                )  # fmt: skip
                self.counters.time_limit_kills += 1
                self._signal_worker(assignment, signal.SIGKILL)

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
            self.log.error("%s: offset %d timed out %d times: releasing it", where, killed[0], assignment.time_limit_kills)
            self._release(assignment, sick=True)
        else:
            self.log.error("%s: offset %d timed out %d times: dead-lettering it", where, killed[0], assignment.time_limit_kills)
            assignment.give_up_on, assignment.time_limit_kills, assignment.last_killed = killed, 0, None
            assignment.give_up_reason = "time_limit"
            assignment.restart_at = time.monotonic()


    def _after_lost_claim(self, assignment: Assignment) -> None:
        """An AMO claim was refused: gone if someone else owns it, else (a lapsed lease) start again."""
        if not self._owns(assignment):
            self._forget(assignment)
        elif self.phase is Phase.RUNNING:
            assignment.restart_at, assignment.restart_reason = time.monotonic(), "lost_claim"
        else:
            self._release(assignment)

    def _stop_worker(self, assignment: Assignment) -> None:
        """Ask a worker to finish the message or batch in hand and exit: the flag first, then the signal.

        A worker forked a moment ago still ignores SIGTERM (inherited from the fork server) until it
        installs its handler; it reads the flag right after doing so, so the request is never lost.
        """
        assignment.slot.set(Field.STOP_REQUESTED, 1)
        self._signal_worker(assignment, signal.SIGTERM)

    def _signal_worker(self, assignment: Assignment, signum: int) -> None:
        signal_process(assignment.process, signum)

    def _kill_workers(self) -> None:
        """SIGKILL every worker; each is released at its last progress when reaped."""
        self.phase = Phase.STOPPING
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGKILL)
        self.shared.kill_workers()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
