"""The app's AsyncAPI document (handlers/asyncapi.py, docs/asyncapi.md): valid AsyncAPI 3.0, every reference
resolved, and payload schemas that accept what the handlers decode and refuse what they would dead-letter."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import orjson
import pydantic
import pytest
from processes import run_cli

from marshal_workers import App, Message
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.asyncapi import DEAD_LETTER_HEADERS, asyncapi_document

# The official AsyncAPI 3.0.0 JSON Schema, from the @asyncapi/specs package of the npm registry (Apache-2.0), pinned
# by version and by the registry's integrity hash, downloaded once into a cache.
SPECS_TARBALL = "https://registry.npmjs.org/@asyncapi/specs/-/specs-6.11.1.tgz"
SPECS_SHA512 = "A3WBLqAKGoJ2+6FWFtpjBlCQ1oFCcs4GxF7zsIGvNqp/klGUHjlA3aAcZ9XMMpLGE8zPeYDz2x9FmO6DSuKraQ=="
SCHEMA_MEMBER = "package/schemas/3.0.0-without-$id.json"  # the self-contained one: every $ref inside it


@pytest.fixture(scope="session")
def asyncapi_schema() -> jsonschema.Validator:
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "marshal-workers-tests" / "specs-6.11.1.tgz"
    )
    if not cache.exists():
        with urllib.request.urlopen(SPECS_TARBALL, timeout=60) as response:
            data = response.read()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(data)
    data = cache.read_bytes()
    assert base64.b64encode(hashlib.sha512(data).digest()).decode() == SPECS_SHA512, f"{cache}: not the pinned package"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile(SCHEMA_MEMBER)
        assert member is not None
        schema = orjson.loads(member.read())
    return jsonschema.Draft7Validator(schema)


def check_valid(validator: jsonschema.Validator, document: dict[str, Any]) -> None:
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(document)]
    assert problems == [], "not valid AsyncAPI 3.0.0"


class Line(pydantic.BaseModel):
    sku: str
    quantity: int


class Order(pydantic.BaseModel):
    order_id: str
    amount: float
    lines: list[Line] = []


class Invoice(msgspec.Struct):
    order_id: str
    total: float


@dataclasses.dataclass
class Audit:
    who: str
    what: str


def billing_app() -> App:
    app = App(group="billing")

    @app.handler("orders")
    def on_order(order: Order) -> None:
        """Bill an order: one invoice per order."""

    @app.handler("invoices", batch=True, mode="amo", serializer="msgpack")
    def on_invoices(invoices: list[Invoice]) -> None: ...

    @app.handler("raw", on_error="release")
    def on_raw(msg: Message) -> None: ...

    app.sends("audit", Audit, description="who did what")
    app.sends("invoices", Invoice)
    return app


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in refs(value)]
    return []


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_the_document_is_valid_asyncapi_and_every_reference_resolves(asyncapi_schema: jsonschema.Validator) -> None:
    document = asyncapi_document(billing_app(), brokers="k1:9092,k2:9092")
    check_valid(asyncapi_schema, document)
    broken = orjson.loads(orjson.dumps(document))
    broken["operations"]["receive_orders"]["action"] = "consume"
    assert list(asyncapi_schema.iter_errors(broken)), "the schema catches a wrong document"
    for ref in refs(document):
        assert resolve(document, ref) is not None, ref
    assert document["info"]["title"] == "billing"
    assert [s["host"] for s in document["servers"].values()] == ["k1:9092", "k2:9092"]
    assert sorted(document["channels"]) == ["audit", "invoices", "invoices.dlq", "orders", "orders.dlq", "raw"]
    assert "raw.dlq" not in document["channels"], "a handler that releases on error writes no dead letters"
    operations = document["operations"]
    assert {name: op["action"] for name, op in operations.items()} == {
        "receive_invoices": "receive",
        "dead_letter_invoices": "send",
        "receive_orders": "receive",
        "dead_letter_orders": "send",
        "receive_raw": "receive",
        "send_audit": "send",
        "send_invoices": "send",
    }
    orders = operations["receive_orders"]
    assert orders["description"] == "Bill an order: one invoice per order."
    assert orders["bindings"]["kafka"]["groupId"]["enum"] == ["billing"]
    assert "at most once, in batches" in operations["receive_invoices"]["summary"]
    messages = document["components"]["messages"]
    assert messages["Invoice"]["contentType"] == "application/msgpack", "as its handler's serializer decodes"
    assert set(messages["OrderDeadLetter"]["headers"]["properties"]) == set(DEAD_LETTER_HEADERS)


def payload_validator(document: dict[str, Any], message: str) -> jsonschema.Validator:
    schema = {**document["components"]["messages"][message]["payload"], "components": document["components"]}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(
    ("message", "good", "bad"),
    [
        (
            "Order",
            Order(order_id="o-1", amount=9.5, lines=[Line(sku="a", quantity=2)]).model_dump(),
            {"order_id": "o-1", "lines": [{"sku": "a", "quantity": "two"}]},
        ),
        ("Invoice", msgspec.to_builtins(Invoice("o-1", 9.5)), {"order_id": 7, "total": 9.5}),
        ("Audit", dataclasses.asdict(Audit("ops", "redrive")), {"who": "ops"}),
    ],
)
def test_a_payload_schema_accepts_what_the_handler_decodes_and_refuses_what_it_would_dead_letter(
    message: str, good: dict[str, Any], bad: dict[str, Any]
) -> None:
    document = asyncapi_document(billing_app())
    validator = payload_validator(document, message)
    assert list(validator.iter_errors(good)) == []
    assert list(validator.iter_errors(bad)), "the schema refuses a payload the model refuses"
    dead_letter = payload_validator(document, "OrderDeadLetter")
    assert list(dead_letter.iter_errors("not even an object")) == [], "a dead letter may be what did not decode"


def test_two_models_of_one_name_are_refused_with_what_to_do() -> None:
    app = App(group="g")
    first = type("Order", (msgspec.Struct,), {"__annotations__": {"a": int}})
    second = type("Order", (msgspec.Struct,), {"__annotations__": {"b": str}, "__module__": "elsewhere"})
    app.sends("one", first)
    app.sends("two", second)
    with pytest.raises(ConfigError, match="two models are called Order .* rename one"):
        asyncapi_document(app)


def test_sends_refuses_what_it_cannot_describe() -> None:
    app = App()
    with pytest.raises(ConfigError, match="needs a topic name"):
        app.sends("", Audit)
    with pytest.raises(ConfigError, match="model must be a class"):
        app.sends("audit", Audit("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="has no JSON schema"):
        app.sends("odd", object)
        asyncapi_document(app)


def test_the_command_prints_the_document(tmp_path: Path, asyncapi_schema: jsonschema.Validator) -> None:
    (tmp_path / "doc_app.py").write_text(
        "import msgspec\nfrom marshal_workers import App\napp = App(group='g')\n"
        "class Ping(msgspec.Struct):\n    n: int\n"
        "@app.handler('pings')\ndef on_ping(ping: Ping) -> None: ...\n"
    )
    printed = run_cli("asyncapi", "doc_app:app", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    document = orjson.loads(printed.stdout)
    check_valid(asyncapi_schema, document)
    assert document["components"]["schemas"]["Ping"]["properties"] == {"n": {"type": "integer"}}
