"""The one failure path: what becomes of the message(s) of a handler call that failed (docs/handlers.md, "The retry
policy" and "Dead letters and on_error").

Every way of running a handler drives this: the partition worker's loops (one call at a time, batches, lanes,
sync and async: runtime/worker/failures.py and lane_runner.py), the shared worker (shared_worker.py), Spark replay
(spark/replay.py) and the testing harness (testing.py).  Each does its own waiting, calling, writing and progress;
the decisions are made here, once:

* the retry policy's step (retry_policy.py) for the error and the number of failed tries;
* a ``Reject`` dead-letters at once, of a typed batch only the messages that did not decode (by their position in
  the call, so messages that do not carry distinct offsets are still told apart), each with its own error;
* a failure that is final (the retries spent, or an error not retried) meets the runner's :class:`Final`: the
  handler's ``on_error`` (a dead letter, or the partition released; ``dlq_limit`` dead letters in a row release
  it too), the next delivery of a shared range, or the end of a replay's split;
* a retry the runner cannot make now (a worker stopping; no time left in a shared lease) is left to whoever gets
  the message next, or, if nobody will (at most once), the failure is final;
* the counts for the metrics (handler_outcomes.py).

Pure: offsets, errors and try numbers in, a :class:`Decision` out.  No Kafka, no clock, no log: the runners log a
decision with failure_logs.log_decision and write dead letters with kafka/dead_letter_writer.py.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from marshal_workers.handlers.app import HandlerSpec, Mode, OnError
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.handlers.retry_policy import Action, next_step
from marshal_workers.handlers.signals import rejected_of


class Fate(enum.Enum):
    """What becomes of the messages of a failed call."""

    RETRY = "retry"  # called again after Decision.delay
    IGNORED = "ignored"  # the handler raised Ignore: done, nothing more
    DEAD_LETTER = "dead_letter"  # Decision.letters go to the dead-letter topic; the call's messages are done
    RELEASE = "release"  # on_error="release" or dlq_limit: the partition is released at them, not done
    LATER = "later"  # not done here: tried again by the next owner, or at the shared range's next delivery
    STOP = "stop"  # a replay: its split stops at Decision.letters (nothing is dead-lettered)


class Final(enum.Enum):
    """What a runner does with a failure that is final."""

    ON_ERROR = "on_error"  # the handler's on_error and dlq_limit: partition workers, shared at most once, the harness
    DELIVER_AGAIN = "deliver_again"  # a shared range at least once: its next delivery (up to max_deliveries)
    STOP = "stop"  # a replay: the split stops there, to be replayed again once the handler is fixed


@dataclass(frozen=True)
class Decision:
    fate: Fate
    error: BaseException  # the call's error
    delay: float = 0.0  # RETRY: seconds before the next call
    # DEAD_LETTER, STOP: the messages that failed for good, by their position in the call, each with its own error
    letters: Mapping[int, BaseException] = field(default_factory=dict)
    in_a_row: int = 0  # RELEASE by dlq_limit: the messages dead-lettered in a row just before (0: on_error)


def dead_letter(error: BaseException, count: int) -> Decision:
    """All ``count`` messages of a call (or of one given up on without a call) to the dead-letter topic."""
    return Decision(Fate.DEAD_LETTER, error, letters=dict.fromkeys(range(count), error))


class FailurePath:
    """One runner's failure path: its Final, its counts, and the dead letters in a row that dlq_limit bounds.

    "In a row" is read off the offsets (the dead letters ended where the next failure begins), so a message
    handled between them costs nothing here."""

    def __init__(
        self, outcomes: OutcomeCounts | None = None, final: Final = Final.ON_ERROR, rng: random.Random | None = None
    ) -> None:
        self.outcomes = outcomes if outcomes is not None else OutcomeCounts()
        self.final = final
        self.rng = rng  # the retry jitter's random source (None: the random module's)
        self.dead_letters_in_a_row = 0
        self._dead_letters_end = -1  # the offset after the last dead letter

    def after_call(
        self,
        handler: HandlerSpec,
        offsets: Sequence[int],
        error: BaseException,
        failures: int,
        retry_here: bool = True,
        wait_at_most: float = math.inf,
    ) -> Decision:
        """The call on ``offsets`` (its messages' offsets, in the order it got them) failed with ``error``, its
        ``failures``-th failed try (1 for the first).  ``retry_here``: False when the runner cannot try again now
        (it is stopping); ``wait_at_most``: the seconds it can wait for a retry (its lease ends then)."""
        outcomes = self.outcomes
        outcomes.failed(error)
        step = next_step(handler.retry_policy, error, failures, self.rng)
        if step.action is Action.IGNORE:
            outcomes.ignored += len(offsets)
            return Decision(Fate.IGNORED, error)
        if step.action is Action.REJECT:
            return self._rejected(offsets, error)
        if step.action is Action.RETRY:
            if retry_here and step.delay < wait_at_most:
                outcomes.retries += 1
                return Decision(Fate.RETRY, error, step.delay)
            if handler.mode is Mode.ALO:
                return Decision(Fate.LATER, error)  # at least once, someone gets it again: the retry is theirs
        return self.without_call(handler, offsets, error)

    def without_call(self, handler: HandlerSpec, offsets: Sequence[int], error: BaseException) -> Decision:
        """A final failure: the retries spent or not allowed, or the messages given up on without a call (their
        calls were killed by the hard time limit, or their worker died, more often than the retries allow)."""
        if self.final is Final.STOP:
            return Decision(Fate.STOP, error, letters=dict.fromkeys(range(len(offsets)), error))
        if self.final is Final.DELIVER_AGAIN:
            return Decision(Fate.LATER, error)
        if handler.on_error is OnError.RELEASE:
            return Decision(Fate.RELEASE, error)
        if self._over_dlq_limit(handler, offsets):
            return Decision(Fate.RELEASE, error, in_a_row=self.dead_letters_in_a_row)
        return self._dead_lettered(offsets, dead_letter(error, len(offsets)))

    def _rejected(self, offsets: Sequence[int], error: BaseException) -> Decision:
        """``Reject``: to the dead-letter topic at once, whatever on_error; of a typed batch only the messages that
        did not decode, each with its own error (the handler had the others)."""
        letters = rejected_of(error, len(offsets))
        if self.final is Final.STOP:
            return Decision(Fate.STOP, error, letters=letters)
        self.outcomes.rejected += len(letters)
        return self._dead_lettered(offsets, Decision(Fate.DEAD_LETTER, error, letters=letters))

    def _dead_lettered(self, offsets: Sequence[int], decision: Decision) -> Decision:
        if offsets and offsets[0] != self._dead_letters_end:
            self.dead_letters_in_a_row = 0
        self.dead_letters_in_a_row += len(decision.letters)
        self._dead_letters_end = offsets[max(decision.letters)] + 1 if decision.letters else self._dead_letters_end
        return decision

    def _over_dlq_limit(self, handler: HandlerSpec, offsets: Sequence[int]) -> bool:
        """Have ``dlq_limit`` messages in a row gone to the dead-letter topic just before ``offsets``?"""
        if not handler.dlq_limit:
            return False
        if offsets[0] != self._dead_letters_end:
            self.dead_letters_in_a_row = 0
        return self.dead_letters_in_a_row >= handler.dlq_limit
