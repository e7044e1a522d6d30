"""Built-in tracing (issue 28, part 4; core/tracing.py): one CONSUMER span per handler call with the Kafka messaging
attributes, parented on the message's traceparent (a bad one ignored), its outcome, retries as events; the context
injected into what app.send sends.  The SDK's in-memory exporter on a provider of the test's own (never the global
one, so the rest of the suite runs untraced)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from marshal_workers import App
from marshal_workers.core import tracing
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.app import Message
from marshal_workers.kafka.dead_letter_writer import error_headers
from marshal_workers.testing import FakeRecord, make_message

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def traced_call(function: Any, msg: Any, topic: str = "orders", batch: bool = False) -> Any:
    return tracing.traced(function, topic, batch, "billing", "host-1")(msg)


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def test_without_tracing_the_handler_is_left_as_it_is() -> None:
    def handler(msg: Message) -> None:
        pass

    assert not tracing.active()
    assert tracing.traced(handler, "orders", False, "billing", "host-1") is handler
    assert tracing.with_trace_context([("a", b"1")]) == [("a", b"1")]


def test_tracing_stays_off_without_an_exporter_or_a_provider() -> None:
    assert tracing.start_in_worker({}) is False
    assert tracing.start_in_worker({"OTEL_TRACES_EXPORTER": "none"}) is False
    assert not tracing.active()


def test_a_span_per_call_carries_the_kafka_messaging_attributes(spans: InMemorySpanExporter) -> None:
    msg = make_message(b"{}", topic="orders", partition=3, offset=42, key="customer-7")
    traced_call(lambda m: None, msg)
    span = only_span(spans)
    assert span.name == "process orders"
    assert span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "orders",
        "messaging.destination.partition.id": "3",
        "kafka.offset": 42,
        "kafka.message.key": "customer-7",
        "messaging.consumer.group.name": "billing",
        "messaging.client.id": "host-1",
        "marshal_workers.outcome": "ok",
    }


def test_a_binary_key_is_left_off_the_span(spans: InMemorySpanExporter) -> None:
    traced_call(lambda m: None, make_message(b"", topic="orders", key=b"\xff\xfe\x00"))
    assert "kafka.message.key" not in (only_span(spans).attributes or {})


def test_the_span_continues_the_trace_of_the_messages_traceparent(spans: InMemorySpanExporter) -> None:
    seen: list[Any] = []
    traced_call(
        lambda m: seen.append(trace.get_current_span().get_span_context()),
        make_message(b"", topic="orders", headers={"traceparent": TRACEPARENT}),
    )
    span = only_span(spans)
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    assert seen == [span.context]  # the span is current inside the handler


@pytest.mark.parametrize("bad", [b"garbage", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01", b"\xff\x00", b""])
def test_a_bad_traceparent_is_ignored(spans: InMemorySpanExporter, bad: bytes) -> None:
    traced_call(lambda m: None, make_message(b"", topic="orders", headers=[("traceparent", bad)]))
    span = only_span(spans)
    assert span.parent is None
    assert span.context.is_valid and format(span.context.trace_id, "032x") != "0" * 32


def test_a_failure_is_recorded_with_its_error_type(spans: InMemorySpanExporter) -> None:
    class PaymentDeclined(Exception):
        pass

    def handler(msg: Message) -> None:
        raise PaymentDeclined("card expired")

    with pytest.raises(PaymentDeclined):
        traced_call(handler, make_message(b"", topic="orders"))
    span = only_span(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[
        "error.type"
    ] == "test_a_failure_is_recorded_with_its_error_type.<locals>.PaymentDeclined"
    assert (span.attributes or {})["marshal_workers.outcome"] == "error"
    assert [event.name for event in span.events] == ["exception"]


def test_a_retry_is_an_event_on_its_span(spans: InMemorySpanExporter) -> None:
    traced_call(lambda m: None, Message(FakeRecord("orders", 0, 5), 3))
    retry = [event for event in only_span(spans).events if event.name == "retry"]
    assert len(retry) == 1 and (retry[0].attributes or {})["marshal_workers.attempt"] == 3


def test_a_batch_is_one_span_linked_to_each_messages_trace(spans: InMemorySpanExporter) -> None:
    other = "5" * 32
    batch = [
        make_message(b"", topic="orders", offset=1, headers={"traceparent": TRACEPARENT}),
        make_message(b"", topic="orders", offset=2, headers={"traceparent": f"00-{other}-{PARENT_ID}-01"}),
        make_message(b"", topic="orders", offset=3, headers={"traceparent": "bad"}),
    ]
    traced_call(lambda ms: None, batch, batch=True)
    span = only_span(spans)
    assert (span.attributes or {})["messaging.batch.message_count"] == 3
    assert sorted(format(link.context.trace_id, "032x") for link in span.links) == sorted([TRACE_ID, other])


def test_an_async_handler_runs_inside_its_span(spans: InMemorySpanExporter) -> None:
    seen: list[Any] = []

    async def handler(msg: Message) -> None:
        await asyncio.sleep(0)
        seen.append(trace.get_current_span().get_span_context())

    wrapped = tracing.traced(handler, "orders", False, "billing", "host-1")
    asyncio.run(wrapped(make_message(b"", topic="orders", headers={"traceparent": TRACEPARENT})))
    span = only_span(spans)
    assert seen == [span.context] and format(span.context.trace_id, "032x") == TRACE_ID


class RecordingOutbox:
    def __init__(self) -> None:
        self.headers: list[Any] = []

    def send(self, topic: str, value: bytes | None, key: Any, headers: Any) -> None:
        self.headers.append(headers)


def test_app_send_in_a_handler_carries_the_handlers_trace(spans: InMemorySpanExporter) -> None:
    app = App("billing")
    outbox = RecordingOutbox()
    app.outbox = outbox  # type: ignore[assignment]  # as take_up_handler does in a worker

    def handler(msg: Message) -> None:
        app.send("invoices", b"x", headers={"kind": "invoice"})
        app.send("audit", b"y", headers={"traceparent": "00-" + "7" * 32 + "-" + "1" * 16 + "-01"})

    traced_call(handler, make_message(b"", topic="orders", headers={"traceparent": TRACEPARENT}))
    finished = {span.name: span for span in spans.get_finished_spans()}
    call, invoices = finished["process orders"], finished["send invoices"]
    assert invoices.kind is SpanKind.PRODUCER and invoices.parent.span_id == call.context.span_id
    assert invoices.attributes["messaging.destination.name"] == "invoices"
    sent = dict(outbox.headers[0])
    assert sent["kind"] == b"invoice"
    assert sent["traceparent"] == f"00-{TRACE_ID}-{format(invoices.context.span_id, '016x')}-01".encode(), (
        "the message carries its send span, the call's child"
    )
    assert (
        dict(outbox.headers[1])["traceparent"] == ("00-" + "7" * 32 + "-" + "1" * 16 + "-01").encode()
    )  # the sender's own


def test_app_send_without_tracing_adds_no_headers() -> None:
    app = App("billing")
    outbox = RecordingOutbox()
    app.outbox = outbox  # type: ignore[assignment]
    app.send("invoices", b"x")
    assert outbox.headers == [None]


def test_an_unknown_exporter_is_refused_with_what_to_use() -> None:
    with pytest.raises(ConfigError, match="otlp, console"):
        tracing.start_in_worker({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not tracing.active()


def test_a_dead_letter_continues_the_trace_of_the_call_that_failed(spans: InMemorySpanExporter) -> None:
    def handler(msg: Message) -> None:
        raise ValueError("no such customer")

    msg = make_message(b"", topic="orders", headers={"traceparent": TRACEPARENT})
    with pytest.raises(ValueError) as raised:
        traced_call(handler, msg)
    span = only_span(spans)
    headers = error_headers("billing.handler", FakeRecord("orders", 0, 0), raised.value)
    assert dict(headers)["traceparent"] == f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01".encode()


def test_a_dead_letter_of_an_error_never_raised_in_a_traced_call_has_no_trace_headers(
    spans: InMemorySpanExporter,
) -> None:
    headers = error_headers("billing.handler", FakeRecord("orders", 0, 0), RuntimeError("worker lost"))
    assert "traceparent" not in dict(headers)
