"""The spans of ``marshal-workers serve`` (http/http_spans.py, docs/http-service.md "Tracing"): a read that hands out
messages is a ``receive`` span linked to each message's traceparent, an ack or cancel a ``settle`` span, a failed
request one with ``error.type``; the request's own ``traceparent`` header is the parent.  Through the service's
real aiohttp app (a topic stand-in answers reads and acks: the coordination log is e2e-tested in
tests/e2e/test_http_service.py and test_serve_tracing.py) and the SDK's in-memory exporter on a provider of the
test's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from marshal_workers.core import tracing
from marshal_workers.core.config import Settings
from marshal_workers.http.group_commit import Kind
from marshal_workers.http.http_messages import BadRequest, MessageId, message_json
from marshal_workers.http.http_service import make_app
from marshal_workers.http.http_spans import Outcome, ServeSpans
from marshal_workers.http.settlements import Settlement

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_ID = "00f067aa0ba902b7"
CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def handed(
    partition: int, offset: int, headers: Sequence[tuple[str, bytes]], key: bytes | None = b"k-1"
) -> dict[str, Any]:
    return message_json("orders", partition, offset, key, b"{}", headers, None, 0, 1)


class TopicStandIn:
    """What the service's routes ask of a ServedTopic: reads hand out ``messages`` once; acks and cancels are
    confirmed at once, unless ``refuse`` says how they fail."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.settings = Settings(group="billing", client_id="server-1")
        self.topic = "orders"
        self.messages = messages
        self.on_news: Any = None
        self.waiting_readers = 0
        self.stopping = False
        self.refuse: BadRequest | None = None

    @property
    def available_now(self) -> int:
        return len(self.messages)

    def hand_out(self, most: int) -> asyncio.Future[list[dict[str, Any]]]:
        out, self.messages = self.messages[:most], self.messages[most:]
        return done(out)

    def message_states(self, ids: Sequence[MessageId]) -> list[str]:
        if self.refuse is not None:
            raise self.refuse
        return ["pending"] * len(ids)

    @staticmethod
    def log_may_lag(states: Sequence[str]) -> bool:
        return False

    def settlement(self, ids: Sequence[MessageId], states: Sequence[str], kind: Kind) -> Settlement:
        return Settlement(kind, "acked" if kind is Kind.ACK else "cancelled", list(ids), 0)

    def write_settlement(self, settlement: Settlement) -> asyncio.Future[list[bool]]:
        return done([True] * len(settlement.todo))

    def settled(self, settlement: Settlement, verdicts: Sequence[bool]) -> dict[str, Any]:
        return {settlement.verb: len(settlement.todo), "already": 0}


def done(result: Any) -> asyncio.Future[Any]:
    """A group commit's verdict, known already (on the running loop, as the group commit's are)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


def call(topic: TopicStandIn, requests: list[tuple[str, Any, dict[str, str]]]) -> list[int]:
    """POST each (path, JSON body, headers) to the service's app; the statuses."""

    async def run() -> list[int]:
        async with TestClient(TestServer(make_app(topic, None))) as client:  # type: ignore[arg-type]
            statuses = []
            for path, body, headers in requests:
                response = await client.post(path, json=body, headers=headers)
                statuses.append(response.status)
            return statuses

    return asyncio.run(run())


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def hex_trace(span_context: Any) -> str:
    return format(span_context.trace_id, "032x")


def test_a_read_of_one_message_is_a_receive_span_linked_to_the_producers_trace(spans: InMemorySpanExporter) -> None:
    topic = TopicStandIn([handed(1, 7, [("traceparent", traceparent(TRACE_ID, PRODUCER_ID).encode())])])
    assert call(topic, [("/read?timeout=0", None, {})]) == [200]
    span = only(spans)
    assert span.name == "receive orders" and span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "receive",
        "messaging.operation.name": "receive",
        "messaging.destination.name": "orders",
        "messaging.consumer.group.name": "billing",
        "messaging.client.id": "server-1",
        "messaging.destination.partition.id": "1",
        "kafka.offset": 7,
        "kafka.message.key": "k-1",
    }
    (link,) = span.links
    assert hex_trace(link.context) == TRACE_ID and format(link.context.span_id, "016x") == PRODUCER_ID
    assert span.parent is None  # the client sent no traceparent: a trace of its own, linked to the producer's


def test_a_batch_read_counts_its_messages_and_links_each_valid_trace(spans: InMemorySpanExporter) -> None:
    other = "5" * 32
    binary = handed(0, 3, [("traceparent", traceparent(other, PRODUCER_ID).encode()), ("blob", b"\xff")], key=b"\xfe")
    assert binary["encoding"] == "base64"  # its traceparent comes back out of base64
    topic = TopicStandIn(
        [
            handed(0, 1, [("traceparent", traceparent(TRACE_ID, PRODUCER_ID).encode())]),
            handed(0, 2, [("traceparent", b"not-a-traceparent")]),
            binary,
        ]
    )
    assert call(topic, [("/read?timeout=0&max=10", None, {})]) == [200]
    span = only(spans)
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3
    assert attributes["messaging.destination.partition.id"] == "0"  # all from one partition
    assert "kafka.offset" not in attributes and "kafka.message.key" not in attributes
    assert sorted((hex_trace(link.context), (link.attributes or {})["kafka.offset"]) for link in span.links) == [
        (TRACE_ID, 1),
        (other, 3),
    ]


def test_a_read_that_hands_out_nothing_makes_no_span(spans: InMemorySpanExporter) -> None:
    assert call(TopicStandIn([]), [("/read?timeout=0", None, {})]) == [204]
    assert spans.get_finished_spans() == ()


def test_an_ack_is_a_settle_span_whose_parent_is_the_requests_traceparent(spans: InMemorySpanExporter) -> None:
    headers = {"traceparent": traceparent(CLIENT_TRACE_ID, CLIENT_SPAN_ID)}
    body = [{"topic": "orders", "partition": 1, "offset": 7}]
    assert call(TopicStandIn([]), [("/ack", body, headers)]) == [200]
    span = only(spans)
    assert span.name == "ack orders" and span.kind is SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes["messaging.operation.type"] == "settle" and attributes["messaging.operation.name"] == "ack"
    assert attributes["messaging.destination.partition.id"] == "1" and attributes["kafka.offset"] == 7
    assert "error.type" not in attributes and span.status.status_code is StatusCode.UNSET
    assert hex_trace(span.context) == CLIENT_TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == CLIENT_SPAN_ID


def test_a_cancel_of_several_messages_counts_them(spans: InMemorySpanExporter) -> None:
    body = [{"topic": "orders", "partition": p, "offset": 4} for p in (0, 1)]
    assert call(TopicStandIn([]), [("/cancel", body, {})]) == [200]
    span = only(spans)
    attributes = dict(span.attributes or {})
    assert span.name == "cancel orders" and attributes["messaging.operation.type"] == "settle"
    assert attributes["messaging.batch.message_count"] == 2
    assert "messaging.destination.partition.id" not in attributes  # two partitions


def test_a_refused_ack_is_a_failed_span_with_its_error_type(spans: InMemorySpanExporter) -> None:
    topic = TopicStandIn([])
    topic.refuse = BadRequest(409, "not_pending", "1 of the messages cannot be acked: nothing was acked")
    assert call(topic, [("/ack", {"topic": "orders", "partition": 0, "offset": 1}, {})]) == [409]
    span = only(spans)
    assert (span.attributes or {})["error.type"] == "not_pending"
    assert span.status.status_code is StatusCode.ERROR and "409" in (span.status.description or "")


def test_a_bad_request_and_a_stopping_server_are_failed_spans(spans: InMemorySpanExporter) -> None:
    topic = TopicStandIn([])
    topic.stopping = True
    assert call(topic, [("/ack", "garbage", {}), ("/read?timeout=0", None, {"traceparent": "00-bad"})]) == [400, 503]
    bad, stopping = spans.get_finished_spans()
    assert bad.name == "ack orders" and (bad.attributes or {})["error.type"] == "bad_body"
    assert stopping.name == "receive orders" and (stopping.attributes or {})["error.type"] == "stopping"
    assert stopping.parent is None  # a malformed traceparent header is ignored


def test_healthz_and_metrics_make_no_spans(spans: InMemorySpanExporter) -> None:
    span_maker = ServeSpans(None, "orders", "billing", "server-1")
    assert not span_maker.wanted(Outcome("/healthz", 200))
    assert not span_maker.wanted(Outcome("/read", 204))
    assert span_maker.wanted(Outcome("/read", 503, "stopping"))


def test_without_tracing_the_service_imports_no_opentelemetry() -> None:
    """Unconfigured, serve's set-up imports nothing of OpenTelemetry (checked in a fresh interpreter: this one has
    imported it already)."""
    script = (
        "import sys\n"
        "from marshal_workers.core import tracing\n"
        "from marshal_workers.http import http_service\n"
        "assert tracing.start_in_server({'OTEL_TRACES_EXPORTER': 'none'}) is False\n"
        "assert tracing.current_tracer() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_without_tracing_requests_are_served_and_no_span_is_made() -> None:
    assert not tracing.active()
    assert ServeSpans.if_tracing("orders", "billing", "server-1") is None
    topic = TopicStandIn([handed(0, 1, [("traceparent", traceparent(TRACE_ID, PRODUCER_ID).encode())])])
    assert call(
        topic, [("/read?timeout=0", None, {}), ("/ack", {"topic": "orders", "partition": 0, "offset": 1}, {})]
    ) == [200, 200]
