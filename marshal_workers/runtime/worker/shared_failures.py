"""What happens to a message a shared worker could not handle, as the one failure path decides
(handlers/failure_path.py): retried here while the lease leaves time for the backoff, then delivered again later
(at least once, up to ``max_deliveries``) or dead-lettered (at most once, or delivered ``max_deliveries`` times);
each dead letter says after how many deliveries (docs/shared-partitions.md).  The shared worker
(shared_worker.py) is given one, so a unit test can drive it with a fake writer and clock."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

from marshal_workers.core.logs import ContextLog
from marshal_workers.errors import MaxDeliveriesExceeded
from marshal_workers.handlers.app import HandlerSpec, Message, Mode
from marshal_workers.handlers.failure_logs import log_decision
from marshal_workers.handlers.failure_path import Decision, FailurePath, Fate, Final, dead_letter
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.hooks import Hooks, run_hooks
from marshal_workers.kafka.dead_letter_writer import DeadLetterWriter, letter_headers
from marshal_workers.runtime.channel import monotonic_ms


class InRange(enum.Enum):
    """What a message is, as its range is settled."""

    HANDLED = "handled"  # handled or ignored: done
    FAILED = "failed"  # failed here: delivered again
    DEAD = "dead"  # written to the dead-letter topic


class SharedFailures:
    """A shared worker's failed messages (see the module's docstring)."""

    def __init__(
        self,
        dead_letters: DeadLetterWriter,
        outcomes: OutcomeCounts,
        log_of: Callable[[Any], ContextLog],
        stopping: Callable[[], bool],
        clock_ms: Callable[[], int] = monotonic_ms,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        self.dead_letters = dead_letters
        self.hooks = Hooks()  # the app's, once taken up
        self.log_of = log_of  # the log for lines about a record
        self.stopping = stopping
        self.clock_ms, self.sleep = clock_ms, sleep
        self.path = FailurePath(outcomes)

    def take_up(self, handler: HandlerSpec, hooks: Hooks) -> None:
        """At least once a failure past its retries is the range's next delivery's; at most once, on_error's."""
        self.hooks = hooks
        self.path.final = Final.DELIVER_AGAIN if handler.mode is Mode.ALO else Final.ON_ERROR

    def handle(
        self, handler: HandlerSpec, record: Any, tries: int, deadline_ms: int, error: Exception | None = None
    ) -> InRange:
        """Call the handler on ``record``, delivered ``tries`` times before, under a lease that ends at
        ``deadline_ms``; retried while the failure path says so.  ``error``: the first call was made (the hot path)
        and failed with it."""
        if tries >= handler.max_deliveries:
            given_up = MaxDeliveriesExceeded(
                f"delivered {tries} times without success (max_deliveries={handler.max_deliveries})"
            )
            return self._carry_out(handler, record, dead_letter(given_up, 1), 0, tries)
        failures = 0
        while True:
            if error is None:
                try:
                    handler.call([record], failures + 1)
                    return InRange.HANDLED
                except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                    error = exc
            failures += 1
            left_s = (deadline_ms - self.clock_ms()) / 1000  # a retry past the lease's end is the next delivery's
            decision = self.path.after_call(handler, [record.offset()], error, failures, not self.stopping(), left_s)
            fate = self._carry_out(handler, record, decision, failures, tries + 1)
            if decision.fate is not Fate.RETRY:
                return fate
            self.sleep(decision.delay)
            error = None

    def dead_letter(self, handler: HandlerSpec, record: Any, error: BaseException, deliveries: int) -> InRange:
        """``record`` to the dead-letter topic without a call (a message past max_age, on_too_old="dlq")."""
        return self._carry_out(handler, record, dead_letter(error, 1), 0, deliveries)

    def _carry_out(
        self, handler: HandlerSpec, record: Any, decision: Decision, failures: int, deliveries: int
    ) -> InRange:
        """A decision on ``record``, logged once, its dead letter (with its deliveries) written."""
        log_decision(
            self.log_of(record),
            handler.name,
            [record.offset()],
            decision,
            failures,
            f"{handler.dlq_topic} after {deliveries} deliveries",
            later=f"delivery {deliveries} of {handler.max_deliveries}, it will be delivered again",
        )
        if decision.fate is Fate.DEAD_LETTER:
            headers = letter_headers(handler.name, record, decision.error, deliveries)
            self.dead_letters.write(handler.dlq_topic, [record], [headers])
            run_hooks(self.hooks.on_dead_letter, Message(record), decision.error)
            return InRange.DEAD
        return InRange.FAILED if decision.fate is Fate.LATER else InRange.HANDLED
