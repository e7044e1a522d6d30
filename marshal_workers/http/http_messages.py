"""What the Read / Ack / Cancel service reads from and writes to HTTP clients (docs/http-service.md): pure.

Requests are untrusted input: every parser here returns a value or raises
:class:`BadRequest` (a 4xx with a JSON error), never anything else, and
changes nothing.  Kafka messages go out as JSON objects: key, value and
header values as UTF-8 text when every one of them is valid UTF-8
(``"encoding": "utf-8"``), else all of them base64 (``"encoding": "base64"``),
so a client decodes one message one way.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from marshal_workers.core.durations import parse_duration
from marshal_workers.errors import ConfigError

MAX_READ: Final = 1000  # messages per read
MAX_READ_WAIT_S: Final = 60.0  # a long poll lasts at most this
MAX_ITEMS: Final = 10_000  # messages per ack or cancel
# A read's query as the OpenAPI document states it (http_openapi.py), in ASCII: Python's \\d and str.isdigit() take
# other scripts' digits too ("²" is a digit int() refuses), which would let a query past the check and fail later.
TIMEOUT_PATTERN: Final = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)?$"
_TIMEOUT = re.compile(TIMEOUT_PATTERN)
_WHOLE_NUMBER = re.compile(r"^[0-9]+$")


class BadRequest(Exception):
    """A request the service refuses: ``status`` (4xx), ``error`` (a short code) and a message saying what to do."""

    def __init__(self, status: int, error: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.details = details

    def body(self) -> bytes:
        return orjson.dumps({"error": self.error, "message": str(self), **self.details})


@dataclass(frozen=True)
class ReadRequest:
    wait_s: float  # how long to wait for a message before answering 204
    most: int  # at most this many messages


@dataclass(frozen=True, order=True)
class MessageId:
    topic: str
    partition: int
    offset: int


def read_request(query: dict[str, str]) -> ReadRequest:
    """``POST /read?timeout=5s&max=N``: timeout a duration (default 5s, 0 answers at once), max 1 to 1000."""
    unknown = sorted(set(query) - {"timeout", "max"})
    if unknown:
        raise BadRequest(400, "bad_parameter", f"unknown query parameter {unknown[0]!r}: use timeout and max")
    text = query.get("timeout", "5s")
    if not _TIMEOUT.fullmatch(text):
        raise BadRequest(400, "bad_timeout", f"timeout is a duration such as 5s, 250ms or 0, got {text!r}")
    try:
        wait_s = 0.0 if float(text.rstrip("mshd")) == 0 else parse_duration(text)
    except ConfigError as exc:
        raise BadRequest(400, "bad_timeout", f"timeout: {exc}") from None
    if wait_s > MAX_READ_WAIT_S:
        raise BadRequest(400, "bad_timeout", f"timeout is at most {MAX_READ_WAIT_S:.0f}s, got {text!r}")
    most_text = query.get("max", "1")
    if not _WHOLE_NUMBER.fullmatch(most_text) or not 1 <= int(most_text) <= MAX_READ:
        raise BadRequest(400, "bad_max", f"max is a whole number from 1 to {MAX_READ}, got {most_text!r}")
    return ReadRequest(wait_s, int(most_text))


def message_ids(body: bytes) -> list[MessageId]:
    """The body of ``POST /ack`` and ``POST /cancel``: a JSON list of ``{"topic", "partition", "offset"}`` objects
    (a single object is taken as a list of one).  Duplicates are dropped; the order is kept."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, "bad_json", f"the body is not JSON: {exc}") from None
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list) or not parsed:
        raise BadRequest(400, "bad_body", 'send a JSON list of {"topic", "partition", "offset"} objects')
    if len(parsed) > MAX_ITEMS:
        raise BadRequest(413, "too_many", f"at most {MAX_ITEMS} messages per request, got {len(parsed)}")
    found: dict[MessageId, None] = {}
    for index, item in enumerate(parsed):
        found[_message_id(item, index)] = None
    return list(found)


def _message_id(item: Any, index: int) -> MessageId:
    if not isinstance(item, dict):
        raise BadRequest(400, "bad_body", f"item {index} is not an object with topic, partition and offset")
    topic, partition, offset = item.get("topic"), item.get("partition"), item.get("offset")
    if not isinstance(topic, str) or not topic:
        raise BadRequest(400, "bad_body", f"item {index}: topic must be a non-empty string")
    for name, value in (("partition", partition), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise BadRequest(400, "bad_body", f"item {index}: {name} must be a whole number >= 0, got {value!r}")
    return MessageId(topic, partition, offset)  # type: ignore[arg-type]


def message_json(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    timestamp: int | None,
    deadline: int,
    deliveries: int,
) -> dict[str, Any]:
    """One Kafka message as the service hands it out (``deadline``: ms since epoch; ack before it)."""
    try:  # each part decoded once: as text when every part is UTF-8 (the usual case), else every part base64
        as_text = True
        key_out, value_out = _text(key), _text(value)
        headers_out = [[name, _text(v)] for name, v in headers]
    except UnicodeDecodeError:
        as_text = False
        key_out, value_out = _base64(key), _base64(value)
        headers_out = [[name, _base64(v)] for name, v in headers]
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key_out,
        "value": value_out,
        "headers": headers_out,
        "encoding": "utf-8" if as_text else "base64",
        "timestamp": timestamp,
        "deadline": deadline,
        "deliveries": deliveries,
    }


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def _base64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")
