"""Models out (issue 28, part 3): ``app.send`` encodes a model by the serializer given, else by that of the app's
handler of the destination topic (so it decodes it), else as JSON; ``make_message`` takes a model too.  A stand-in
outbox records what app.send hands it: no producer, no broker."""

# No "from __future__ import annotations": the handlers below are annotated with a class held in a local name.
import dataclasses
from typing import Any

import msgspec
import orjson
import pydantic
import pytest

from marshal_workers import App
from marshal_workers.errors import ConfigError
from marshal_workers.testing import make_message, run_handler


class OrderStruct(msgspec.Struct):
    id: int
    item: str


@dataclasses.dataclass
class OrderData:
    id: int
    item: str


class OrderModel(pydantic.BaseModel):
    id: int
    item: str


MODELS = [OrderStruct, OrderData, OrderModel]


class RecordingOutbox:
    """What app.send hands the worker's outbox, encoded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []

    def send(self, topic: str, value: bytes | None, key: Any, headers: Any) -> None:
        self.sent.append((topic, value))


class Reversed:
    """A user's serializer: JSON backwards (so a test can tell it was used)."""

    def decode(self, data: bytes, type: type) -> Any:
        return msgspec.json.decode(data[::-1], type=type)

    def encode(self, value: Any) -> bytes:
        return msgspec.json.encode(value)[::-1]


def sending_app(**handlers: Any) -> tuple[App, RecordingOutbox]:
    """An app with a handler per topic (keyword: topic, value: its serializer), as in a worker."""
    app = App(group="typed")
    for topic, serializer in handlers.items():

        def handle(order: OrderStruct) -> None: ...

        app.handler(topic, serializer=serializer)(handle)
    outbox = RecordingOutbox()
    app.outbox = outbox  # type: ignore[assignment]
    return app, outbox


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_model_sent_to_a_topic_without_a_handler_here_is_json(model: type) -> None:
    app, outbox = sending_app()
    app.send("receipts", model(id=7, item="tea"))
    [(topic, value)] = outbox.sent
    assert topic == "receipts" and orjson.loads(value or b"") == {"id": 7, "item": "tea"}


def test_a_model_sent_to_a_topic_of_ours_is_encoded_as_its_handler_decodes() -> None:
    app, outbox = sending_app(packed="msgpack", backwards=Reversed())
    app.send("packed", OrderStruct(7, "tea"))
    app.send("backwards", OrderStruct(8, "jam"))
    (_, packed), (_, backwards) = outbox.sent
    assert msgspec.msgpack.decode(packed, type=OrderStruct) == OrderStruct(7, "tea")
    assert msgspec.json.decode((backwards or b"")[::-1], type=OrderStruct) == OrderStruct(8, "jam")
    got: list[Any] = []

    def on_order(order: OrderStruct) -> None:
        got.append(order)

    receiver = App(group="other")
    receiver.handler("packed", serializer="msgpack")(on_order)
    [result] = run_handler(receiver, "packed", [make_message(packed)])
    assert result.outcome == "done" and got == [OrderStruct(7, "tea")]


def test_a_serializer_given_to_send_wins_and_a_bad_one_is_refused_with_what_to_give() -> None:
    app, outbox = sending_app(packed="msgpack")
    app.send("packed", OrderStruct(7, "tea"), serializer="json")
    assert orjson.loads(outbox.sent[0][1] or b"") == {"id": 7, "item": "tea"}
    with pytest.raises(ConfigError, match=r"app.send to 'packed': serializer must be 'json', 'msgpack' or an object"):
        app.send("packed", OrderStruct(7, "tea"), serializer="yaml")
    assert len(outbox.sent) == 1, "nothing sent on a refused serializer"


def test_values_that_are_not_models_are_sent_as_before() -> None:
    app, outbox = sending_app(packed="msgpack")
    app.send("packed", {"id": 7})
    app.send("packed", "text")
    assert [value for _, value in outbox.sent] == [b'{"id":7}', b"text"], "dicts are JSON whatever the handler's"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_make_message_takes_a_model_and_a_typed_handler_gets_it_back(model: type) -> None:
    got: list[Any] = []

    def on_order(order: model) -> None:  # type: ignore[valid-type]
        got.append(order)

    app = App(group="typed")
    app.handler("orders")(on_order)
    packed = App(group="typed")
    packed.handler("orders", serializer="msgpack")(on_order)
    run_handler(app, "orders", [make_message(model(id=7, item="tea"))])
    run_handler(packed, "orders", [make_message(model(id=8, item="jam"), serializer="msgpack")])
    assert got == [model(id=7, item="tea"), model(id=8, item="jam")]
