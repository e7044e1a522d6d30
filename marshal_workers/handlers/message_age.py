"""Old messages: ``@app.handler(topic, max_age="1h")`` (docs/handlers.md, "Old messages").

A message whose Kafka timestamp is older than ``max_age`` when its worker gets to it is not handled: it is
skipped (``on_too_old="skip"``, the default) or dead-lettered with ``error_type`` ``MessageTooOld``
(``on_too_old="dlq"``), and counted as ``outcome="too_old"`` in ``marshal_workers_handler_outcomes_total``.
A message without a timestamp is handled.

Pure: the record's timestamp and ``now`` (wall-clock milliseconds, as Kafka timestamps are) in, a verdict out.
"""

from __future__ import annotations

import enum
from typing import Any

from marshal_workers.errors import MessageTooOld

_NO_TIMESTAMP = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE


class OnTooOld(str, enum.Enum):
    SKIP = "skip"  # done without a call, counted
    DLQ = "dlq"  # to the dead-letter topic, error_type MessageTooOld, counted


def is_too_old(timestamp: tuple[int, int], now_ms: int, max_age_ms: int) -> bool:
    """Is a record with this ``timestamp()`` (kind, milliseconds) older than ``max_age_ms`` at ``now_ms``?
    A record without a timestamp (kind 0, or a negative one) is not."""
    kind, stamp = timestamp
    return kind != _NO_TIMESTAMP and stamp >= 0 and now_ms - stamp > max_age_ms


def split_by_age(records: list[Any], now_ms: int, max_age_ms: int) -> tuple[list[Any], list[Any]]:
    """(the records to handle, the ones too old), each in offset order."""
    fresh: list[Any] = []
    old: list[Any] = []
    for record in records:
        (old if is_too_old(record.timestamp(), now_ms, max_age_ms) else fresh).append(record)
    return fresh, old


def too_old_error(timestamp: tuple[int, int], now_ms: int, max_age_ms: int) -> MessageTooOld:
    """The dead letter's error for a message too old (on_too_old="dlq")."""
    return MessageTooOld(f"{(now_ms - timestamp[1]) / 1000:.0f}s old, past max_age ({max_age_ms / 1000:g}s)")
