"""The service's OpenAPI document (http_openapi.py) against the code it describes: valid OpenAPI 3.1, every route
documented and nothing else, the docs' copy current, and the parsers' and encoders' real inputs and outputs inside
its schemas.  Pure: no broker (tests/e2e/test_http_fuzzing.py fuzzes a live server from it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from property_runs import examples

from marshal_workers.http.http_messages import MAX_ITEMS, MAX_READ, BadRequest, message_ids, message_json, read_request
from marshal_workers.http.http_openapi import openapi_document
from marshal_workers.http.http_service import service_routes

DOCS_COPY = Path(__file__).parents[3] / "docs" / "openapi.json"


@pytest.mark.parametrize("token_required", [True, False])
def test_the_document_is_valid_openapi_3_1(token_required: bool) -> None:
    document = openapi_document(token_required)
    validate(document)  # raises with the first problem
    assert document["openapi"].startswith("3.1")


def test_every_route_the_app_registers_is_documented_and_every_documented_one_is_registered() -> None:
    app = web.Application()
    app.add_routes(service_routes())
    registered = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()  # type: ignore[union-attr]
        if route.method != "HEAD"
    }  # aiohttp adds HEAD to every GET
    documented = {(method, path) for path, item in openapi_document(True)["paths"].items() for method in item}
    assert registered == documented
    assert ("get", "/openapi.json") in documented


def test_with_a_token_every_route_but_healthz_and_the_document_needs_it_and_may_answer_401() -> None:
    document = openapi_document(True)
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The server's token (--token-file).",
    }
    assert document["security"] == [{"bearerAuth": []}]
    for path, item in document["paths"].items():
        for operation in item.values():
            is_open = path in ("/healthz", "/openapi.json")
            assert (operation.get("security") == []) == is_open, path
            assert ("401" in operation["responses"]) != is_open, path
    without = openapi_document(False)
    assert "security" not in without and "securitySchemes" not in without["components"]
    assert all("401" not in op["responses"] for item in without["paths"].values() for op in item.values())


def test_the_docs_copy_is_the_document_of_a_server_with_a_token() -> None:
    assert json.loads(DOCS_COPY.read_text()) == openapi_document(True), (
        "docs/openapi.json is stale: python -m marshal_workers.http.http_openapi > docs/openapi.json"
    )


def test_the_read_parameters_state_the_bounds_the_parser_enforces() -> None:
    [timeout, most] = openapi_document(True)["paths"]["/read"]["post"]["parameters"]
    assert (most["schema"]["minimum"], most["schema"]["maximum"]) == (1, MAX_READ)
    for good in ("0", "5s", "250ms", "1m", "60s", "0.5s"):
        assert Draft202012Validator(timeout["schema"]).is_valid(good)
        read_request({"timeout": good})
    for bad in ("soon", " 5s", "\u0663s", "-1s", "5 s"):
        assert not Draft202012Validator(timeout["schema"]).is_valid(bad)
        with pytest.raises(BadRequest):
            read_request({"timeout": bad})
    with pytest.raises(BadRequest):  # ECMA's $ refuses it too; Python's jsonschema lets "$" match before a newline
        read_request({"timeout": "5s\n"})


def schema_of(name: str) -> Draft202012Validator:
    """A validator of the named component, with the document's references resolved."""
    document = openapi_document(True)
    return Draft202012Validator({**document["components"]["schemas"][name], "components": document["components"]})


# Ack and cancel items, right and wrong: JSON integers only (JSON Schema calls 1.0 an integer; the parser wants 1).
FIELD = st.one_of(
    st.integers(-5, 2**63 + 5), st.integers(2**63 - 3, 2**63 + 3), st.text(max_size=3), st.none(), st.booleans()
)
ITEM = st.one_of(
    st.fixed_dictionaries(
        {"topic": st.one_of(st.text(max_size=3), st.integers(0, 1)), "partition": FIELD, "offset": FIELD},
        optional={"key": st.text(max_size=2)},
    ),
    st.dictionaries(st.sampled_from(["topic", "partition", "offset"]), FIELD, max_size=3),
    FIELD,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(ITEM, st.lists(ITEM, max_size=4)))
def test_an_ack_body_is_accepted_exactly_when_it_fits_the_document(body: Any) -> None:
    fits = schema_of("SettleBody").is_valid(body)
    try:
        message_ids(orjson.dumps(body))
    except BadRequest as refused:
        assert not fits, (body, str(refused))
        assert refused.status == 400
    else:
        assert fits, body


def test_the_limit_of_messages_per_ack_is_the_documented_one() -> None:
    too_many = [{"topic": "t", "partition": 0, "offset": n} for n in range(MAX_ITEMS + 1)]
    assert not schema_of("SettleBody").is_valid(too_many) and schema_of("SettleBody").is_valid(too_many[:-1])
    with pytest.raises(BadRequest) as refused:
        message_ids(orjson.dumps(too_many))
    assert refused.value.status == 413


HEADERS = st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=6)), max_size=3)


@settings(max_examples=examples(200), deadline=None)
@given(
    key=st.none() | st.binary(max_size=8),
    value=st.none() | st.binary(max_size=8),
    headers=HEADERS,
    timestamp=st.none() | st.integers(0, 2**45),
    deliveries=st.integers(1, 100),
)
def test_every_message_the_service_hands_out_fits_the_document(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
    timestamp: int | None,
    deliveries: int,
) -> None:
    message = message_json("t", 1, 42, key, value, headers, timestamp, 1_764_000_000_000, deliveries)
    answer = orjson.loads(orjson.dumps({"messages": [message]}))
    errors = [error.message for error in schema_of("ReadAnswer").iter_errors(answer)]
    assert errors == []


@pytest.mark.parametrize(
    "refused",
    [
        BadRequest(400, "bad_body", "send a list"),
        BadRequest(
            409,
            "not_pending",
            "1 cannot be acked",
            messages=[{"topic": "t", "partition": 0, "offset": 1, "state": "expired", "why": "its deadline passed"}],
        ),
        BadRequest(503, "stopping", "read from another server", retry_after=1),
    ],
)
def test_every_error_body_fits_the_document(refused: BadRequest) -> None:
    assert list(schema_of("Error").iter_errors(orjson.loads(refused.body()))) == []
