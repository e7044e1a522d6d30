"""A worker's loop for handlers with concurrency (docs/concurrency.md).

The one-call-at-a-time loop (one_call_loop.py) fetches, handles and stores progress
in turn.  This one keeps up to ``concurrency`` calls of one partition in
flight on an executor (threads for ``def``, an event loop for ``async def``),
with :class:`lanes.Lanes` deciding what may start and what is done:

    fetch  ->  held  ->  offer (window)  ->  ready  ->  executor  ->  completion
                                                         |   failed: retry later (its key waits), or on_error

Every decision happens on this one thread; the executor only runs calls.

Progress:

* at least once: the worker's NEXT_OFFSET is the lowest offset not done,
  and the done set above it is published in the slot every
  ``_PUBLISH_INTERVAL_S`` (and at exit): the supervisor's heartbeat and
  release carry both, so after a crash the next worker skips what was done;
* at most once: a fetch is claimed (through the supervisor, as the
  sequential loop does) before any of it is dispatched, and the next claim
  waits until the batch is finished, so a crash loses at most one batch.

What the handlers sent (app.send) is flushed before progress is reported:
while sends are pending, a completion does not move NEXT_OFFSET; the next
``_publish`` flushes, then reports the position and the done set (at least
once), and an AMO batch's end is reported after a flush too.

Stopping (SIGTERM, the stop flag, a lifecycle limit): no new call starts
under at least once (an AMO batch already claimed is finished), the calls in
flight finish, the position is published, and the supervisor releases the
partition with it: nothing lost, nothing repeated.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.handlers.app import HandlerSpec, Message, Mode, effective_time_limits
from marshal_workers.handlers.failure_path import Decision
from marshal_workers.handlers.message_age import is_too_old
from marshal_workers.handlers.rate_limits import Throttle
from marshal_workers.observe.latency import LATENCY_BOUNDS
from marshal_workers.protocol import done_set
from marshal_workers.protocol.lanes import Lanes
from marshal_workers.runtime.channel import LATENCY_FIRST_BUCKET, Field
from marshal_workers.runtime.worker.executors import AsyncExecutor, Completion, Executor, ThreadExecutor
from marshal_workers.runtime.worker.failures import Failures, Outcome, outcome_of, time_limit_error, wall_ms
from marshal_workers.runtime.worker.link import SupervisorLink

_PUBLISH_INTERVAL_S = 0.05  # the done set and the gauges in the slot: at most this stale
_CAUGHT_UP_WAIT_S = 0.002  # calls in flight, nothing fetched: how long to wait for one before asking Kafka again
_BUSY_WAIT_S = 0.05  # every slot busy or the window full: the longest wait for a call to finish
_WINDOW_WARNING_AFTER_S = 5.0  # the window full this long: say which message holds it
_WINDOW_WARNING_EVERY_S = 30.0
_BOUNDS_NS = [round(bound * 1e9) for bound in LATENCY_BOUNDS]


class LaneRunner:
    """Runs one partition's messages on lanes until asked to stop; returns how the worker exits."""

    def __init__(
        self,
        link: SupervisorLink,
        failures: Failures,
        handler: HandlerSpec,
        throttle: Throttle | None = None,
        max_age_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link, self.failures, self.handler = link, failures, handler
        self.fields = link.fields
        self.clock = clock  # monotonic seconds
        spec = link.spec
        self.lanes = Lanes(spec.start_offset, handler.lane_capacity, handler.window, handler.ordering)
        self.skipper = done_set.Skipper(spec.skip)
        self.give_up = spec.give_up_on  # [start, end): killed by the hard time limit too often; on_error, no call
        self.at_most_once = handler.mode is Mode.AMO
        soft, _hard = effective_time_limits(handler, spec.settings)
        self.latency = bool(spec.settings.metrics_port)
        self.executor: Executor = (
            AsyncExecutor(handler.function, soft)
            if handler.is_async
            else ThreadExecutor(handler.function, handler.concurrency, soft)
        )
        self.held: deque[Any] = deque()  # fetched, not yet offered (the window was full)
        self.records: dict[int, Any] = {}  # every offered, unfinished message's record
        self.calls: dict[int, list[int]] = {}  # running call (by first offset) -> its offsets
        # running call -> when it started (monotonic_ms), oldest first: the oldest is published (time limits, health)
        self.started_ms: dict[int, int] = {}
        self.claimed_end: int | None = None  # AMO: the end of the batch in hand
        self.exit: WorkerExit | None = None  # set when a message asked to stop (on_error="release")
        self.window_full_since: float | None = None
        self.next_window_warning = 0.0
        self.next_publish = 0.0
        # rate_limit: tokens taken from the handler's bucket and not used yet, and when to look again when none
        # were left (rate_limits.py); max_age: messages older are not offered but counted done (message_age.py).
        self.throttle = throttle
        self.credit = 0
        self.rate_wait_until = 0.0
        self.max_age_ms = max_age_ms

    # ------------------------------------------------------------- the loop

    def run(self) -> WorkerExit:
        link = self.link
        try:
            while True:
                now = self.clock()
                self._publish_if_due()
                link.housekeeping()
                self.executor.enforce_soft_limit(now)
                draining = link.stopping or self.exit is not None
                if draining and not self._finishing_claimed_batch(now):
                    if self.lanes.in_flight == 0:
                        break
                    self._absorb(self.executor.wait(_BUSY_WAIT_S))
                    continue
                if not link.lease_valid(now):
                    if self.lanes.in_flight == 0:
                        link.wait_for_lease()
                    else:
                        self._absorb(self.executor.wait(_BUSY_WAIT_S))
                    continue
                refused = self._fill(now)
                if refused is not None:
                    return refused
                now = self.clock()
                if link.lease_valid(now):  # the fetch may have waited for Kafka past the lease's end
                    self._dispatch(now)
                self._absorb(self.executor.wait(self._wait_time()))
            return self.exit if self.exit is not None else WorkerExit.STOPPED
        finally:
            self.executor.close()
            self._publish()

    def _finishing_claimed_batch(self, now: float) -> bool:
        """AMO: a claimed batch is handled to its end while stopping (its messages are never handled again),
        as long as the lease holds: a partition lost meanwhile loses the rest of it, as claimed."""
        return self.at_most_once and self.exit is None and self.lanes.unfinished > 0 and self.link.lease_valid(now)

    def _wait_time(self) -> float:
        """How long to wait for a call to finish before looking at Kafka again."""
        lanes = self.lanes
        if self.throttle is not None:
            rate_wait = self.rate_wait_until - self.clock()
            if rate_wait > 0:  # out of tokens: wait for one (or a call to finish)
                return min(rate_wait, _BUSY_WAIT_S)
        if lanes.in_flight == 0:
            return 0.0  # nothing to wait for: the next fetch waits for Kafka instead
        room = not self.held and lanes.window_used < lanes.window and lanes.in_flight < lanes.concurrency
        return _CAUGHT_UP_WAIT_S if room else _BUSY_WAIT_S

    # ---------------------------------------------------------------- intake

    def _fill(self, now: float) -> WorkerExit | None:
        """Offer what was held back, then fetch more if there is room; AMO claims a batch first."""
        if self.at_most_once:
            return self._fill_claimed(now)
        self._offer_held()
        if not self.held and self.lanes.window_used < self.lanes.window:
            self.held.extend(self.link.fetch(self._fetch_size(), self._fetch_wait(now)))
            self._offer_held()
        self._watch_window(now)
        return None

    def _fetch_size(self) -> int:
        return max(1, min(self.handler.batch_size, self.lanes.window - self.lanes.window_used))

    def _fetch_wait(self, now: float) -> float:
        """Block on Kafka only when nothing else could happen meanwhile: no call running, none ready to
        start, no retry due sooner."""
        lanes = self.lanes
        if lanes.in_flight or lanes.next_runnable(now) is not None:
            return 0.0
        due = lanes.next_due()
        return 0.1 if due is None else min(0.1, max(due - now, 0.0))

    def _offer_held(self) -> None:
        lanes, held, skipper, records, max_age_ms = self.lanes, self.held, self.skipper, self.records, self.max_age_ms
        not_ours = self.link.not_ours
        while held:
            record = held[0]
            offset = record.offset()
            if offset in skipper:
                if not lanes.skip(offset):
                    return
            elif not_ours and offset in not_ours:
                if not lanes.skip(offset):
                    return
                self._pass_by(offset)
            elif max_age_ms and self._too_old(record):
                if not lanes.skip(offset):
                    return
                self._drop(record)
            elif lanes.offer(offset, record.key()):
                records[offset] = record
            else:
                return
            held.popleft()

    def _fill_claimed(self, now: float) -> WorkerExit | None:
        """AMO: once the batch in hand is finished, fetch and claim the next one, then offer all of it."""
        if self.lanes.unfinished:
            return None
        link = self.link
        if self.claimed_end is not None:
            link.outbox.flush()  # the batch's output delivered before the next claim
            self.fields[Field.NEXT_OFFSET] = self.claimed_end
            self.claimed_end = None
        if not self.held:
            self.held.extend(link.fetch(self.handler.batch_size, self._fetch_wait(now)))
        if not self.held or link.stopping:
            return None
        held, first = self.held, self.held[0].offset()
        count = 0  # the batch: up to batch_size fetched messages within one window (compaction leaves gaps)
        while count < min(len(held), self.handler.batch_size) and held[count].offset() - first < self.lanes.window:
            count += 1
        end = held[count - 1].offset() + 1
        refused = link.claim_batch(end)
        if refused is not None:
            return refused
        if not link.wait_for_lease():
            self.exit = WorkerExit.STOPPED  # claimed and stopped before a call: these are lost, as claimed
            self.fields[Field.NEXT_OFFSET] = end
            return None
        self.claimed_end = end
        for _ in range(count):  # all of it fits: the lanes are empty and window >= batch_size
            record = held.popleft()
            offset = record.offset()
            if offset in self.skipper:
                self.lanes.skip(offset)
            elif link.not_ours and offset in link.not_ours:
                self.lanes.skip(offset)
                self._pass_by(offset)
            elif self.max_age_ms and self._too_old(record):
                self.lanes.skip(offset)
                self._drop(record)
            else:
                self.lanes.offer(offset, record.key())
                self.records[offset] = record
        return None

    def _too_old(self, record: Any) -> bool:
        return is_too_old(record.timestamp(), wall_ms(), self.max_age_ms)

    def _pass_by(self, offset: int) -> None:
        """A message redriven for another group, skipped in the lanes: done without a call, counted."""
        self.link.passes_by(offset)
        self.fields[Field.PROCESSED] += 1

    def _drop(self, record: Any) -> None:
        """A message past max_age: done without a call (skipped or dead-lettered), counted."""
        self.failures.too_old(self.handler, [record])
        self.fields[Field.PROCESSED] += 1

    def _watch_window(self, now: float) -> None:
        """A message that holds the window full is reported (the log, and WINDOW_USED in the slot)."""
        full = self.lanes.window_used >= self.lanes.window
        if not full:
            self.window_full_since = None
            return
        if self.window_full_since is None:
            self.window_full_since = now
        held_for = now - self.window_full_since
        if held_for >= _WINDOW_WARNING_AFTER_S and now >= self.next_window_warning:
            self.next_window_warning = now + _WINDOW_WARNING_EVERY_S
            oldest = self.lanes.progress()
            self.link.log.warning(
                "the window (%d offsets) has been full for %.0fs: offset %d is not done (%s, %d attempts); "
                "no message past offset %d is read until it is",
                self.lanes.window,
                held_for,
                oldest,
                _stage_name(self.lanes, oldest),
                self.lanes.attempts(oldest),
                oldest + self.lanes.window - 1,
            )

    # -------------------------------------------------------------- dispatch

    def _dispatch(self, now: float) -> None:
        """Start every message that may start: one call each, or batches for a batch handler."""
        lanes = self.lanes
        calls: list[tuple[int, Any]] = []
        batch = self.handler.batch
        size = self.handler.batch_size if batch else 1
        while len(self.calls) + len(calls) < self.handler.concurrency or not batch:
            offsets: list[int] = []
            while len(offsets) < size:
                offset = lanes.next_runnable(now)
                if offset is None or (self.throttle is not None and not self._token(size - len(offsets), now)):
                    break
                lanes.start(offset)
                offsets.append(offset)
            if not offsets:
                break
            if self._given_up(offsets):
                if self.exit is not None:
                    break
                continue
            calls.append(self._call(offsets, now))
        if calls:
            self.executor.submit(calls)

    def _token(self, wanted: int, now: float) -> bool:
        """rate_limit: one token for the next message (a batch call gets as many messages as there are tokens,
        up to batch_size); False when the bucket is empty, until ``rate_wait_until``."""
        assert self.throttle is not None
        if not self.credit:
            if now < self.rate_wait_until:
                return False
            granted, wait = self.throttle.try_acquire(wanted)
            if not granted:
                self.rate_wait_until = now + wait
                return False
            self.credit = granted
        self.credit -= 1
        return True

    def _call(self, offsets: list[int], now: float) -> tuple[int, Any]:
        first = offsets[0]
        self.calls[first] = offsets
        self.started_ms[first] = int(now * 1000)  # the slot's clock (monotonic_ms), read once per dispatch
        records, attempt = self.records, self.lanes.attempts(first)  # started just now: this try included
        if self.handler.batch:
            return first, [Message(records[o], attempt) for o in offsets]
        return first, Message(records[first], attempt)

    def _given_up(self, offsets: list[int]) -> bool:
        """Messages the hard time limit killed more often than the retries allow: on_error without a call."""
        if self.give_up is None or not any(self.give_up[0] <= o < self.give_up[1] for o in offsets):
            return False
        self._carry_out(
            offsets,
            self.failures.without_call(
                self.handler, [self.records[o] for o in offsets], time_limit_error(self.handler)
            ),
        )
        return True

    # ------------------------------------------------------------ completions

    def _absorb(self, completions: list[Completion]) -> None:
        if not completions:
            return
        handled = 0
        lanes, fields = self.lanes, self.fields
        for completion in completions:
            offsets = self.calls.pop(completion.offset)
            self.started_ms.pop(completion.offset, None)
            if self.latency:
                fields[Field.LATENCY_SUM_NS] += completion.elapsed_ns
                fields[LATENCY_FIRST_BUCKET + bisect.bisect_left(_BOUNDS_NS, completion.elapsed_ns)] += 1
            if completion.error is None:
                for offset in offsets:
                    lanes.finish(offset)
                    del self.records[offset]
                handled += len(offsets)
            else:
                handled += self._failed(offsets, completion.error)
        fields[Field.PROCESSED] += handled
        if not self.at_most_once and not self.link.outbox.pending:  # else _publish flushes, then reports it
            fields[Field.NEXT_OFFSET] = lanes.progress()
        self.link.count_handled(handled)

    def _failed(self, offsets: list[int], error: BaseException) -> int:
        """Retry later (the key's later messages wait; other keys go on), or what else the failure path decides
        (failures.py); how many got done.  Stopping, at least once, a retry is the next owner's."""
        failing = [self.records[o] for o in offsets]
        retry_here = self.at_most_once or not self.link.stopping  # AMO: a claimed batch is finished, retries too
        decision = self.failures.settle(self.handler, failing, error, self.lanes.attempts(offsets[0]), retry_here)
        return self._carry_out(offsets, decision)

    def _carry_out(self, offsets: list[int], decision: Decision) -> int:
        """The lanes' part of a decision (logged, its dead letters written): how many of ``offsets`` got done."""
        outcome = outcome_of(decision)
        if outcome is Outcome.DONE:
            return self._done(offsets)
        if outcome is Outcome.RELEASE:
            self.exit = WorkerExit.RELEASE
        until = self.clock() + decision.delay if outcome is Outcome.RETRY else float("inf")
        for offset in offsets:
            self.lanes.defer(offset, until)  # never done here (inf): the next owner starts at it
        return 0

    def _done(self, offsets: list[int]) -> int:
        """Messages finished without a successful call (dead-lettered, ignored): done all the same."""
        for offset in offsets:
            self.lanes.finish(offset)
            del self.records[offset]
        return len(offsets)

    # -------------------------------------------------------------- reports

    def _publish_if_due(self) -> None:
        now = self.clock()
        if now >= self.next_publish:
            self.next_publish = now + _PUBLISH_INTERVAL_S
            self._publish()

    def _publish(self) -> None:
        """The position (progress and done set), the gauges, and the oldest call for the hard time limit."""
        lanes, fields = self.lanes, self.fields
        if not self.at_most_once:
            progress = lanes.progress()
            self.link.outbox.flush()  # what the calls behind this progress sent, before it is reported
            fields[Field.NEXT_OFFSET] = progress
            self.link.publish_done(progress, self._done_runs(progress))
        fields[Field.IN_FLIGHT] = lanes.in_flight
        fields[Field.WINDOW_USED] = lanes.window_used
        self._publish_oldest_call()

    def _done_runs(self, progress: int) -> list[int]:
        """The lanes' done set, with the skipped ranges not fetched yet (they are done too)."""
        runs = self.lanes.done_above()
        if not self.skipper:
            return runs
        fetched_to = progress + self.lanes.window_used
        ahead = [(max(start, fetched_to), stop) for start, stop in self.skipper.ranges() if stop > fetched_to]
        try:
            return done_set.encode(progress, done_set.decode(progress, runs) + [r for r in ahead if r[0] > progress])
        except done_set.DoneSetTooLarge:
            return runs  # what this worker did is enough to be exact; the rest would be handled twice

    def _publish_oldest_call(self) -> None:
        fields = self.fields
        if not self.started_ms:
            fields[Field.CALL_STARTED_MS] = 0
            return
        first = next(iter(self.started_ms))  # calls are added as they start and removed as they end: the oldest
        fields[Field.CALL_FIRST_OFFSET] = first
        fields[Field.CALL_END_OFFSET] = self.calls[first][-1] + 1
        fields[Field.CALL_STARTED_MS] = self.started_ms[first]


def _stage_name(lanes: Lanes, offset: int) -> str:
    stage = lanes.stage(offset)
    return "done" if stage is None else stage.value
