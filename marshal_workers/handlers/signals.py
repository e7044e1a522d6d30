"""What a handler raises to say what should happen to its message: Retry, Reject, Ignore.

Signals, not errors: each names an outcome (retry_policy.py acts on them; Celery's and Dramatiq's anchors), and
users import them from the package itself: ``from marshal_workers import Retry, Reject, Ignore``.
"""

from __future__ import annotations

from marshal_workers.core.durations import parse_duration


class Retry(Exception):
    """``raise Retry(delay=5)``: try the message again, after ``delay`` seconds (or a string such as ``"5s"``;
    None: the handler's backoff).  Counted against ``retries``; once they are spent, ``on_error`` applies."""

    def __init__(self, delay: float | str | None = None, reason: str = "") -> None:
        self.delay = None if delay is None else 0.0 if delay == 0 else parse_duration(delay)
        self.reason = reason
        super().__init__(reason or (f"retry in {self.delay:g}s" if self.delay is not None else "retry"))


class Reject(Exception):
    """``raise Reject("malformed order")``: no retry; the message goes to the dead-letter topic at once, whatever
    the handler's ``on_error``, with this as its error."""


class Ignore(Exception):
    """``raise Ignore()``: no retry, no dead letter; the message counts as done (and as ignored in the metrics)."""
