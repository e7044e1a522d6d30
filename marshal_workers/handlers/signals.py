"""What a handler raises to say what should happen to its message: Retry, Reject, Ignore.

Signals, not errors: each names an outcome (retry_policy.py acts on them; Celery's and Dramatiq's anchors), and
users import them from the package itself: ``from marshal_workers import Retry, Reject, Ignore``.  A typed
handler's payload that does not decode raises ``PayloadError``, a Reject, before the handler is called (models.py).
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


class PayloadError(Reject):
    """A message's value does not decode into its typed handler's model (not JSON, a field missing or of the
    wrong type): a permanent failure, so a ``Reject``: no retry, dead-lettered at once with this as its
    ``error_type`` and the validator's message (the field's path and what is wrong) as its ``error``.

    ``by_position``: for a batch, each undecodable message's own error by its position in the batch (the others
    were handled).  Positions, not offsets: messages made for a test may all carry offset 0."""

    def __init__(self, message: str, by_position: dict[int, PayloadError] | None = None) -> None:
        super().__init__(message)
        self.by_position = by_position or {}


def rejected_of(error: BaseException, count: int) -> dict[int, BaseException]:
    """The messages of a call of ``count`` messages (by their position in it) that a Reject sends to the
    dead-letter topic, each with its error: all of them, but of a typed batch only those that did not decode (the
    handler had the others)."""
    if isinstance(error, PayloadError) and error.by_position:
        return {i: error.by_position[i] for i in range(count) if i in error.by_position}
    return dict.fromkeys(range(count), error)
