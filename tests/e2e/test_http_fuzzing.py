"""The HTTP service against its own OpenAPI document, live: a real ``marshal-workers serve`` on the embedded broker
serves the document of docs/openapi.json, and schemathesis fuzzes every route from it (valid and invalid requests,
with and without the token).  No answer is a 5xx; every answer is one the document lists, with its content type,
headers and schema; every 4xx has a JSON error; and the coordination log gets exactly the records of the accepted
requests: no rejected request writes one.

Bounded for the suite (MW_TEST_FUZZ_EXAMPLES examples per route and mode, default 15; long polls cut to 500 ms).
A longer run: ``MW_TEST_FUZZ_EXAMPLES=300 python -m pytest tests/e2e/test_http_fuzzing.py -p no:cacheprovider``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fleet import Fleet
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_http_service import log_records, start_server

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.http.http_messages import BadRequest, read_request
from marshal_workers.protocol import codec

pytestmark = [pytest.mark.broker, pytest.mark.fleet(name="openapi", partitions=2)]

DOCS_COPY = Path(__file__).parents[2] / "docs" / "openapi.json"
TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("MW_TEST_FUZZ_EXAMPLES", "15"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# An invalid request is any 4xx (schemathesis' default list lacks 409 and 413, which the document gives).
CONFIG = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": ["4XX"]}}})
KIND = {"/read": codec.DeliverMessages, "/ack": codec.AckMessages, "/cancel": codec.CancelMessages}


@dataclass
class Effects:
    """What the accepted requests did, by the record kind each writes: records and message entries."""

    records: collections.Counter[str] = field(default_factory=collections.Counter)
    entries: collections.Counter[str] = field(default_factory=collections.Counter)
    statuses: collections.Counter[tuple[str, str, int]] = field(default_factory=collections.Counter)
    reads: int = 0

    def add(self, path: str, answer: Any) -> None:
        count = len(answer["messages"]) if path == "/read" else answer["acked" if path == "/ack" else "cancelled"]
        if count:
            self.records[KIND[path].__name__] += 1
            self.entries[KIND[path].__name__] += count


def written(records: list[codec.Record]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    message_records = [r for r in records if isinstance(r, codec.MESSAGE_RECORD_TYPES)]
    return (
        collections.Counter(type(r).__name__ for r in message_records),
        collections.Counter({type(r).__name__: 0 for r in message_records})
        + collections.Counter(type(r).__name__ for r in message_records for _ in r.messages),
    )


def bounded(case: Case) -> None:
    """A read the server takes waits at most 500 ms, so the run stays short (the timeout's bounds are fuzzed by the
    reads it refuses, and held to the parser by tests/unit/http/test_http_openapi.py)."""
    if case.operation.path == "/read":
        try:
            asked = read_request({k: str(v) for k, v in (case.query or {}).items()})
        except BadRequest:
            return
        if asked.wait_s > 0.5:
            case.query = {**(case.query or {}), "timeout": "500ms"}


def send(case: Case, url: str, effects: Effects, token: str | None = TOKEN) -> Any:
    """Call the server with ``case``, hold the answer to the document, and tally what an accepted one did."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = case.call(base_url=url, headers=headers, timeout=30)
    case.validate_response(response, checks=CHECKS, headers=headers)
    path, status = case.operation.path, response.status_code
    mode = case.meta.generation.mode.value if case.meta is not None else "explicit"
    effects.statuses[(path, mode, status)] += 1
    if 400 <= status < 500:
        body = response.json()  # a 4xx is JSON with an error code and a message saying what to do
        assert isinstance(body["error"], str) and body["message"], (path, status, body)
    if status == 200 and path in KIND:
        effects.add(path, response.json())
    return response


def settle(schema: schemathesis.BaseSchema, url: str, effects: Effects, messages: list[dict[str, Any]]) -> None:
    """Through the API, ack the first message a fuzzed read handed out (every other read) and give the rest back: so
    messages stay available for the next reads, and valid acks and cancels of pending messages are in the run."""
    effects.reads += 1
    ids = [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in messages]
    acked = ids[:1] if effects.reads % 2 == 0 else []
    for path, some in (("/ack", acked), ("/cancel", ids[len(acked) :])):
        if some:
            response = send(schema[path]["POST"].Case(body=some, media_type="application/json"), url, effects)
            assert response.status_code == 200 and response.json()["already"] == 0, response.text
    if acked:  # a rejected request about a real message: a cancel of one acked
        response = send(schema["/cancel"]["POST"].Case(body=acked, media_type="application/json"), url, effects)
        assert response.status_code == 409 and response.json()["error"] == "not_pending", response.text


def fuzz(
    schema: schemathesis.BaseSchema,
    url: str,
    effects: Effects,
    path: str,
    method: str,
    mode: GenerationMode,
    token: str | None = TOKEN,
) -> None:
    operation = schema[path][method]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        bounded(case)
        response = send(case, url, effects, token)
        if token and path == "/read" and response.status_code == 200:
            settle(schema, url, effects, response.json()["messages"])

    run()


def test_a_live_server_answers_fuzzed_requests_as_its_document_says_and_rejected_ones_write_nothing(
    fleet: Fleet, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    server, url = start_server(
        fleet, "srv", "--token-file", str(tmp_path / "token"), "--pending-timeout", "60s", "--max-deliveries", "1000"
    )
    with urllib.request.urlopen(url + "/openapi.json", timeout=30) as response:  # no token needed
        served = json.loads(response.read())
        assert response.headers["Content-Type"].startswith("application/json")
    assert served == json.loads(DOCS_COPY.read_text()), "the server serves the docs' copy of its document"
    fleet.produce(range(40))
    schema = schemathesis.openapi.from_dict(served, config=CONFIG)
    before = len(log_records(fleet))

    effects = Effects()
    operations = [(path, method.upper()) for path, item in served["paths"].items() for method in item]
    for path, method in operations:
        fuzz(schema, url, effects, path, method, GenerationMode.POSITIVE)
    for path in ("/read", "/ack", "/cancel"):  # the routes that take input
        fuzz(schema, url, effects, path, "POST", GenerationMode.NEGATIVE)
    for path in ("/read", "/ack", "/metrics"):  # without the token: 401, JSON, nothing done
        fuzz(schema, url, effects, path, "POST" if path != "/metrics" else "GET", GenerationMode.POSITIVE, token=None)

    records, entries = written(log_records(fleet)[before:])
    assert (records, entries) == (effects.records, effects.entries), (
        "the log holds exactly what the accepted requests did; no rejected request wrote a record",
        effects.statuses,
    )
    # The run reached each kind of answer it is meant to check.
    seen = {(path, status) for path, _, status in effects.statuses}
    assert {
        ("/read", 200),
        ("/read", 400),
        ("/read", 401),
        ("/ack", 200),
        ("/ack", 400),
        ("/ack", 401),
        ("/cancel", 200),
        ("/cancel", 400),
        ("/cancel", 409),
        ("/healthz", 200),
        ("/openapi.json", 200),
    } <= seen, effects.statuses
    assert effects.records["AckMessages"] >= 1 and effects.records["CancelMessages"] >= 1
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK
