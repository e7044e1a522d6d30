"""Middleware (middleware.py) around a handler as a worker runs it (App.handler_in_worker), without a broker: the
order they nest in, a skip, an error translated, async handlers, a typed handler's decoding inside the chain, and
the mistakes refused when they are registered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from fake_record import FakeRecord

from marshal_workers import App, Message
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.models import PayloadError


def tracing(name: str, calls: list[Any]) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """A middleware that notes when it enters and leaves, and what the call returned or raised."""

    def middleware(msg: Any, call_next: Callable[[Any], Any]) -> Any:
        calls.append(f"{name} in")
        try:
            result = call_next(msg)
        except Exception as exc:
            calls.append(f"{name} saw {type(exc).__name__}")
            raise
        calls.append(f"{name} out {result}")
        return result

    return middleware


def test_middlewares_nest_in_registration_order_the_handlers_own_inside_the_apps() -> None:
    calls: list[Any] = []
    app = App(group="g")
    app.middleware(tracing("first", calls))

    @app.handler("orders", middleware=[tracing("own", calls)])
    def handle(msg: str) -> str:
        calls.append(f"handler {msg}")
        return "ok"

    app.middleware(tracing("second", calls))  # registered after the handler: it still wraps it

    assert app.handler_in_worker("orders").function("m") == "ok"
    assert calls == ["first in", "second in", "own in", "handler m", "own out ok", "second out ok", "first out ok"]


def test_a_middleware_that_does_not_call_next_skips_the_handler_and_the_call_is_done() -> None:
    calls: list[Any] = []
    app = App(group="g")
    app.after_message(lambda msg, outcome, error, seconds: calls.append(("after", msg, outcome)))

    @app.middleware
    def only_paid(msg: str, call_next: Callable[[str], Any]) -> Any:
        return call_next(msg) if msg.startswith("paid") else None

    app.handler("orders")(lambda msg: calls.append(("handler", msg)))
    run = app.handler_in_worker("orders").function

    run("paid 1")
    run("free 2")
    assert calls == [("handler", "paid 1"), ("after", "paid 1", "done"), ("after", "free 2", "done")]


def test_an_error_a_middleware_raises_instead_is_what_the_call_failed_with_and_what_the_hooks_see() -> None:
    class Unavailable(Exception):
        pass

    seen: list[Any] = []
    app = App(group="g")
    app.after_message(lambda msg, outcome, error, seconds: seen.append((outcome, type(error).__name__)))

    @app.middleware
    def translate(msg: str, call_next: Callable[[str], Any]) -> Any:
        try:
            return call_next(msg)
        except ConnectionError as exc:
            raise Unavailable("the database is down") from exc

    @app.handler("orders")
    def handle(msg: str) -> None:
        raise ConnectionError("refused")

    with pytest.raises(Unavailable) as raised:
        app.handler_in_worker("orders").function("m")
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert seen == [("failed", "Unavailable")]


def test_a_middleware_may_hand_the_handler_something_else() -> None:
    app = App(group="g")
    app.middleware(lambda msg, call_next: call_next(msg.upper()))
    got: list[str] = []
    app.handler("orders")(got.append)

    app.handler_in_worker("orders").function("m")
    assert got == ["M"]


def test_async_middleware_wraps_an_async_handler_which_stays_async() -> None:
    calls: list[Any] = []
    app = App(group="g")

    @app.middleware
    async def timing(msg: str, call_next: Callable[[str], Any]) -> Any:
        calls.append("before")
        result = await call_next(msg)
        calls.append(f"after {result}")
        return result

    @app.handler("orders", concurrency=4)
    async def handle(msg: str) -> str:
        await asyncio.sleep(0)
        calls.append(f"handler {msg}")
        return "ok"

    spec = app.handler_in_worker("orders")
    assert spec.is_async and spec.name == app.handlers["orders"].name, "the lanes run it as a task, under its name"
    assert asyncio.run(spec.function("m")) == "ok"
    assert calls == ["before", "handler m", "after ok"]


def test_a_batch_handlers_middleware_gets_the_batch() -> None:
    seen: list[Any] = []
    app = App(group="g")
    app.middleware(lambda msgs, call_next: seen.append(list(msgs)) or call_next(msgs))
    app.handler("orders", batch=True)(lambda msgs: seen.append(len(msgs)))

    app.handler_in_worker("orders").function(["a", "b"])
    assert seen == [["a", "b"], 2]


class Order(msgspec.Struct):
    id: int


def test_a_typed_handlers_middleware_gets_the_message_and_sees_a_payload_that_does_not_decode() -> None:
    seen: list[Any] = []
    app = App(group="g")

    @app.middleware
    def watch(msg: Message, call_next: Callable[[Message], Any]) -> Any:
        seen.append(msg.offset)
        try:
            return call_next(msg)
        except PayloadError:
            seen.append("payload error")
            raise

    @app.handler("orders")
    def handle(order: Order) -> None:
        seen.append(order)

    run = app.handler_in_worker("orders").function
    run(Message(FakeRecord("orders", 0, 7, value=b'{"id": 1}')))
    with pytest.raises(PayloadError):
        run(Message(FakeRecord("orders", 0, 8, value=b"not json")))
    assert seen == [7, Order(1), 8, "payload error"]


def test_no_middleware_no_wrapper() -> None:
    app = App(group="g")
    app.handler("orders")(lambda msg: None)
    assert app.handler_in_worker("orders") is app.handlers["orders"]


def test_a_def_middleware_for_an_async_handler_is_refused_either_way_round_naming_both() -> None:
    def plain(msg: Any, call_next: Callable[[Any], Any]) -> Any:
        return call_next(msg)

    async def handle(msg: Any) -> None: ...

    first = App(group="g")
    first.middleware(plain)
    with pytest.raises(ConfigError, match=r"handler for 'orders' \(.*handle\) is async def.*plain.*async def mw"):
        first.handler("orders", concurrency=2)(handle)

    second = App(group="g")
    second.handler("orders", concurrency=2)(handle)
    with pytest.raises(ConfigError, match="is async def, but middleware .*plain is a def function"):
        second.middleware(plain)
    assert second.middlewares == [], "a refused middleware is not registered"


def test_an_async_middleware_for_a_def_handler_is_refused_and_one_of_each_kind_can_go_on_its_handlers() -> None:
    async def awaiting(msg: Any, call_next: Callable[[Any], Any]) -> Any:
        return await call_next(msg)

    def plain(msg: Any, call_next: Callable[[Any], Any]) -> Any:
        return call_next(msg)

    app = App(group="g")
    with pytest.raises(ConfigError, match="is a def function, but middleware .*awaiting is async def"):
        app.handler("orders", middleware=[awaiting])(lambda msg: None)
    app.handler("orders", middleware=plain)(lambda msg: None)
    app.handler("pushes", middleware=[awaiting], concurrency=2)(awaiting_handler)
    assert app.handlers["orders"].middleware == (plain,) and app.handlers["pushes"].middleware == (awaiting,)


async def awaiting_handler(msg: Any) -> None: ...


@pytest.mark.parametrize(
    ("given", "says"),
    [("log", "must be a function mw"), (lambda msg: msg, r"must take two arguments, \(msg, call_next\)")],
)
def test_a_middleware_that_cannot_be_called_as_one_is_refused(given: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        App(group="g").middleware(given)
    with pytest.raises(ConfigError, match=says):
        App(group="g").handler("orders", middleware=[given])
