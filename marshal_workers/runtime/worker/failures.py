"""What happens to a message a partition worker could not handle: retries by the handler's policy, the dead-letter
topic (and its dlq_limit), a release of the partition as sick, the messages past max_age, and the messages the hard
time limit (or a worker's deaths) made the supervisor give up on.  Each failed call is logged once, with its
traceback (handlers/failure_logs.py).  Every loop (one_call_loop.py, batch_loop.py, lane_runner.py) is given one."""

from __future__ import annotations

import enum
import time
from typing import Any

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.errors import TimeLimitExceeded, WorkerLost
from marshal_workers.handlers.app import HandlerSpec, Message, OnError
from marshal_workers.handlers.failure_logs import apart_from, log_dead_letter, log_ignored, log_release, log_retry
from marshal_workers.handlers.hooks import Hooks, run_hooks
from marshal_workers.handlers.message_age import OnTooOld, too_old_error
from marshal_workers.handlers.retry_policy import Action, next_step
from marshal_workers.handlers.signals import rejected_of
from marshal_workers.kafka.dead_letters import DeadLetterWriter, error_headers
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.worker.link import SupervisorLink


class Outcome(enum.Enum):
    """What became of a message (or batch) after the handler and the error policy."""

    DONE = "done"  # handled, or dead-lettered: progress moves past it
    RELEASE = "release"  # on_error="release": stop, and release the partition at it
    STOP = "stop"  # asked to stop while retrying: it is not done


def exit_for(outcome: Outcome) -> WorkerExit:
    return WorkerExit.RELEASE if outcome is Outcome.RELEASE else WorkerExit.STOPPED


def wall_ms() -> int:
    """Now, as Kafka timestamps count: wall-clock milliseconds."""
    return int(time.time() * 1000)


def time_limit_error(handler: HandlerSpec) -> TimeLimitExceeded:
    return TimeLimitExceeded(f"the handler ran past its time limit {handler.retries + 1} times")


class Failures:
    """A partition worker's failed messages: retried, ignored, dead-lettered or the partition released."""

    def __init__(self, link: SupervisorLink, dead_letters: DeadLetterWriter, hooks: Hooks, max_age_ms: int) -> None:
        self.link = link
        self.log = link.log
        self.outcomes = link.outcomes
        self.dead_letters = dead_letters
        self.hooks = hooks  # the app's: on_dead_letter
        self.max_age_ms = max_age_ms  # the handler's max_age, 0: none
        self._dead_letters_in_a_row = 0  # dlq_limit: dead letters since the last message that was not one
        self._dead_letters_end = -1  # the offset after the last dead letter

    def recover(self, handler: HandlerSpec, records: list[Any], error: Exception) -> Outcome:
        """After a first failure: retry as the handler's policy says (retry_policy.py), then dead-letter (DONE)
        or give the partition up; a message the handler ignored is done, one it rejected dead-lettered."""
        offset, failures, first = records[0].offset(), 1, error
        while True:
            self.outcomes.failed(error)
            step = next_step(handler.retry_policy, error, failures)
            if step.action is Action.IGNORE:
                self.outcomes.ignored += len(records)
                log_ignored(self.log, handler.name, offset, error)
                return Outcome.DONE
            if step.action is Action.REJECT:
                self.reject(handler, records, error)
                return Outcome.DONE
            if step.action is Action.GIVE_UP:
                break
            log_retry(self.log, handler.name, offset, error, failures, step.delay)
            # After the backoff the lease must still hold (it waits while it has lapsed, as a fetch does): a
            # supervisor frozen meanwhile may have lost the partition, and its next owner handles it.
            if not (self.link.sleep(step.delay) and self.link.lease_holds()):
                return Outcome.STOP  # not done: the next owner handles it again
            self.outcomes.retries += 1
            failures += 1
            try:
                handler.call(records, failures)
                return Outcome.DONE
            except Exception as exc:  # noqa: BLE001 - a handler is user code: any error goes to the retry policy
                # Called while the first failure is being handled (the loops call recover in their except
                # clause, which keeps the hot path lean): Python would chain each retry's error to it.
                error = apart_from(exc, first)
        if handler.on_error is OnError.RELEASE or self.over_dlq_limit(handler, records):
            log_release(self.log, handler.name, offset, error)
            return Outcome.RELEASE
        self.dead_letter(handler, records, error)
        return Outcome.DONE

    def reject(self, handler: HandlerSpec, records: list[Any], error: BaseException) -> None:
        """The handler rejected the messages (``Reject``): to the dead-letter topic at once, counted.  Of a typed
        batch, only those that did not decode (``PayloadError``), each with its own error: it had the others."""
        rejected = rejected_of(error, [r.offset() for r in records])
        if len(rejected) == len(records):
            self.outcomes.rejected += len(records)
            self.dead_letter(handler, records, error)
            return
        bad = [r for r in records if r.offset() in rejected]
        self.outcomes.rejected += len(bad)
        self._write_dead_letters(handler, bad, [rejected[r.offset()] for r in bad])
        self._dead_letters_in_a_row += len(bad)
        self._dead_letters_end = bad[-1].offset() + 1
        log_dead_letter(self.log, handler.name, bad[0].offset(), error, len(bad), handler.dlq_topic)

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

    def dead_letter(self, handler: HandlerSpec, records: list[Any], error: BaseException) -> None:
        """Write the messages to the dead-letter topic and make sure they are there, or crash trying."""
        self._write_dead_letters(handler, records, [error] * len(records))
        self._dead_letters_in_a_row += len(records)
        self._dead_letters_end = records[-1].offset() + 1
        log_dead_letter(self.log, handler.name, records[0].offset(), error, len(records), handler.dlq_topic)

    def too_old(self, handler: HandlerSpec, records: list[Any]) -> None:
        """Messages past the handler's max_age: not handled; counted, and dead-lettered if on_too_old="dlq".
        They do not count towards dlq_limit (that bounds failures in a row)."""
        self.outcomes.too_old += len(records)
        if handler.on_too_old is OnTooOld.DLQ:
            now_ms = wall_ms()
            self._write_dead_letters(handler, records, [too_old_error(r.timestamp(), now_ms, self.max_age_ms)
                                                        for r in records])  # fmt: skip
        self.log.debug("%d message(s) from offset %d older than max_age: %s", len(records), records[0].offset(),
                       "dead-lettered" if handler.on_too_old is OnTooOld.DLQ else "skipped")  # fmt: skip

    def give_up_on(self, handler: HandlerSpec, end: int, error: Exception) -> bool:
        """Apply on_error to the messages from the start offset to ``end`` without calling the handler: their calls
        were killed by the hard time limit (or their workers died) more often than allowed.  False if asked to
        stop first."""
        records = self.link.read_range(end)
        if records is None:
            return False
        if records:
            self.dead_letter(handler, records, error)
        fields = self.link.fields
        fields[Field.NEXT_OFFSET] = max(fields[Field.NEXT_OFFSET], end)
        return True

    def _write_dead_letters(self, handler: HandlerSpec, records: list[Any], errors: list[Any]) -> None:
        """Write the messages to the dead-letter topic, each with its error, and make sure they are there (or crash
        trying: progress stays before them, so they are handled again); counted, and the on_dead_letter hooks run."""
        self.dead_letters.write(handler.dlq_topic, records,
                                [error_headers(handler.name, r, e) for r, e in zip(records, errors)])  # fmt: skip
        self.link.fields[Field.DEAD_LETTERED] += len(records)
        for record, error in zip(records, errors) if self.hooks.on_dead_letter else ():
            run_hooks(self.hooks.on_dead_letter, Message(record), error)


def give_up_error(reason: str, crash_limit: int, handler: HandlerSpec) -> Exception:
    """Why messages are given up on without a call (WorkerSpec.give_up_on): the dead letters' error."""
    if reason == "worker_lost":
        return WorkerLost(f"the worker died on it {crash_limit} times in a row")
    return time_limit_error(handler)
