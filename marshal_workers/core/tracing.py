"""OpenTelemetry tracing, built in and optional (``pip install 'marshal-workers[otel]'``; docs/operations.md).

Nothing here imports opentelemetry until a worker asks whether tracing is on
(``start_in_worker``, after fork), and nothing runs per message unless it is:
a worker without tracing keeps its handler as it is.

Tracing is on in a worker when opentelemetry is installed and either the
standard environment asks for it (``OTEL_TRACES_EXPORTER`` = ``otlp`` or
``console``; ``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_TRACES_SAMPLER`` read by the SDK), or
the app set an SDK ``TracerProvider`` itself at import.  The exporter's
provider is made in the worker after fork, so no exporter thread is forked;
``flush`` sends what is buffered before a worker exits.  ``marshal-workers serve``
sets up the same way (``start_in_server``; its spans: http/http_spans.py).

Spans follow the OpenTelemetry messaging semantic conventions for Kafka as of
semconv 1.45 (``messaging.system`` ``kafka``, ``messaging.operation.type``
``process``, ``messaging.destination.name``, ``messaging.destination.partition.id``,
``kafka.offset``, ``messaging.consumer.group.name``, ``kafka.message.key``,
``messaging.client.id``).  A record's headers are untrusted: a traceparent that
does not parse is ignored (the span starts a trace of its own).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from marshal_workers.errors import ConfigError

_log = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "marshal_workers"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.45.0"
EXPORTERS = ("otlp", "console")
MAX_KEY_CHARS = 256  # a key longer than this is left off the span (keys are untrusted and can be large)

Handler = Callable[[Any], Any]
Headers = list[tuple[str, bytes]]
SendHeaders = list[tuple[str, str | bytes | None]]  # as the producer takes them (kafka/outbox.py)


class _State:
    """The worker's tracer once tracing is on (None: off), and the provider it made, if any, to flush."""

    tracer: Any = None
    provider: Any = None


def active() -> bool:
    """Tracing is on in this process (``start_in_worker`` found an exporter or the app's provider)."""
    return _State.tracer is not None


def current_tracer() -> Any:
    """This process's tracer while tracing is on, else None (the HTTP service's spans, http/http_spans.py)."""
    return _State.tracer


def start_in_worker(environ: dict[str, str] | None = None) -> bool:
    """Turn tracing on in this worker if opentelemetry is installed and configured; True if it is on.

    Called after fork and after the app is loaded (so a provider the app set counts)."""
    environ = dict(os.environ) if environ is None else environ
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if _sdk_provider_set(trace.get_tracer_provider()):
        pass  # the app's own provider, exporter and sampler
    elif exporter_name and exporter_name != "none":
        _State.provider = _provider_from_environment(exporter_name, environ)
        trace.set_tracer_provider(_State.provider)
    else:
        return False
    _State.tracer = trace.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)
    return True


def start_in_server(environ: dict[str, str] | None = None) -> bool:
    """Turn tracing on in ``marshal-workers serve`` the same way (the OTEL_* environment, or a TracerProvider set
    before, e.g. by ``sitecustomize``); True if it is on.  ``flush`` before the server exits.

    With no exporter asked for and opentelemetry never imported (so no provider can have been set), nothing is
    imported at all."""
    environ = dict(os.environ) if environ is None else environ
    if (
        environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() in ("", "none")
        and "opentelemetry.trace" not in sys.modules
    ):
        return False
    return start_in_worker(environ)


def use_provider(provider: Any) -> None:
    """Trace with ``provider`` (an SDK TracerProvider) in this process, without making it the global one (tests,
    or an app that keeps its provider to itself)."""
    _State.tracer = provider.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)


def stop() -> None:
    """Tracing off again in this process (tests; a worker simply exits)."""
    _State.tracer = None
    _State.provider = None


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans still buffered (before a worker exits); a failing exporter is logged, never raised."""
    provider = _State.provider
    if provider is None:
        try:
            from opentelemetry import trace
        except ImportError:
            return
        provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return
    try:
        force_flush(timeout_ms)
    except Exception:  # noqa: BLE001 - an exporter's failure must not change how the worker exits
        _log.exception("tracing: the spans could not be flushed")


def _sdk_provider_set(provider: Any) -> bool:
    """A real provider (the SDK's or another), not the API's proxy/no-op default."""
    from opentelemetry import trace

    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _provider_from_environment(exporter_name: str, environ: dict[str, str]) -> Any:
    if exporter_name not in EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not supported by marshal-workers: use one of "
            f"{', '.join(EXPORTERS)} (or 'none'), or set up a TracerProvider in your app"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise ImportError(
            "OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed: "
            "pip install 'marshal-workers[otel]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create())  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES; sampler too
    exporter = ConsoleSpanExporter() if exporter_name == "console" else _otlp_exporter(environ)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _otlp_exporter(environ: dict[str, str]) -> Any:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ImportError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs pip install opentelemetry-exporter-otlp-proto-grpc "
                "(marshal-workers[otel] brings http/protobuf)"
            ) from exc
        return OTLPSpanExporter()
    if protocol != "http/protobuf":
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use http/protobuf or grpc")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    except ImportError as exc:
        raise ImportError("OTEL_TRACES_EXPORTER=otlp needs pip install 'marshal-workers[otel]'") from exc
    return HttpExporter()  # OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces), headers, timeout: read by the exporter


# ------------------------------------------------------------------ propagation over Kafka headers


class _HeaderGetter:
    """Reads W3C trace context from a record's headers: (name, bytes) pairs, untrusted."""

    def get(self, carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [_text(value) for name, value in carrier if isinstance(name, str) and name.lower() == key]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [name for name, _ in carrier if isinstance(name, str)]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")  # never fails; a malformed value is rejected by the propagator's parser
    return value if isinstance(value, str) else ""


_GETTER = _HeaderGetter()


def context_from_headers(headers: Sequence[tuple[str, Any]]) -> Any:
    """The trace context carried by ``headers`` (a bad or missing traceparent: an empty context)."""
    from opentelemetry import propagate

    # Ignored: OpenTelemetry's Getter is an abstract class, imported only once tracing is on; ours has its methods.
    return propagate.extract(headers, getter=_GETTER)  # type: ignore[arg-type]


def with_trace_context(headers: SendHeaders | None) -> SendHeaders | None:
    """``headers`` plus the current trace context (``traceparent``/``tracestate``), unless tracing is off or
    the sender gave a traceparent of its own."""
    if _State.tracer is None:
        return headers
    if headers and any(name.lower() == "traceparent" for name, _ in headers):
        return headers
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    return list(headers or []) + [(name, value.encode()) for name, value in carrier.items()]


# ------------------------------------------------------------------ a span around app.send


@contextlib.contextmanager
def sending(topic: str, key: bytes | None) -> Iterator[None]:
    """A PRODUCER span ``send <topic>`` for one app.send, current while it lasts (so ``with_trace_context`` puts
    it in the message's headers): a child of the span current before (a handler call's), the parent of the
    consumers' spans of what is sent.  It ends when the producer has the message, not when Kafka confirms it (the
    worker waits for that before its progress, once for many sends).  Nothing when tracing is off."""
    tracer = _State.tracer
    if tracer is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
    }
    text = _key_text(key)
    if text is not None:
        attributes["kafka.message.key"] = text
    with tracer.start_as_current_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes):
        yield


# ------------------------------------------------------------------ spans around handler calls


def traced(function: Handler, topic: str, batch: bool, group: str, client_id: str) -> Handler:
    """``function`` with one CONSUMER span per call (itself when tracing is off): parented on the message's
    traceparent (a batch: links to each message's), its outcome and error type, a retry as an event."""
    tracer = _State.tracer
    if tracer is None:
        return function
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    name = f"process {topic}"
    base = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": group,
        "messaging.client.id": client_id,
    }

    def span_arguments(argument: Any) -> dict[str, Any]:
        if batch:
            contexts = [trace.get_current_span(context_from_headers(m.headers)).get_span_context() for m in argument]
            links = [Link(c) for c in contexts if c.is_valid]
            attributes = {**base, "messaging.batch.message_count": len(argument)}
            if argument:
                attributes["messaging.destination.partition.id"] = str(argument[0].partition)
            return {"kind": SpanKind.CONSUMER, "attributes": attributes, "links": links}
        attributes = {
            **base,
            "messaging.destination.partition.id": str(argument.partition),
            "kafka.offset": argument.offset,
        }
        key = _key_text(argument.key)
        if key is not None:
            attributes["kafka.message.key"] = key
        headers = argument.headers
        # No headers, no trace context: skip the propagators (a few microseconds a message); the span is a root.
        context = context_from_headers(headers) if headers else None
        return {"kind": SpanKind.CONSUMER, "attributes": attributes, "context": context}

    def attempt_of(argument: Any) -> int:
        first = argument[0] if batch and argument else argument
        return getattr(first, "attempt", 1) if first is not None else 1

    def opened(argument: Any) -> Any:
        return tracer.start_as_current_span(
            name, record_exception=False, set_status_on_exception=False, **span_arguments(argument)
        )

    def on_start(span: Any, argument: Any) -> None:
        attempt = attempt_of(argument)
        if attempt > 1:
            span.add_event("retry", {"marshal_workers.attempt": attempt})

    def on_error(span: Any, error: BaseException) -> None:
        _remember_span(error, span.get_span_context())
        span.record_exception(error)
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_attribute("marshal_workers.outcome", "error")
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__qualname__}: {error}"[:200]))

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def call_async(argument: Any) -> Any:
            with opened(argument) as span:  # inside the handler's own task: the span is current there
                on_start(span, argument)
                try:
                    result = await function(argument)
                except BaseException as error:
                    on_error(span, error)
                    raise
                span.set_attribute("marshal_workers.outcome", "ok")
                return result

        return call_async

    @functools.wraps(function)  # the handler's name, in logs and dead letters, stays the user's
    def call(argument: Any) -> Any:
        with opened(argument) as span:
            on_start(span, argument)
            try:
                result = function(argument)
            except BaseException as error:
                on_error(span, error)
                raise
            span.set_attribute("marshal_workers.outcome", "ok")
            return result

    return call


_SPAN_ATTRIBUTE = "_marshal_workers_span_context"  # set on a handler's exception: the span of the call it failed


def _remember_span(error: BaseException, span_context: Any) -> None:
    try:
        setattr(error, _SPAN_ATTRIBUTE, span_context)
    except (AttributeError, TypeError):
        pass  # an exception class without __dict__: its dead letter keeps only the message's own trace context


def failed_call_trace_headers(error: BaseException) -> Headers:
    """The trace context of the handler call ``error`` ended (``traceparent``/``tracestate``), for its dead letter:
    [] when tracing is off or the error was not raised in a traced call (WorkerLost, a message too old)."""
    span_context = getattr(error, _SPAN_ATTRIBUTE, None)
    if _State.tracer is None or span_context is None or not span_context.is_valid:
        return []
    from opentelemetry import propagate, trace

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    return [(name, value.encode()) for name, value in carrier.items()]


def _key_text(key: bytes | None) -> str | None:
    """A message key as span text: only a UTF-8 key of reasonable length (binary keys are left off)."""
    if key is None or len(key) > MAX_KEY_CHARS:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def trace_ids(headers: Iterable[tuple[str, Any]]) -> str | None:
    """The trace id (32 hex digits) of a valid traceparent in ``headers``, or None (for logs and tests)."""
    for name, value in headers:
        if isinstance(name, str) and name.lower() == "traceparent":
            parts = _text(value).split("-")
            if len(parts) == 4 and len(parts[1]) == 32:
                return parts[1]
    return None
