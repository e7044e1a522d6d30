"""Counts of what became of failed handler calls, kept in a worker and sent to its supervisor for the metrics.

A worker counts every failed call by error type, every retry, every message a handler ignored
(``raise Ignore()``) or rejected (``raise Reject()``), every message older than the handler's ``max_age``
(not handled: skipped or dead-lettered, message_age.py), and every message redriven for another group (passed
by, dead_letter_groups.py).  Every half second (its housekeeping) it sends what
changed to its supervisor over its pipe (an ``Outcomes`` message, runtime/messages.py); the supervisor adds it to its counters
(metrics.Counters) and the metrics endpoint shows them as ``marshal_workers_handler_errors_total{error_type}``,
``marshal_workers_handler_retries_total`` and ``marshal_workers_handler_outcomes_total{outcome}``.  A count
not yet sent when a worker is killed is lost: these are metrics, not accounting (the coordination log and the
dead-letter topic are that).
"""

from __future__ import annotations

import collections
from typing import Any


class OutcomeCounts:
    """What a worker saw since it last sent its counts."""

    def __init__(self) -> None:
        self.errors: collections.Counter[str] = collections.Counter()  # failed calls, by error type
        self.retries = 0
        self.ignored = 0  # messages
        self.rejected = 0  # messages
        self.too_old = 0  # messages past max_age, not handled
        self.other_group = 0  # messages redriven for another group, passed by

    def failed(self, error: BaseException) -> None:
        self.errors[type(error).__qualname__] += 1

    def take(self) -> dict[str, Any] | None:
        """The counts of what changed since the last take (None if nothing did), and start again."""
        if not (self.errors or self.retries or self.ignored or self.rejected or self.too_old or self.other_group):
            return None
        counts = {
            "errors": dict(self.errors),
            "retries": self.retries,
            "ignored": self.ignored,
            "rejected": self.rejected,
            "too_old": self.too_old,
            "other_group": self.other_group,
        }
        self.errors.clear()
        self.retries = self.ignored = self.rejected = self.too_old = self.other_group = 0
        return counts
