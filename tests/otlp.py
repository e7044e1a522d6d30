"""An OTLP/HTTP traces receiver for the tracing e2e tests (tests/e2e/test_tracing.py, test_serve_tracing.py): the
spans a process exports to it, decoded with the OpenTelemetry protobuf definitions.  The ``receiver`` fixture
(tests/e2e/conftest.py) runs one per test."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint (POST /v1/traces, protobuf): every span received, with its service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(self.path, request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces"
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((resource.get("service.name", ""), span))

    def received(self, name: str) -> list[tuple[str, Any]]:
        with self._lock:
            return [(service, span) for service, span in self.spans if span.name == name]


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = value.int_value if value.HasField("int_value") else value.string_value
    return out


def hex_ids(span_or_link: Any) -> tuple[str, str]:
    """(trace id, span id) of a span or a link, in hex."""
    return span_or_link.trace_id.hex(), span_or_link.span_id.hex()
