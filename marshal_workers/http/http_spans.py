"""Spans of ``marshal-workers serve`` (docs/http-service.md, "Tracing"): one per ``POST /read`` that hands out
messages, one per ``POST /ack`` and ``POST /cancel``, and one per request of those routes that fails (4xx/5xx).

They follow the OpenTelemetry messaging semantic conventions (semconv 1.45, as core/tracing.py): a read is a
``receive`` (span kind CLIENT, as the conventions give for receive) linked to each handed-out message's own trace
context (its ``traceparent`` header: the producer's trace connects); an ack or a cancel is a ``settle`` (CLIENT).
The span's parent is the W3C ``traceparent`` HTTP header of the request, if any (a client with tracing continues
its own trace).  Both are untrusted: a malformed one is ignored.

A span is made once the request is answered, with the request's start as its start time: nothing is kept open
while a read waits, and a read that hands out nothing (204) costs nothing.  The service makes a :class:`ServeSpans`
only when tracing is on (core/tracing.py); otherwise a request pays one check of None.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marshal_workers.core import tracing

_log = logging.getLogger(__name__)

ROUTES = {"/read": ("receive", "receive"), "/ack": ("settle", "ack"), "/cancel": ("settle", "cancel")}


@dataclass(frozen=True)
class Outcome:
    """What a request of a traced route came to, as the service learnt it (plain data)."""

    route: str  # /read, /ack or /cancel
    status: int  # the HTTP status answered
    error: str = ""  # the JSON error code of a 4xx/5xx (e.g. not_pending, stopping), "" on success
    message: str = ""  # its message, for the span's status description
    most: int = 0  # a read's max
    messages: Sequence[Mapping[str, Any]] = ()  # a read's handed-out messages, as the service answered them
    ids: Sequence[tuple[int, int]] = ()  # an ack's or cancel's (partition, offset), as the client sent them


class ServeSpans:
    """Makes the service's spans through ``tracer`` (an OpenTelemetry tracer) for one served topic."""

    def __init__(self, tracer: Any, topic: str, group: str, client_id: str) -> None:
        self.tracer = tracer
        self.topic = topic
        self.group = group
        self.base = {
            "messaging.system": "kafka",
            "messaging.destination.name": topic,
            "messaging.consumer.group.name": group,
            "messaging.client.id": client_id,
        }

    @classmethod
    def if_tracing(cls, topic: str, group: str, client_id: str) -> ServeSpans | None:
        """The spans of this process's tracer, or None when tracing is off (then nothing is traced)."""
        tracer = tracing.current_tracer()
        return None if tracer is None else cls(tracer, topic, group, client_id)

    def wanted(self, outcome: Outcome) -> bool:
        """A span for every ack, cancel and failed request; a read only when it handed messages out."""
        return outcome.route in ROUTES and not (
            outcome.route == "/read" and outcome.status < 400 and not outcome.messages
        )

    def record(self, outcome: Outcome, request_headers: Any, start_ns: int) -> None:
        """The span of a request answered: started at ``start_ns`` (time.time_ns()), ended now.  Never raises: a
        failure of tracing is logged and the request is answered as it would be without it."""
        if not self.wanted(outcome):
            return
        try:
            self._record(outcome, request_headers, start_ns)
        except Exception:  # noqa: BLE001 - tracing must never change an answer
            _log.warning(
                "group %s: %s: a span of %s could not be made", self.group, self.topic, outcome.route, exc_info=True
            )

    def _record(self, outcome: Outcome, request_headers: Any, start_ns: int) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        operation_type, operation_name = ROUTES[outcome.route]
        attributes: dict[str, Any] = {
            **self.base,
            "messaging.operation.type": operation_type,
            "messaging.operation.name": operation_name,
        }
        links = []
        if outcome.route == "/read":
            attributes |= _read_attributes(outcome)
            links = _links(outcome.messages)
        else:
            attributes |= _settle_attributes(outcome.ids)
        if outcome.status >= 400:
            attributes["error.type"] = outcome.error or str(outcome.status)
        span = self.tracer.start_span(
            f"{operation_name} {self.topic}",
            context=tracing.context_from_headers(_http_headers(request_headers)),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links,
            start_time=start_ns,
        )
        if outcome.status >= 400:
            span.set_status(Status(StatusCode.ERROR, f"{outcome.status} {outcome.error}: {outcome.message}"[:200]))
        span.end()


def _read_attributes(outcome: Outcome) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if outcome.most > 1:  # a batch read (max > 1): the conventions' batch count, even when fewer came
        found["messaging.batch.message_count"] = len(outcome.messages)
    if len(outcome.messages) == 1:
        (message,) = outcome.messages
        found["messaging.destination.partition.id"] = str(message["partition"])
        found["kafka.offset"] = message["offset"]
        key = _text_of(message.get("key"), message.get("encoding"))
        if key is not None and len(key.encode()) <= tracing.MAX_KEY_CHARS:
            found["kafka.message.key"] = key
    elif outcome.messages and len({m["partition"] for m in outcome.messages}) == 1:
        found["messaging.destination.partition.id"] = str(outcome.messages[0]["partition"])
    return found


def _settle_attributes(ids: Sequence[tuple[int, int]]) -> dict[str, Any]:
    if len(ids) == 1:
        ((partition, offset),) = ids
        return {"messaging.destination.partition.id": str(partition), "kafka.offset": offset}
    found: dict[str, Any] = {"messaging.batch.message_count": len(ids)} if ids else {}
    if ids and len({partition for partition, _ in ids}) == 1:
        found["messaging.destination.partition.id"] = str(ids[0][0])
    return found


def _links(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """A link to each message's creation context (its traceparent), with its partition and offset on the link."""
    from opentelemetry import trace
    from opentelemetry.trace import Link

    links = []
    for message in messages:
        headers = [(name, _text_of(value, message.get("encoding")) or "") for name, value in message.get("headers", ())]
        context = trace.get_current_span(tracing.context_from_headers(headers)).get_span_context()
        if context.is_valid:
            links.append(
                Link(
                    context,
                    {
                        "messaging.destination.partition.id": str(message["partition"]),
                        "kafka.offset": message["offset"],
                    },
                )
            )
    return links


def _text_of(value: Any, encoding: Any) -> str | None:
    """A key or header value as the service answered it (UTF-8 text, or base64 of bytes) back as text; None if it is
    not text (the record's bytes are untrusted)."""
    if not isinstance(value, str):
        return None
    if encoding != "base64":
        return value
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _http_headers(headers: Any) -> list[tuple[str, str]]:
    """The request's trace context headers (``traceparent``, ``tracestate``) as the propagator reads them."""
    return [(name.lower(), value) for name, value in headers.items() if name.lower() in ("traceparent", "tracestate")]
