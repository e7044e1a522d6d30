"""The app's life (lifespan.py) without a broker: a worker lifespan entered and exited with the worker hooks, in
their order; the supervisor's startup hooks stopping at the first failure with a clear error, its shutdown hooks
all running whatever one of them does; async hooks run to their end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from marshal_workers import App
from marshal_workers.errors import AppStartupError, ConfigError
from marshal_workers.handlers.lifespan import run_shutdown_hooks, run_startup_hooks
from marshal_workers.testing import run_handler


def test_a_lifespan_opens_with_the_worker_start_hooks_and_closes_before_the_stop_hooks_last_in_first_out() -> None:
    events: list[Any] = []
    app = App(group="g")
    app.on_worker_start(lambda: events.append("start hook"))
    app.on_worker_stop(lambda: events.append("stop hook"))

    @app.lifespan
    def pool() -> Iterator[None]:
        events.append("pool opened")
        yield
        events.append("pool closed")

    @app.lifespan
    def cache() -> Iterator[None]:
        events.append("cache opened")
        try:
            yield
        finally:
            events.append("cache closed")

    app.handler("orders")(lambda msg: events.append("handled"))

    run_handler(app, "orders", [b"1"])  # a worker's life, as the testing harness runs it

    assert events == [
        "start hook",
        "pool opened",
        "cache opened",
        "handled",
        "cache closed",
        "pool closed",
        "stop hook",
    ]


def test_each_worker_life_enters_the_lifespan_anew() -> None:
    entered: list[int] = []
    app = App(group="g")

    @app.lifespan
    def count() -> Iterator[None]:
        entered.append(len(entered))
        yield
        entered.append(-1)

    app.handler("orders")(lambda msg: None)
    run_handler(app, "orders", [b"1"])
    run_handler(app, "orders", [b"2"])

    assert entered == [0, -1, 2, -1]


def test_a_lifespan_that_never_entered_is_not_exited() -> None:
    events: list[str] = []
    app = App(group="g")
    app.on_worker_start(lambda: 1 / 0)  # the worker cannot start: the lifespan after it never opens

    @app.lifespan
    def pool() -> Iterator[None]:
        events.append("opened")
        yield
        events.append("closed")

    with pytest.raises(ZeroDivisionError):
        for hook in app.worker_start_hooks:  # as a worker starts: the first that raises stops it
            hook()
    for hook in app.worker_stop_hooks:
        hook()
    assert events == []


@pytest.mark.parametrize("function", [lambda: None, "pool"], ids=["plain function", "not a function"])
def test_a_lifespan_must_be_a_generator_function(function: Any) -> None:
    with pytest.raises(ConfigError, match="app.lifespan takes a generator function with one yield"):
        App(group="g").lifespan(function)


def test_an_async_generator_lifespan_is_refused_saying_why() -> None:
    async def pool() -> Any:
        yield

    with pytest.raises(ConfigError, match="an async generator: a worker's hooks run outside any event loop"):
        App(group="g").lifespan(pool)


def test_startup_hooks_run_in_order_async_ones_to_their_end_and_stop_at_the_first_failure(caplog: Any) -> None:
    events: list[str] = []
    app = App(group="g")
    app.on_startup(lambda: events.append("first"))

    @app.on_startup
    async def connect() -> None:
        events.append("async")

    @app.on_startup
    def check_database() -> None:
        raise ConnectionError("no database at db:5432")

    app.on_startup(lambda: events.append("never"))

    with pytest.raises(AppStartupError) as raised:
        run_startup_hooks(app.startup_hooks)

    assert events == ["first", "async"]
    message = str(raised.value)
    assert message.startswith("on_startup hook ") and message.endswith(
        ".<locals>.check_database failed (ConnectionError: no database at db:5432): nothing was claimed"
    )
    assert "Traceback" in caplog.text and "no database at db:5432" in caplog.text, "its traceback is in the log"


def test_every_shutdown_hook_runs_when_one_fails_and_the_failure_is_logged(caplog: Any) -> None:
    events: list[str] = []
    app = App(group="g")

    @app.on_shutdown
    def flush_metrics() -> None:
        raise TimeoutError("metrics backend slow")

    @app.on_shutdown
    async def close_pool() -> None:
        events.append("pool closed")

    run_shutdown_hooks(app.shutdown_hooks)

    assert events == ["pool closed"]
    assert "on_shutdown hook" in caplog.text and "flush_metrics failed" in caplog.text
    assert "metrics backend slow" in caplog.text
