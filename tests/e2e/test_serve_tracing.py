"""``marshal-workers serve`` traced end to end (issue 28; docs/http-service.md "Tracing"): a server configured only
by the standard OTEL_* environment variables exports over OTLP/HTTP, to the receiver the test runs (tests/otlp.py),
a ``receive`` span for each read that handed messages out, linked to each message's producer trace, and a
``settle`` span for each ack, parented on the client's own ``traceparent`` header; the spans wait in the server's
buffer until the flush as it stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Producer
from fleet import Fleet
from otlp import OtlpReceiver, attributes, hex_ids
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode

pytestmark = [pytest.mark.broker, pytest.mark.fleet(name="served", partitions=1)]

CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"
MESSAGES = 5


def producer_trace(n: int) -> tuple[str, str]:
    """The (trace id, span id) the producer gave message ``n``."""
    return f"{n + 1:032x}", f"{n + 1:016x}"


def post(url: str, path: str, body: Any = None, traceparent: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode() if body is not None else b"", method="POST"
    )
    if traceparent is not None:
        request.add_header("traceparent", traceparent)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
            return response.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_a_served_topics_reads_link_the_producers_traces_and_its_acks_continue_the_clients(
    fleet: Fleet, receiver: OtlpReceiver
) -> None:
    producer = Producer({"bootstrap.servers": fleet.brokers})
    for n in range(MESSAGES):
        trace_id, span_id = producer_trace(n)
        producer.produce(
            fleet.topic,
            value=str(n).encode(),
            partition=0,
            headers=[("traceparent", f"00-{trace_id}-{span_id}-01".encode())],
        )
    assert producer.flush(30) == 0
    server, url = fleet.serve(
        "server-1",
        "--range-size",
        "20",
        OTEL_SERVICE_NAME="orders-gateway",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="60000",  # spans wait a minute in the buffer: only the flush at SIGTERM sends them
    )
    poll_until(lambda: healthy(url), timeout=60, what="the server answering")

    client_parent = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
    status, first = post(url, "/read?timeout=30s&max=1", traceparent=client_parent)
    assert status == 200 and len(first["messages"]) == 1
    rest: list[dict[str, Any]] = []
    while len(rest) < MESSAGES - 1:  # the others, in one read or a few
        status, body = post(url, "/read?timeout=30s&max=10")
        assert status == 200, body
        rest += body["messages"]
    handed = first["messages"] + rest
    ids = [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in handed]
    assert post(url, "/ack", ids[:1], traceparent=client_parent)[0] == 200
    assert post(url, "/ack", ids[1:])[0] == 200
    assert post(url, "/ack", ids[:1])[0] == 200  # acked already: still a settle span, not an error

    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK

    reads = poll_until(lambda: receiver.received(f"receive {fleet.topic}") or None, timeout=30, what="the read spans")
    acks = poll_until(lambda: len(receiver.received(f"ack {fleet.topic}")) >= 3 or None, timeout=30, what="ack spans")
    assert acks
    assert {service for service, _ in receiver.spans} == {"orders-gateway"}
    by_offset = {m["offset"]: int(m["value"]) for m in handed}

    spans = [span for _, span in reads]
    single = next(span for span in spans if hex_ids(span)[0] == CLIENT_TRACE_ID)
    assert single.kind == 3  # SPAN_KIND_CLIENT, as the conventions give for receive
    assert single.parent_span_id.hex() == CLIENT_SPAN_ID  # the client's trace continues
    found = attributes(single)
    assert found["messaging.system"] == "kafka"
    assert found["messaging.operation.type"] == "receive"
    assert found["messaging.destination.name"] == fleet.topic
    assert found["messaging.consumer.group.name"] == fleet.group
    assert found["messaging.client.id"] == "server-1"
    assert found["messaging.destination.partition.id"] == "0"
    assert found["kafka.offset"] == first["messages"][0]["offset"]
    assert "messaging.batch.message_count" not in found  # max=1: a single-message read
    [link] = single.links
    assert hex_ids(link) == producer_trace(by_offset[found["kafka.offset"]])  # the producer's trace connects

    batches = [span for span in spans if span is not single]
    assert sum(attributes(span)["messaging.batch.message_count"] for span in batches) == MESSAGES - 1
    linked = {hex_ids(link) for span in batches for link in span.links}
    assert linked == {producer_trace(by_offset[m["offset"]]) for m in rest}
    for span in batches:
        assert len(span.links) == attributes(span)["messaging.batch.message_count"]

    settles = sorted(
        (span for _, span in receiver.received(f"ack {fleet.topic}")), key=lambda s: s.start_time_unix_nano
    )
    assert len(settles) == 3
    for span in settles:
        found = attributes(span)
        assert span.kind == 3 and found["messaging.operation.type"] == "settle"
        assert found["messaging.operation.name"] == "ack" and "error.type" not in found
    assert hex_ids(settles[0])[0] == CLIENT_TRACE_ID and settles[0].parent_span_id.hex() == CLIENT_SPAN_ID
    assert attributes(settles[0])["kafka.offset"] == ids[0]["offset"]
    assert attributes(settles[1])["messaging.batch.message_count"] == MESSAGES - 1
