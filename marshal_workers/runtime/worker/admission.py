"""What the limits (rate_limit, max_age) and the group (a message redriven for another, dead_letter_groups.py) say
about the next messages of the one-call and batch loops (one_call_loop.py, batch_loop.py).  The lanes keep their own
account of tokens (lane_runner.py)."""

from __future__ import annotations

import enum
from typing import Any

from marshal_workers.handlers.app import HandlerSpec
from marshal_workers.handlers.message_age import is_too_old, split_by_age
from marshal_workers.handlers.rate_limits import Throttle
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.worker.failures import Failures, wall_ms
from marshal_workers.runtime.worker.link import SupervisorLink


class Admit(enum.Enum):
    """What becomes of the next message."""

    CALL = "call"  # call the handler on it
    PASS = "pass"  # past max_age, or redriven for another group: done without a call
    STOP = "stop"  # asked to stop while waiting for a token: not begun


class Admission:
    """The handler's rate and age limits, applied to a partition worker's messages."""

    def __init__(self, link: SupervisorLink, failures: Failures, throttle: Throttle | None, max_age_ms: int) -> None:
        self.link = link
        self.failures = failures
        self.throttle = throttle  # the handler's rate_limit, if any
        self.max_age_ms = max_age_ms  # the handler's max_age, 0: none
        self.limited = throttle is not None or bool(max_age_ms)  # a check before each message

    def admit(self, handler: HandlerSpec, record: Any) -> Admit:
        """One message under max_age and rate_limit: for another group or too old (done without a call), or its
        token taken (or a stop came while waiting for it)."""
        if self.link.not_ours and self.link.passes_by(record.offset()):
            return Admit.PASS
        if self.max_age_ms and is_too_old(record.timestamp(), wall_ms(), self.max_age_ms):
            self.failures.too_old(handler, [record])
            return Admit.PASS
        if self.throttle is not None and not self.take_tokens(1):
            return Admit.STOP
        return Admit.CALL

    def take_tokens(self, count: int) -> bool:
        """Wait for ``count`` tokens of the handler's rate limit, looking after the worker meanwhile; then make
        sure the lease still holds.  False if asked to stop first."""
        assert self.throttle is not None
        if not self.throttle.acquire(count, self._still_waiting):
            return False
        return self.link.lease_holds()

    def _still_waiting(self) -> bool:
        self.link.housekeeping()
        return not self.link.stopping

    def drop_old_run(self, handler: HandlerSpec, records: list[Any]) -> list[Any]:
        """The fetch's leading messages past max_age, done together (one dead-letter write for all of them, not
        one each: an old backlog goes by at the speed of a batch); the rest is left to the loop's own check.
        The run ends at a message for another group: that one is passed by, never dead-lettered here."""
        link = self.link
        now_ms, count, not_ours = wall_ms(), 0, link.not_ours
        while (
            count < len(records)
            and is_too_old(records[count].timestamp(), now_ms, self.max_age_ms)
            and not (not_ours and records[count].offset() in not_ours)
        ):
            count += 1
        if not count or not link.lease_holds():
            return records  # none, or the lease is in doubt: the loop looks at the lease before each message
        self.failures.too_old(handler, records[:count])
        link.fields[Field.NEXT_OFFSET] = records[count - 1].offset() + 1
        link.fields[Field.PROCESSED] += count
        link.count_handled(count)
        return records[count:]

    def split(self, records: list[Any]) -> tuple[list[Any], list[Any], int]:
        """A fetch's messages as (to handle, past max_age, how many were passed by for another group)."""
        link = self.link
        ours = [r for r in records if not link.passes_by(r.offset())] if link.not_ours else records
        fresh, old = split_by_age(ours, wall_ms(), self.max_age_ms) if self.max_age_ms else (ours, [])
        return fresh, old, len(records) - len(ours)
