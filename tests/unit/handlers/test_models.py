"""Typed handlers (handlers/models.py, handlers/serializers.py): what each annotation gives the handler, what is
refused at registration and why, and a payload that does not fit dead-lettered at once (the testing harness runs
it as a worker does)."""

import dataclasses
from typing import Any

import msgspec
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers import App, Message, PayloadError, Reject
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.signals import rejected_of
from marshal_workers.testing import make_message, run_handler


class OrderStruct(msgspec.Struct):
    id: int
    item: str
    quantity: int = 1


@dataclasses.dataclass
class OrderData:
    id: int
    item: str
    quantity: int = 1


class OrderModel(pydantic.BaseModel):
    id: int
    item: str
    quantity: int = 1


MODELS = [OrderStruct, OrderData, OrderModel]
GOOD = {"id": 7, "item": "tea", "quantity": 2}


def _app_with(function: Any, **options: Any) -> App:
    app = App(group="typed")
    app.handler("orders", **options)(function)
    return app


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_model_annotation_gives_the_handler_the_decoded_value(model: type) -> None:
    got: list[Any] = []

    def on_order(order: model) -> None:  # type: ignore[valid-type]
        got.append(order)

    [result] = run_handler(_app_with(on_order), "orders", [GOOD])
    assert result.outcome == "done"
    assert got == [model(id=7, item="tea", quantity=2)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_message_of_a_model_gives_the_message_with_its_body(model: type) -> None:
    got: list[Any] = []

    def on_order(msg: Message[model]) -> None:  # type: ignore[valid-type]
        got.append((msg.offset, msg.attempt, msg.body))

    run_handler(_app_with(on_order), "orders", [make_message(GOOD, offset=41)])
    assert got == [(41, 1, model(id=7, item="tea", quantity=2))]


def test_an_async_handler_of_a_model() -> None:
    got: list[OrderStruct] = []

    async def on_order(order: OrderStruct) -> None:
        got.append(order)

    app = _app_with(on_order)
    assert app.handlers["orders"].is_async
    [result] = run_handler(app, "orders", [GOOD])
    assert result.outcome == "done" and got == [OrderStruct(7, "tea", 2)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_batch_keeps_its_good_messages_and_dead_letters_the_bad_ones(model: type) -> None:
    calls: list[list[Any]] = []

    def on_orders(orders: list[model]) -> None:  # type: ignore[valid-type]
        calls.append(orders)

    values = [GOOD, {"id": "x", "item": "tea"}, {"id": 8, "item": "milk"}, b"not json", {"item": "no id"}]
    results = run_handler(_app_with(on_orders, batch=True, retries=5), "orders", values)
    assert calls == [[model(id=7, item="tea", quantity=2), model(id=8, item="milk")]]  # one call, no retry
    assert [r.outcome for r in results] == ["done", "dead_letter", "done", "dead_letter", "dead_letter"]
    for bad in (results[1], results[3], results[4]):
        headers = dict(bad.dead_letter_headers or [])
        assert headers["error_type"] == b"PayloadError"
        assert bad.attempts == 1
    assert b"id" in dict(results[1].dead_letter_headers or [])["error"]  # the field's path
    assert b"id" in dict(results[4].dead_letter_headers or [])["error"]


def test_a_batch_of_messages_of_a_model() -> None:
    got: list[tuple[int, OrderStruct]] = []

    def on_orders(msgs: list[Message[OrderStruct]]) -> None:
        got.extend((m.offset, m.body) for m in msgs)

    run_handler(_app_with(on_orders, batch=True), "orders", [GOOD, GOOD])
    assert got == [(0, OrderStruct(7, "tea", 2)), (1, OrderStruct(7, "tea", 2))]


def test_a_batch_with_no_good_message_is_not_called() -> None:
    calls: list[Any] = []

    def on_orders(orders: list[OrderStruct]) -> None:
        calls.append(orders)

    results = run_handler(_app_with(on_orders, batch=True), "orders", [b"{", b"[]"])
    assert calls == [] and [r.outcome for r in results] == ["dead_letter", "dead_letter"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"id": "seven", "item": "tea"}, ["Expected `int`, got `str`", "$.id"]),
        ({"item": "tea"}, ["missing required field `id`"]),
        (b"not json at all", ["JSON is malformed"]),
        (None, ["no value"]),
    ],
    ids=["wrong type", "missing field", "not JSON", "tombstone"],
)
def test_a_payload_that_does_not_fit_is_dead_lettered_at_once_with_the_reason(value: Any, words: list[str]) -> None:
    calls: list[Any] = []

    def on_order(order: OrderStruct) -> None:
        calls.append(order)

    seen: list[str] = []
    app = _app_with(on_order, retries=5, on_error="release")  # neither retried nor released: like Reject
    app.after_message(lambda msg, outcome, error, seconds: seen.append(outcome))
    [result] = run_handler(app, "orders", [make_message(value)])
    assert calls == [] and result.outcome == "dead_letter" and result.attempts == 1 and result.delays == []
    assert isinstance(result.error, PayloadError) and isinstance(result.error, Reject)
    headers = dict(result.dead_letter_headers or [])
    assert headers["error_type"] == b"PayloadError"
    assert all(word.encode() in headers["error"] for word in words), headers["error"]
    assert b"OrderStruct" in headers["error"]
    assert seen == ["rejected"]


def test_pydantic_errors_name_the_field_and_the_reason() -> None:
    def on_order(order: OrderModel) -> None:
        pass

    [result] = run_handler(_app_with(on_order), "orders", [{"id": "seven", "item": "tea"}])
    assert "id: Input should be a valid integer" in str(result.error)


def test_a_handlers_own_error_is_retried_as_before() -> None:
    tries: list[int] = []

    def on_order(msg: Message[OrderStruct]) -> None:
        tries.append(msg.attempt)
        raise ConnectionError("down")

    [result] = run_handler(_app_with(on_order, retries=2), "orders", [GOOD])
    assert tries == [1, 2, 3] and dict(result.dead_letter_headers or [])["error_type"] == b"ConnectionError"


@pytest.mark.parametrize("model", [OrderStruct, OrderData, OrderModel], ids=lambda m: m.__name__)
def test_msgpack_decodes_each_model_kind(model: type) -> None:
    got: list[Any] = []

    def on_order(order: model) -> None:  # type: ignore[valid-type]
        got.append(order)

    results = run_handler(
        _app_with(on_order, serializer="msgpack"), "orders", [msgspec.msgpack.encode(GOOD), msgspec.json.encode(GOOD)]
    )
    assert got == [model(id=7, item="tea", quantity=2)]
    assert [r.outcome for r in results] == ["done", "dead_letter"]


def test_a_user_serializer_decodes_and_its_errors_are_payload_errors() -> None:
    class Csv:
        def decode(self, data: bytes, type: type) -> Any:
            id_, item = data.decode().split(",")
            return type(id=int(id_), item=item)

        def encode(self, value: Any) -> bytes:
            return f"{value.id},{value.item}".encode()

    got: list[OrderData] = []

    def on_order(order: OrderData) -> None:
        got.append(order)

    results = run_handler(_app_with(on_order, serializer=Csv()), "orders", [b"7,tea", b"seven,tea"])
    assert got == [OrderData(7, "tea")]
    assert results[1].outcome == "dead_letter" and "invalid literal for int()" in str(results[1].error)


def test_untyped_handlers_are_called_with_the_function_itself() -> None:
    """An annotation naming no model (none, Message, list[Message], Any, str...): no decoding, the very function
    registered (no cost), as before typed handlers."""

    def plain(msg):  # type: ignore[no-untyped-def]
        pass

    def of_message(msg: Message) -> None:
        pass

    def of_any(msg: Any) -> None:
        pass

    def of_messages(msgs: list[Message]) -> None:
        pass

    def of_list(msgs: list) -> None:  # type: ignore[type-arg]
        pass

    def of_str(msg: str) -> None:  # annotated so before typed handlers: it has always been given Messages
        pass

    def of_union(msg: int | str) -> None:
        pass

    app = App(group="typed")
    for topic, function, batch in [
        ("a", plain, False),
        ("b", of_message, False),
        ("c", of_any, False),
        ("d", of_messages, True),
        ("e", of_list, True),
        ("f", of_str, False),
        ("g", of_union, False),
    ]:
        app.handler(topic, batch=batch)(function)
        assert app.handlers[topic].function is function and app.handlers[topic].model is None


@pytest.mark.parametrize(
    ("annotation", "batch", "words"),
    [
        (Message[int | str], False, "one model class"),
        (dict[str, OrderStruct], False, "one model class"),
        (Message[int], False, "one model class"),
        (OrderStruct | None, False, "one model class"),
        (OrderStruct | int, False, "one model class"),
        (list[OrderStruct], False, "batch=True"),
        (OrderStruct, True, "list[OrderStruct]"),
        (list[dict[str, OrderStruct]], True, "one model class"),
        (list[Message[int]], True, "one model class"),
    ],
    ids=[
        "message of a union",
        "dict of models",
        "message of int",
        "optional",
        "union with a model",
        "list without batch",
        "model with batch",
        "list of dicts of models",
        "list of messages of int",
    ],
)
def test_annotations_that_cannot_be_honoured_are_refused_with_what_to_write(
    annotation: Any, batch: bool, words: str
) -> None:
    def handler(value):  # type: ignore[no-untyped-def]
        pass

    handler.__annotations__ = {"value": annotation}
    with pytest.raises(ConfigError, match="handler for 'orders'") as raised:
        App(group="typed").handler("orders", batch=batch)(handler)
    assert words in str(raised.value)


def test_an_unresolvable_annotation_is_refused_with_what_to_do() -> None:
    def handler(order: "NotImported") -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    with pytest.raises(ConfigError, match="cannot be resolved.*import the model class"):
        App(group="typed").handler("orders")(handler)


@pytest.mark.parametrize("serializer", ["yaml", object(), 3])
def test_a_bad_serializer_is_refused(serializer: Any) -> None:
    with pytest.raises(ConfigError, match="serializer"):
        App(group="typed").handler("orders", serializer=serializer)(lambda msg: None)


def test_a_typed_handler_keeps_its_name_and_registers_once() -> None:
    def on_order(order: OrderStruct) -> None:
        pass

    app = _app_with(on_order)
    assert app.handlers["orders"].name.endswith("on_order")
    with pytest.raises(ConfigError, match="is already registered"):
        app.handler("orders")(on_order)


@given(st.integers(0, 50), st.sets(st.integers(0, 50)))
def test_rejected_of_a_batch_is_exactly_its_undecodable_messages(count: int, bad: set[int]) -> None:
    errors = {i: PayloadError(f"bad {i}") for i in bad}
    batch_error = PayloadError("some did not decode", errors)
    chosen = rejected_of(batch_error, count)
    positions = set(range(count))
    assert set(chosen) == (positions & bad or (positions if not bad else set()))
    assert all(chosen[i] is errors[i] for i in chosen if bad)
    plain = Reject("no")
    assert rejected_of(plain, count) == dict.fromkeys(range(count), plain)


def test_string_annotations_are_resolved_in_the_handlers_module() -> None:
    """As ``from __future__ import annotations`` makes them: the model is found; only the first parameter's is
    evaluated, so another one naming what is imported under TYPE_CHECKING alone changes nothing."""
    got: list[Any] = []

    def on_order(order: "OrderStruct") -> "NotImportedHere":  # type: ignore[name-defined]  # noqa: F821
        got.append(order)

    def untyped(msg: "Message", other: "NotImportedHere" = None) -> None:  # type: ignore[name-defined]  # noqa: F821
        got.append(msg)

    app = App(group="typed")
    app.handler("orders")(on_order)
    app.handler("plain")(untyped)
    assert app.handlers["plain"].function is untyped
    run_handler(app, "orders", [GOOD])
    assert got == [OrderStruct(7, "tea", 2)]


def test_hooks_see_the_message_before_decoding_and_the_outcome_after() -> None:
    seen: list[Any] = []

    def on_order(order: OrderStruct) -> None:
        seen.append(("handler", order.id))

    app = _app_with(on_order)
    app.before_message(lambda msg: seen.append(("before", type(msg).__name__, msg.offset)))
    app.after_message(lambda msg, outcome, error, seconds: seen.append(("after", outcome, type(error).__name__)))
    run_handler(app, "orders", [GOOD, b"[]"])
    assert seen == [
        ("before", "Message", 0),
        ("handler", 7),
        ("after", "done", "NoneType"),
        ("before", "Message", 1),
        ("after", "rejected", "PayloadError"),
    ]
