"""Per-message hooks (hooks.py) without a broker: order, arguments, outcomes, a failing hook, no hooks no wrapper."""

from __future__ import annotations

import asyncio

import pytest

from marshal_workers import App, Ignore, Reject, Retry
from marshal_workers.handlers.hooks import Hooks, outcome_of, with_message_hooks


def recording_app(calls: list[tuple]) -> App:
    app = App(group="g")
    app.before_message(lambda msg: calls.append(("before", msg)))
    app.after_message(lambda msg, outcome, error, seconds: calls.append(("after", msg, outcome, type(error).__name__)))
    return app


def test_hooks_run_in_order_around_the_call_with_its_outcome() -> None:
    calls: list[tuple] = []
    app = recording_app(calls)

    @app.handler("orders")
    def handle(msg: str) -> None:
        calls.append(("handler", msg))
        if msg == "bad":
            raise ValueError(msg)

    hooked = app.handler_in_worker("orders")
    hooked.function("ok")
    with pytest.raises(ValueError):
        hooked.function("bad")
    assert calls == [
        ("before", "ok"),
        ("handler", "ok"),
        ("after", "ok", "done", "NoneType"),
        ("before", "bad"),
        ("handler", "bad"),
        ("after", "bad", "failed", "ValueError"),
    ]
    assert hooked.name == app.handlers["orders"].name, "the handler keeps its name (logs, dead letters)"


def test_the_outcome_names_what_the_handler_asked_for() -> None:
    assert [outcome_of(e) for e in (None, Retry(), Ignore(), Reject("x"), KeyError())] == [
        "done",
        "retry",
        "ignored",
        "rejected",
        "failed",
    ]


def test_a_failing_hook_is_logged_and_neither_stops_the_call_nor_the_other_hooks(caplog) -> None:
    seen: list[str] = []
    hooks = Hooks(before_message=[lambda msg: 1 / 0, lambda msg: seen.append("second")])
    assert with_message_hooks(lambda msg: seen.append("handler"), hooks)("m") is None
    assert seen == ["second", "handler"] and "hook" in caplog.text and "ZeroDivisionError" in caplog.text


def test_one_before_hook_alone_runs_before_the_call_and_a_failing_one_does_not_stop_it(caplog) -> None:
    seen: list[str] = []
    handler = with_message_hooks(
        lambda msg: seen.append(f"handler {msg}") or "result",
        Hooks(before_message=[lambda msg: seen.append(f"before {msg}")]),
    )
    assert handler("m") == "result" and seen == ["before m", "handler m"]
    failing = with_message_hooks(lambda msg: seen.append("called"), Hooks(before_message=[lambda msg: 1 / 0]))
    failing("m")
    assert seen[-1] == "called" and "ZeroDivisionError" in caplog.text


def test_no_message_hook_means_no_wrapper_and_async_handlers_stay_async() -> None:
    def plain(msg: object) -> None: ...

    assert with_message_hooks(plain, Hooks()) is plain
    app = App(group="g")
    app.handler("t")(plain)
    assert app.handler_in_worker("t") is app.handlers["t"], "nothing added to the hot path"

    calls: list[tuple] = []
    app = recording_app(calls)

    @app.handler("t", concurrency=4)
    async def handle(msg: str) -> None:
        calls.append(("handler", msg))

    hooked = app.handler_in_worker("t")
    assert hooked.is_async
    asyncio.run(hooked.function("m"))
    assert calls == [("before", "m"), ("handler", "m"), ("after", "m", "done", "NoneType")]
