"""The dashboard's Publisher and its pages on the metrics port (``run --dashboard``), without a broker."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from test_metrics import snapshot

from marshal_workers import App, Message
from marshal_workers.handlers.asyncapi import asyncapi_json
from marshal_workers.kafka.embedded_broker import free_port
from marshal_workers.observe.dashboard import Publisher, sse_event, supervisor_step
from marshal_workers.observe.dashboard_model import Dashboard
from marshal_workers.observe.metrics_server import MetricsServer
from marshal_workers.ops.dashboard_server import make_app
from marshal_workers.protocol.codec import Claim, Heartbeat
from marshal_workers.protocol.world_state import WorldState

T0 = 1_700_000_000_000


def world() -> WorldState:
    state = WorldState("billing", 1_000)
    state.apply(Claim(v=1, ts=T0, group="billing", client="a", instance="i-a", topic="orders", partition=0), T0)
    state.apply(
        Heartbeat(v=1, ts=T0 + 50, group="billing", client="a", instance="i-a", topic="orders", partition=0, offset=4),
        T0 + 50,
    )
    return state


def step() -> object:
    state, lock = world(), threading.Lock()

    def read(query: object) -> Dashboard:
        with lock:
            return query(state)  # type: ignore[operator]

    return supervisor_step(read, lambda: {("orders", 0): 10}, lambda: {"orders": 2}, clock=lambda: (T0 + 100) / 1000)


def test_a_publisher_hands_out_numbered_documents_and_wakes_waiters_when_closed() -> None:
    publisher = Publisher(step(), interval=0.05).start()  # type: ignore[arg-type]
    try:
        version, body = publisher.latest()
        assert version >= 1
        document = orjson.loads(body)
        assert [(r["partition"], r["state"], r["lag"]) for r in document["partitions"]] == [
            (0, "fresh", 6),
            (1, "unclaimed", None),
        ]
        newer = publisher.wait_newer(version, timeout=5)
        assert newer is not None and newer[0] > version
    finally:
        publisher.close()
    assert publisher.wait_newer(10**9, timeout=5) is None, "closed: waiting ends at once"


def test_a_failing_step_keeps_the_last_document() -> None:
    calls = []

    def flaky(dashboard: Dashboard) -> Dashboard:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("the log went away")
        return Dashboard({"partitions": []})

    publisher = Publisher(flaky, interval=0.01).start()
    try:
        assert publisher.wait_newer(1, timeout=0.2) is None
        assert publisher.latest() == (1, b'{"partitions":[]}')
    finally:
        publisher.close()


@pytest.fixture
def dashboard_port() -> Iterator[int]:
    port = free_port()
    publisher = Publisher(step(), interval=0.05).start()  # type: ignore[arg-type]
    server = MetricsServer("127.0.0.1", port, snapshot, dashboard=publisher)
    try:
        yield port
    finally:
        publisher.close()
        server.close()


def test_the_metrics_port_serves_the_page_its_json_and_its_events(dashboard_port: int) -> None:
    base = f"http://127.0.0.1:{dashboard_port}"
    with urllib.request.urlopen(f"{base}/dashboard", timeout=5) as response:  # redirected: relative URLs work
        assert response.url == f"{base}/dashboard/"
        assert b'EventSource("events")' in response.read()
    with urllib.request.urlopen(f"{base}/dashboard/api/state", timeout=5) as response:
        assert orjson.loads(response.read())["group"] == "billing"
    with urllib.request.urlopen(f"{base}/dashboard/events", timeout=5) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        first, blank = response.readline(), response.readline()
        second = response.readline()
    assert first.startswith(b"data: {") and blank == b"\n" and second.startswith(b"data: {")
    assert orjson.loads(first[len(b"data: ") :])["partitions"][0]["owner"] == "a/i-a"
    assert sse_event(b"{}") == b"data: {}\n\n"


def test_without_the_dashboard_the_metrics_port_has_no_such_page() -> None:
    port = free_port()
    server = MetricsServer("127.0.0.1", port, snapshot)
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/", timeout=5)
        assert error.value.code == 404
    finally:
        server.close()


def described_app() -> App:
    app = App(group="billing")

    @app.handler("orders")
    def on_order(msg: Message) -> None: ...

    return app


def test_the_metrics_port_and_the_dashboard_serve_the_apps_asyncapi_document() -> None:
    """At /asyncapi.json, the document `marshal-workers asyncapi` prints; the dashboard without --app says how."""
    expected = asyncapi_json(described_app(), brokers="k1:9092")
    port = free_port()
    server = MetricsServer(
        "127.0.0.1", port, snapshot, asyncapi=lambda: asyncapi_json(described_app(), brokers="k1:9092")
    )
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/asyncapi.json", timeout=5) as response:
            assert response.headers["Content-Type"] == "application/json" and response.read() == expected
    finally:
        server.close()

    async def dashboard_answers(described: bool) -> tuple[int, Any]:
        publisher = Publisher(step(), interval=0.05)  # type: ignore[arg-type]
        document = (lambda: expected) if described else None
        async with TestClient(TestServer(make_app(publisher, document))) as client:
            response = await client.get("/asyncapi.json")
            return response.status, orjson.loads(await response.read())

    assert asyncio.run(dashboard_answers(True)) == (200, orjson.loads(expected))
    status, body = asyncio.run(dashboard_answers(False))
    assert status == 404 and "--app MODULE:APP" in body["error"]
