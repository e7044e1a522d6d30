"""The application that tests/benchmarks/bench_run.py runs under ``marshal-workers run``.

Configured by environment variables, read at import (in the supervisor, and
in the fork server that preloads this module before forking the workers):

MW_BENCH_TOPIC        the topic to handle
MW_BENCH_KIND         "throughput" (default) or "handover"
MW_BENCH_MODE         "alo" (default) or "amo"
MW_BENCH_BATCH_SIZE   messages per fetch / AMO claim (default 500)
MW_BENCH_OUT          directory the handler writes its stamps to
MW_BENCH_LAST_OFFSET  throughput: the last offset of each partition (N/partitions - 1)
MW_BENCH_HOOKS        "before": register one empty before_message hook; "both": and an empty after_message hook
MW_BENCH_TYPED        "1": the throughput handler is typed, ``msg: Message[Order]`` (a msgspec Struct the worker
                      decodes), reading ``msg.body.amount`` instead of ``msg.json()["amount"]``
MW_BENCH_TRACING      "1": built-in tracing on, through an SDK TracerProvider this module sets up at import (as an
                      app may, docs/operations.md "Tracing") with a BatchSpanProcessor over an exporter that drops
                      every span: the cost of making, ending and queueing spans, with no formatting or sending

Every handler parses the value with ``msg.json()`` (orjson) and writes nothing
else except:

* throughput: ``first-<partition>`` when it handles offset 0 and
  ``last-<partition>`` when it handles the last offset, each holding the wall
  time (``time.time()``) and the process's CPU seconds (``time.process_time()``),
  written to a temporary name and renamed so a poller never reads half a file;
* handover: one line ``<pid> <offset> <walltime>`` appended to ``starts`` when
  a worker process handles its first message.

The raw-consumer baselines in bench_run.py import this module and call
``handle_throughput`` too, so every measurement runs the same handler.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from marshal_workers import App, Message

TOPIC = os.environ.get("MW_BENCH_TOPIC", "bench")
KIND = os.environ.get("MW_BENCH_KIND", "throughput")
MODE = os.environ.get("MW_BENCH_MODE", "alo")
BATCH_SIZE = int(os.environ.get("MW_BENCH_BATCH_SIZE", "500"))
OUT = os.environ.get("MW_BENCH_OUT", "")
LAST = int(os.environ.get("MW_BENCH_LAST_OFFSET", "-1"))

TRACING = os.environ.get("MW_BENCH_TRACING") == "1"

app = App()
_started = False  # handover: has this worker process handled a message yet? (False in every fresh fork)


def _stamp(name: str, at: float) -> None:
    """``<wall time> <CPU seconds of this process>`` (every thread: librdkafka's too)."""
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        f.write(f"{at!r} {time.process_time()!r}")
    os.replace(path + ".tmp", path)


def handle_throughput(msg: Message) -> None:
    msg.json()["amount"]
    offset = msg.offset
    if offset == 0:
        _stamp(f"first-{msg.partition}", time.time())
        if TRACING:  # proof for bench_run.py that the call ran inside a recording span
            from opentelemetry import trace

            with open(os.path.join(OUT, f"traced-{msg.partition}"), "w") as f:
                f.write("1" if trace.get_current_span().is_recording() else "0")
    elif offset == LAST:
        _stamp(f"last-{msg.partition}", time.time())


def raw_loop(settings: Any, topic: str, count: int) -> None:
    """The raw consumer loop the loop benchmarks (bench_loop.py, bench_amo_model.py) measure a worker against:
    ``consume(500, 0.5)`` on a Consumer with the worker's own settings, the error check, ``handle_throughput`` on a
    Message of each record, until ``count`` messages of partition 0 (from offset 0) are handled."""
    from confluent_kafka import Consumer, TopicPartition

    from marshal_workers.kafka import client_profiles

    handle = handle_throughput
    consumer = Consumer(client_profiles.worker_consumer(settings))
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    while seen < count:
        for record in consumer.consume(num_messages=min(500, count - seen), timeout=0.5):
            if record.error() is None:
                handle(Message(record))
                seen += 1
    consumer.close()


class Order(msgspec.Struct):
    """bench_run.py's values: ``{"id": n, "amount": 1.5, "pad": "xx..."}``."""

    id: int
    amount: float
    pad: str = ""


def handle_typed(msg: Message[Order]) -> None:
    msg.body.amount  # noqa: B018 - the read is the work measured
    offset = msg.offset
    if offset == 0:
        _stamp(f"first-{msg.partition}", time.time())
    elif offset == LAST:
        _stamp(f"last-{msg.partition}", time.time())


def handle_handover(msg: Message) -> None:
    global _started
    msg.json()
    if not _started:
        _started = True
        line = f"{os.getpid()} {msg.offset} {time.time():.6f}\n"
        fd = os.open(os.path.join(OUT, "starts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: lines from two workers never interleave
        finally:
            os.close(fd)


HOOKS = os.environ.get("MW_BENCH_HOOKS", "")
if HOOKS in ("before", "both"):

    @app.before_message
    def before(msg: Message) -> None:
        pass


if HOOKS == "both":

    @app.after_message
    def after(msg: Message, outcome: str, error: BaseException | None, seconds: float) -> None:
        pass


TYPED = os.environ.get("MW_BENCH_TYPED", "") == "1"
HANDLER = handle_handover if KIND == "handover" else handle_typed if TYPED else handle_throughput
app.handler(TOPIC, mode=MODE, batch_size=BATCH_SIZE)(HANDLER)


if TRACING:
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DropSpans(SpanExporter):
        """An exporter that discards what it is given: the batch processor's queueing is measured, no I/O."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    # Set at import: the fork server preloads this module, and the SDK's batch processor starts its thread anew in
    # each forked worker.
    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(DropSpans()))
    trace.set_tracer_provider(_provider)
