"""What happens to a message a partition worker could not handle, as the one failure path decides
(handlers/failure_path.py): retries by the handler's policy, the dead-letter topic (and its dlq_limit), a release of
the partition as sick; and the messages past max_age, and those the hard time limit (or a worker's deaths) made the
supervisor give up on.  Each failed call is logged once, with its traceback (handlers/failure_logs.py).  Every loop
(one_call_loop.py, batch_loop.py, lane_runner.py) is given one."""

from __future__ import annotations

import enum
import time
from typing import Any

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.errors import TimeLimitExceeded, WorkerLost
from marshal_workers.handlers.app import HandlerSpec, Message
from marshal_workers.handlers.failure_logs import apart_from, log_decision
from marshal_workers.handlers.failure_path import Decision, FailurePath, Fate
from marshal_workers.handlers.hooks import Hooks, run_hooks
from marshal_workers.handlers.message_age import OnTooOld, too_old_error
from marshal_workers.kafka.dead_letter_writer import DeadLetterWriter, letter_headers
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.worker.link import SupervisorLink


class Outcome(enum.Enum):
    """What became of a message (or batch) after the handler and the failure path."""

    DONE = "done"  # handled, ignored or dead-lettered: progress moves past it
    RETRY = "retry"  # tried again after the decision's delay (the lanes defer it; recover waits here)
    RELEASE = "release"  # on_error="release" (or dlq_limit): stop, and release the partition at it
    STOP = "stop"  # asked to stop while retrying: it is not done


_OUTCOME_OF = {
    Fate.RETRY: Outcome.RETRY,
    Fate.IGNORED: Outcome.DONE,
    Fate.DEAD_LETTER: Outcome.DONE,
    Fate.RELEASE: Outcome.RELEASE,
    Fate.LATER: Outcome.STOP,
}


def outcome_of(decision: Decision) -> Outcome:
    return _OUTCOME_OF[decision.fate]


def exit_for(outcome: Outcome) -> WorkerExit:
    return WorkerExit.RELEASE if outcome is Outcome.RELEASE else WorkerExit.STOPPED


def wall_ms() -> int:
    """Now, as Kafka timestamps count: wall-clock milliseconds."""
    return int(time.time() * 1000)


def time_limit_error(handler: HandlerSpec) -> TimeLimitExceeded:
    return TimeLimitExceeded(f"the handler ran past its time limit {handler.retries + 1} times")


class Failures:
    """A partition worker's failed messages, as the failure path (handlers/failure_path.py) decides: retried,
    ignored, dead-lettered or the partition released.  This is its I/O: the waits, the dead-letter topic, the log."""

    def __init__(self, link: SupervisorLink, dead_letters: DeadLetterWriter, hooks: Hooks, max_age_ms: int) -> None:
        self.link = link
        self.log = link.log
        self.outcomes = link.outcomes
        self.path = FailurePath(link.outcomes)
        self.dead_letters = dead_letters
        self.hooks = hooks  # the app's: on_dead_letter
        self.max_age_ms = max_age_ms  # the handler's max_age, 0: none

    def recover(self, handler: HandlerSpec, records: list[Any], error: Exception) -> Outcome:
        """After a first failure, the one-call and batch loops: retry here as the failure path says, waiting out
        each backoff, until a call succeeds or the path decides otherwise."""
        failures, first = 1, error
        while True:
            decision = self.settle(handler, records, error, failures)
            if decision.fate is not Fate.RETRY:
                return outcome_of(decision)
            # After the backoff the lease must still hold (it waits while it has lapsed, as a fetch does): a
            # supervisor frozen meanwhile may have lost the partition, and its next owner handles it.
            if not (self.link.sleep(decision.delay) and self.link.lease_holds()):
                return Outcome.STOP  # not done: the next owner handles it again
            failures += 1
            try:
                handler.call(records, failures)
                return Outcome.DONE
            except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                # Called while the first failure is being handled (the loops call recover in their except
                # clause, which keeps the hot path lean): Python would chain each retry's error to it.
                error = apart_from(exc, first)

    def settle(
        self, handler: HandlerSpec, records: list[Any], error: BaseException, failures: int, retry_here: bool = True
    ) -> Decision:
        """The ``failures``-th failed call on ``records``: the failure path's decision, logged once, its dead
        letters written."""
        offsets = [r.offset() for r in records]
        decision = self.path.after_call(handler, offsets, error, failures, retry_here)
        self._carry_out(handler, records, offsets, decision, failures)
        return decision

    def give_up_on(self, handler: HandlerSpec, end: int, error: Exception) -> Outcome | None:
        """Apply on_error to the messages from the start offset to ``end`` without calling the handler: their calls
        were killed by the hard time limit (or their workers died) more often than allowed.  None if asked to
        stop first."""
        records = self.link.read_range(end)
        if records is None:
            return None
        outcome = outcome_of(self.without_call(handler, records, error)) if records else Outcome.DONE
        if outcome is Outcome.DONE:
            fields = self.link.fields
            fields[Field.NEXT_OFFSET] = max(fields[Field.NEXT_OFFSET], end)
        return outcome

    def without_call(self, handler: HandlerSpec, records: list[Any], error: BaseException) -> Decision:
        """The messages given up on without a call (see give_up_on): on_error, as after the retries."""
        offsets = [r.offset() for r in records]
        decision = self.path.without_call(handler, offsets, error)
        self._carry_out(handler, records, offsets, decision, 0)
        return decision

    def too_old(self, handler: HandlerSpec, records: list[Any]) -> None:
        """Messages past the handler's max_age: not handled; counted, and dead-lettered if on_too_old="dlq".
        They do not count towards dlq_limit (that bounds failures in a row)."""
        self.outcomes.too_old += len(records)
        if handler.on_too_old is OnTooOld.DLQ:
            now_ms = wall_ms()
            self._write_dead_letters(
                handler, records, [too_old_error(r.timestamp(), now_ms, self.max_age_ms) for r in records]
            )
        self.log.debug(
            "%d message(s) from offset %d older than max_age: %s",
            len(records),
            records[0].offset(),
            "dead-lettered" if handler.on_too_old is OnTooOld.DLQ else "skipped",
        )

    def _carry_out(
        self, handler: HandlerSpec, records: list[Any], offsets: list[int], decision: Decision, failures: int
    ) -> None:
        log_decision(self.log, handler.name, offsets, decision, failures, handler.dlq_topic)
        if decision.fate is Fate.DEAD_LETTER:
            letters = sorted(decision.letters.items())
            self._write_dead_letters(handler, [records[i] for i, _ in letters], [e for _, e in letters])

    def _write_dead_letters(self, handler: HandlerSpec, records: list[Any], errors: list[Any]) -> None:
        """Write the messages to the dead-letter topic, each with its error, and make sure they are there (or crash
        trying: progress stays before them, so they are handled again); counted, and the on_dead_letter hooks run."""
        self.dead_letters.write(
            handler.dlq_topic, records, [letter_headers(handler.name, r, e) for r, e in zip(records, errors)]
        )
        self.link.fields[Field.DEAD_LETTERED] += len(records)
        for record, error in zip(records, errors) if self.hooks.on_dead_letter else ():
            run_hooks(self.hooks.on_dead_letter, Message(record), error)


def give_up_error(reason: str, crash_limit: int, handler: HandlerSpec) -> Exception:
    """Why messages are given up on without a call (WorkerSpec.give_up_on): the dead letters' error."""
    if reason == "worker_lost":
        return WorkerLost(f"the worker died on it {crash_limit} times in a row")
    return time_limit_error(handler)
