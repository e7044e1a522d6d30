"""Built-in tracing (issue 28, part 4) end to end: a fleet configured only by the standard OTEL_* environment
variables exports its handler spans over OTLP/HTTP to a receiver the test runs (decoding each
ExportTraceServiceRequest with the OpenTelemetry protobuf definitions); the producer's trace continues in the
handler's span and in the message the handler sent (tests/apps/send_app.py)."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import Fleet
from otlp import OtlpReceiver, attributes, hex_ids
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode

pytestmark = [pytest.mark.broker, pytest.mark.fleet(name="traced", partitions=2)]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN_ID = "00f067aa0ba902b7"
MESSAGES = 6


def read_output(brokers: str, topic: str, partitions: int) -> list[dict[str, bytes]]:
    """The headers of every message of ``topic``, read to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "output-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: list[dict[str, bytes]] = []
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            message = poll_until(lambda: consumer.poll(0.5), timeout=30, what="the output topic to be read")
            error = message.error()
            if error is None:
                at_end.discard(message.partition())
                found.append(dict(message.headers() or []))
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
    finally:
        consumer.close()
    return found


def test_a_producers_trace_runs_through_the_handler_span_into_what_it_sent(
    fleet: Fleet, receiver: OtlpReceiver, unique: str
) -> None:
    output = f"traced-out-{unique}"
    admin = AdminClient({"bootstrap.servers": fleet.brokers})
    admin.create_topics([NewTopic(output, num_partitions=2, replication_factor=1)])[output].result(10)
    fleet.app = "send_app:app"
    fleet.env |= {
        "MW_TEST_OUTPUT": output,
        "OTEL_SERVICE_NAME": "orders-service",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        # Spans wait a minute in the workers' buffers: only the flush as a worker stops can deliver them.
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }
    supervisor = fleet.start("traced")
    poll_until(lambda: len(fleet.worker_pids("traced")) == 2, what="2 workers")
    fleet.produce(range(MESSAGES), headers=[("traceparent", f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01".encode())])
    poll_until(lambda: len(fleet.lines()) >= MESSAGES, what="every message to be handled")

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK

    name = f"process {fleet.topic}"
    poll_until(lambda: len(receiver.received(name)) >= MESSAGES, timeout=30, what="every handler span to arrive")
    received = receiver.received(name)
    assert len(received) == MESSAGES  # one span per call, none twice
    spans = [span for _, span in received]
    assert {service for service, _ in received} == {"orders-service"}
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    assert {span.parent_span_id.hex() for span in spans} == {PRODUCER_SPAN_ID}
    assert {span.kind for span in spans} == {5}  # SPAN_KIND_CONSUMER
    by_offset = {}
    for span in spans:
        found = attributes(span)
        assert found["messaging.system"] == "kafka"
        assert found["messaging.operation.type"] == "process"
        assert found["messaging.destination.name"] == fleet.topic
        assert found["messaging.consumer.group.name"] == fleet.group
        assert found["messaging.client.id"] == "traced"
        assert found["marshal_workers.outcome"] == "ok"
        by_offset[(found["messaging.destination.partition.id"], found["kafka.offset"])] = span
    assert {partition for partition, _ in by_offset} == {"0", "1"}  # from both workers, flushed as each stopped

    # What each handler call sent has a PRODUCER span, the call's child, in its headers: the trace runs on to the
    # output's consumers.
    poll_until(lambda: len(receiver.received(f"send {output}")) >= MESSAGES, timeout=30, what="every send span")
    sends = {span.span_id: span for _, span in receiver.received(f"send {output}")}
    assert len(sends) == MESSAGES and {span.kind for span in sends.values()} == {4}  # SPAN_KIND_PRODUCER
    outputs = read_output(fleet.brokers, output, 2)
    assert len(outputs) == MESSAGES
    for headers in outputs:
        partition, offset = headers["from"].decode().split(":")
        call = by_offset[(partition, int(offset))]
        _version, trace_id, span_id, _flags = headers["traceparent"].decode().split("-")
        send = sends[bytes.fromhex(span_id)]
        assert (trace_id, send.parent_span_id) == (TRACE_ID, call.span_id), "sent within the call, in its trace"
        assert attributes(send)["messaging.destination.name"] == output


@pytest.mark.fleet(name="traced", partitions=8)
@pytest.mark.parametrize("runner", ["plain", "threads", "async", "shared"])
def test_a_failed_call_is_a_failed_span_with_its_retry_and_its_dead_letter_continues_it(
    fleet: Fleet, receiver: OtlpReceiver, runner: str
) -> None:
    fleet.app = "traceback_app:app"  # 13 fails (ValueError), is retried once, then dead-lettered
    fleet.env |= {
        "MW_TEST_RUNNER": runner,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    supervisor = fleet.start("only", "--processes", "1")
    fleet.produce(range(20), headers=[("traceparent", f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01".encode())])
    [letter] = fleet.dead_letters(1)

    def failed_spans() -> list[Any] | None:
        found = [span for _, span in receiver.received(f"process {fleet.topic}") if attributes(span).get("error.type")]
        return found if len(found) == 2 else None

    first, retried = sorted(
        poll_until(failed_spans, what="both failed calls' spans"), key=lambda s: s.start_time_unix_nano
    )
    for span in (first, retried):
        assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PRODUCER_SPAN_ID
        assert attributes(span)["error.type"] == "ValueError" and span.status.code == 2  # STATUS_CODE_ERROR
    assert [event.name for event in first.events] == ["exception"]
    assert sorted(event.name for event in retried.events) == ["exception", "retry"]
    # The dead letter's own trace context (after the message's, so it wins) is the last failed call's span.
    assert dict(letter.headers() or [])["traceparent"] == f"00-{TRACE_ID}-{retried.span_id.hex()}-01".encode()

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK


@pytest.mark.fleet(name="traced", partitions=2, env={"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "4"})
def test_a_batch_handler_call_is_one_span_linked_to_each_messages_trace(fleet: Fleet, receiver: OtlpReceiver) -> None:
    fleet.env |= {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    supervisor = fleet.start("batches")
    total = 12
    producer = Producer({"bootstrap.servers": fleet.brokers, "linger.ms": 5})
    for n in range(total):  # each message a trace of its own: message n's trace id is n + 1
        producer.produce(
            fleet.topic,
            value=str(n).encode(),
            partition=n % 2,
            headers=[("traceparent", f"00-{n + 1:032x}-{n + 1:016x}-01".encode())],
        )
    assert producer.flush(30) == 0
    poll_until(lambda: len(fleet.lines()) >= total, what="every message to be handled")

    name = f"process {fleet.topic}"

    def every_batch_span() -> list[Any] | None:
        spans = [span for _, span in receiver.received(name)]
        counted = sum(attributes(span)["messaging.batch.message_count"] for span in spans)
        return spans if counted >= total else None

    spans = poll_until(every_batch_span, timeout=30, what="a span for every batch call")
    assert sum(attributes(span)["messaging.batch.message_count"] for span in spans) == total  # each message once
    linked = []
    for span in spans:
        found = attributes(span)
        assert span.kind == 5 and found["messaging.operation.type"] == "process"  # SPAN_KIND_CONSUMER
        assert 1 <= found["messaging.batch.message_count"] <= 4  # MW_TEST_BATCH_SIZE
        assert "kafka.offset" not in found and found["marshal_workers.outcome"] == "ok"
        assert len(span.links) == found["messaging.batch.message_count"]
        assert span.parent_span_id == b""  # a batch has many parents: it links to each, and is a root
        linked += [hex_ids(link) for link in span.links]
    assert sorted(linked) == sorted((f"{n + 1:032x}", f"{n + 1:016x}") for n in range(total))

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK
