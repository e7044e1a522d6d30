"""``marshal-workers serve``: the Read / Ack / Cancel service's HTTP server (aiohttp; docs/http-service.md).

Routes: ``POST /read?timeout=5s&max=N``, ``POST /ack``, ``POST /cancel``
(see http_messages.py for the bodies), ``GET /healthz``, ``GET /metrics``
(Prometheus) and ``GET /openapi.json`` (the OpenAPI document, http_openapi.py).  aiohttp gives
keep-alive, many concurrent long polls on one event loop, TLS through an ``ssl.SSLContext`` and a
graceful shutdown.  Requests never block the event loop: their coordination records go to the group
commit (group_commit.py, on the same loop), whose verdicts they await as futures.

With a token every route but ``/healthz`` and ``/openapi.json`` requires ``Authorization: Bearer
<token>`` (compared in constant time; the token is never logged).  SIGTERM
(or ``admin shutdown``): reads answer at once (503 ``stopping``: ask another
server), acks and cancels go on being served while the held ranges are
settled (ranges no client holds a message of are given back at once), then
the server closes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from marshal_workers.core import tracing
from marshal_workers.errors import ConfigError, CoordinationWriteError
from marshal_workers.http.group_commit import LATENCY_BUCKETS, Kind
from marshal_workers.http.http_messages import BadRequest, MessageId, ReadRequest, message_ids, read_request
from marshal_workers.http.http_openapi import openapi_document
from marshal_workers.http.http_spans import ROUTES, Outcome, ServeSpans
from marshal_workers.http.served_topic import ServedTopic
from marshal_workers.http.settlements import LOG_LAG_GRACE_S
from marshal_workers.observe.metrics import SharedStats
from marshal_workers.observe.metrics_server import PREFIX, shared_families
from marshal_workers.observe.web_sites import open_site, stop_signal

_log = logging.getLogger(__name__)

_TOPIC = web.AppKey("topic", ServedTopic)
_TOKEN = web.AppKey("token", str)
_REQUESTS = web.AppKey("requests", Counter)
_SPANS = web.AppKey[ServeSpans | None]("spans")  # None: tracing is off
_HANDED = web.RequestKey("handed", list[dict[str, Any]])  # a read's answer, kept on the request for its span
_MOST = web.RequestKey("most", int)
_IDS = web.RequestKey("ids", list[MessageId])  # an ack's or cancel's messages
_OPENAPI = web.AppKey("openapi", bytes)
# A read's raw query string -> what it asks (a client sends the same one every time): parsed once. Bounded, since the
# query strings are the clients' (untrusted): past the bound it starts over.
_READ_QUERIES = web.AppKey("read_queries", dict[str, ReadRequest])
MOST_READ_QUERIES = 256
_OPEN_ROUTES = frozenset(("/healthz", "/openapi.json"))  # no token needed
_COUNTED_ROUTES = frozenset(("/read", "/ack", "/cancel", "/metrics", *_OPEN_ROUTES))  # any other path: "other"


class News:
    """Wakes every read waiting for a message: announced from the serve loop's thread when messages wait, and at a
    stop.  Reads that wait cost nothing until then (no polling)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def announce_threadsafe(self) -> None:
        self._loop.call_soon_threadsafe(self.announce)

    def announce(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            pass


_REGISTRY = web.AppKey("registry", CollectorRegistry)
_NEWS = web.AppKey("news", News)


def check_bind(host: str, token: str | None, allow_unauthenticated: bool) -> None:
    """Without a token the service listens on this host only, unless told otherwise."""
    if token or allow_unauthenticated:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(
            f"serving on {host} without a token lets anyone who can reach it ack messages: give "
            "--token-file (or MARSHAL_WORKERS_SERVE_TOKEN), or --allow-unauthenticated"
        )


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from None
    return context


def make_app(topic: ServedTopic, token: str | None) -> web.Application:
    app = web.Application(middlewares=[_errors_and_auth], client_max_size=4 * 2**20)
    app[_TOPIC] = topic
    app[_TOKEN] = token or ""
    app[_REQUESTS] = Counter()
    app[_NEWS] = News()
    app[_SPANS] = ServeSpans.if_tracing(topic.topic, topic.settings.require_group(), topic.settings.client_id)
    topic.on_news = app[_NEWS].announce_threadsafe
    app[_OPENAPI] = orjson.dumps(openapi_document(token_required=bool(token)))
    app[_READ_QUERIES] = {}
    app.add_routes(service_routes())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServeCollector(topic, app[_REQUESTS]))
    app[_REGISTRY] = registry
    return app


def service_routes() -> list[web.RouteDef]:
    """Every route of the service (each one documented in the OpenAPI document: tests/unit/http check both ways)."""
    return [
        web.post("/read", _read),
        web.post("/ack", _ack),
        web.post("/cancel", _cancel),
        web.get("/healthz", _healthz),
        web.get("/metrics", _metrics),
        web.get("/openapi.json", _openapi),
    ]


@web.middleware
async def _errors_and_auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    app, path = request.app, request.path  # each an attribute lookup through aiohttp's properties: once
    route = path if path in _COUNTED_ROUTES else "other"
    spans = app[_SPANS]
    start_ns = time.time_ns() if spans is not None else 0
    error, why = "", ""
    try:
        token = app[_TOKEN]
        if token and path not in _OPEN_ROUTES:
            given = request.headers.get("Authorization", "")
            if not given.startswith("Bearer ") or not hmac.compare_digest(given[7:].encode(), token.encode()):
                raise BadRequest(401, "unauthorized", "send Authorization: Bearer <the server's token>")
        response = await handler(request)
    except BadRequest as exc:
        error, why = exc.error, str(exc)
        response = web.Response(status=exc.status, body=exc.body(), content_type="application/json")
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if exc.status == 503:
            response.headers["Retry-After"] = "1"
    except web.HTTPException as exc:  # aiohttp's own: 404 no such route, 405, 413 body too large
        error, why = exc.reason.lower().replace(" ", "_"), exc.reason
        response = web.Response(
            status=exc.status,
            content_type="application/json",
            body=orjson.dumps({"error": exc.reason.lower().replace(" ", "_"), "message": exc.reason}),
        )
    except Exception:  # noqa: BLE001 - a bug, or Kafka failing under us: a JSON 500, logged and counted like the rest
        _log.exception("group %s: %s %s failed", app[_TOPIC].settings.group, request.method, path)
        error, why = "internal", "the server failed on this request"
        response = web.Response(
            status=500,
            content_type="application/json",
            body=orjson.dumps(
                {"error": "internal", "message": "the server failed on this request (see its log): try again"}
            ),
        )
    app[_REQUESTS][(route, response.status)] += 1
    if spans is not None and route in ROUTES:
        outcome = Outcome(
            route,
            response.status,
            error,
            why,
            request.get(_MOST, 0),
            request.get(_HANDED, ()),
            [(m.partition, m.offset) for m in request.get(_IDS, ())],
        )
        spans.record(outcome, request.headers, start_ns)
    return response


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def _read(request: web.Request) -> web.StreamResponse:
    asked = _read_request(request)
    topic, news = request.app[_TOPIC], request.app[_NEWS]
    topic.last_read = now = time.monotonic()
    deadline = now + asked.wait_s
    topic.waiting_readers += 1
    first = True  # a read tries the held messages at once: the loop's count may be stale (it may sit in a write)
    try:
        while True:
            if topic.available_now or first:
                first = False
                # On the event loop: a first hand-out is answered at once, another waits for its write's verdict.
                handed = topic.hand_out(asked.most)
                messages = await handed if isinstance(handed, asyncio.Future) else handed
                if messages:
                    request[_HANDED], request[_MOST] = messages, asked.most
                    return _json({"messages": messages})
            if topic.stopping:  # not "nothing yet": this server is going away, ask another
                raise BadRequest(
                    503,
                    "stopping",
                    "this server is shutting down: read from another server of the group",
                    retry_after=1,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return web.Response(status=204)
            topic.wake_loop()  # it leases and fetches for the reads that wait
            await news.wait(remaining)
    finally:
        topic.waiting_readers -= 1


def _read_request(request: web.Request) -> ReadRequest:
    """What a read asks (BadRequest if its query is wrong: never kept), parsed once per distinct query string."""
    known, raw = request.app[_READ_QUERIES], request.rel_url.raw_query_string
    asked = known.get(raw)
    if asked is None:
        asked = read_request(dict(request.query))
        if len(known) >= MOST_READ_QUERIES:
            known.clear()
        known[raw] = asked
    return asked


async def _ack(request: web.Request) -> web.Response:
    return await _settle(request, Kind.ACK)


async def _cancel(request: web.Request) -> web.Response:
    return await _settle(request, Kind.CANCEL)


async def _settle(request: web.Request, kind: Kind) -> web.Response:
    """An ack or cancel: checked against the log (waiting a moment for a view that may lag), written in the next
    group commit, answered once the log's verdict is known (never before)."""
    ids = request[_IDS] = message_ids(await request.read())
    topic = request.app[_TOPIC]
    states = topic.message_states(ids)
    give_up = time.monotonic() + LOG_LAG_GRACE_S
    while topic.log_may_lag(states) and time.monotonic() < give_up:
        await asyncio.sleep(0.01)
        states = topic.message_states(ids)
    settlement = topic.settlement(ids, states, kind)
    verdicts: list[bool] = []
    if settlement.todo:
        try:
            verdicts = await topic.write_settlement(settlement)
        except CoordinationWriteError as exc:
            raise BadRequest(
                503,
                "not_written",
                f"the coordination log did not confirm the {settlement.verb[:-2]}: try again ({exc})",
                retry_after=1,
            ) from None
    return _json(topic.settled(settlement, verdicts))


async def _healthz(request: web.Request) -> web.Response:
    topic = request.app[_TOPIC]
    loop_age = time.monotonic() - topic.last_loop
    details = {
        **topic.held_summary(),
        "topic": topic.topic,
        "stopping": topic.stopping,
        "loop_seconds_ago": round(loop_age, 3),
    }
    ok = loop_age < 10 and not topic.stopping
    return _json({"status": "ok" if ok else "unhealthy", **details}, 200 if ok else 503)


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[_OPENAPI], content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[_REGISTRY])
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


class _ServeCollector(Collector):
    """The shared-partition metrics of ``run`` (leases, ranges, messages, low-water marks) plus the service's
    requests and pending messages."""

    def __init__(self, topic: ServedTopic, requests: Counter[tuple[str, int]]) -> None:
        self.topic = topic
        self.requests = requests

    def collect(self) -> Iterator[Metric]:
        topic, c = self.topic, self.topic.counters
        group = topic.settings.require_group()
        now_ms = round(time.time() * 1000)
        marks = {
            p: mark for (_, p), mark in topic.coordinator.read(lambda w: w.shared_marks(now_ms, topic.topic)).items()
        }
        summary = topic.held_summary()
        stats = SharedStats(
            topic=topic.topic,
            leases_held=summary["leases"],
            workers=0,
            ranges={
                "claimed": c.ranges_claimed,
                "refused": c.ranges_refused,
                "acked": c.ranges_acked,
                "cancelled": c.ranges_cancelled,
                "abandoned": c.ranges_lost,
            },
            messages={
                "delivered": c.delivered,
                "handled": c.acked,
                "cancelled": c.cancelled,
                "dead_lettered": c.dead_lettered,
                "refused": c.refused,
                "other_group": c.other_group,
            },
            worker_restarts=0,
            low_water_marks={p: low for p, (low, _) in marks.items()},
            lost={p: lost for p, (_, lost) in marks.items()},
        )
        yield from shared_families(group, [stats])
        pending = GaugeMetricFamily(
            f"{PREFIX}_serve_pending_messages",
            "Messages handed to HTTP clients and not acked, cancelled or past their deadline.",
            labels=["group", "topic"],
        )
        pending.add_metric([group, topic.topic], summary["pending"])
        yield pending
        requests = CounterMetricFamily(
            f"{PREFIX}_serve_requests", "HTTP requests by route and status.", labels=["group", "route", "status"]
        )
        for (route, status), count in sorted(self.requests.items()):
            requests.add_metric([group, route, str(status)], count)
        yield requests
        yield from _write_families(group, topic)


def _write_families(group: str, topic: ServedTopic) -> Iterator[Metric]:
    """The group commit's coordination writes: how long each took (produce to verdict), how many messages they
    carried, and how many failed: the read and ack latencies' floor."""
    stats = topic.write_stats()
    cumulative, running = [], 0
    for bound, count in zip([*(str(b) for b in LATENCY_BUCKETS), "+Inf"], stats.buckets):
        running += count
        cumulative.append((bound, running))
    seconds = HistogramMetricFamily(
        f"{PREFIX}_serve_write_seconds",
        "Coordination writes of the service's message records (one per group commit): seconds from produce to verdict.",
        labels=["group", "topic"],
    )
    seconds.add_metric([group, topic.topic], cumulative, stats.seconds)
    yield seconds
    entries = CounterMetricFamily(
        f"{PREFIX}_serve_written_messages",
        "Message entries (hand-outs, acks, cancels) carried by the service's coordination writes.",
        labels=["group", "topic"],
    )
    entries.add_metric([group, topic.topic], stats.entries)
    yield entries
    failed = CounterMetricFamily(
        f"{PREFIX}_serve_write_failures",
        "Coordination writes of the service's message records not confirmed in time.",
        labels=["group", "topic"],
    )
    failed.add_metric([group, topic.topic], stats.failed)
    yield failed


async def serve(
    topic: ServedTopic,
    host: str,
    port: int,
    token: str | None,
    ssl_context: ssl.SSLContext | None,
    shutdown_timeout: float,
    ready: Callable[[str], None],
) -> None:
    """Serve until SIGTERM or SIGINT, then settle what is held and close (and send the spans still buffered)."""
    tracing.start_in_server()  # OTEL_* (docs/operations.md, "Tracing"): nothing imported without them
    try:
        await _serve(topic, host, port, token, ssl_context, shutdown_timeout, ready)
    finally:
        if tracing.active():
            tracing.flush()


async def _serve(
    topic: ServedTopic,
    host: str,
    port: int,
    token: str | None,
    ssl_context: ssl.SSLContext | None,
    shutdown_timeout: float,
    ready: Callable[[str], None],
) -> None:
    topic.open_writes(asyncio.get_running_loop())
    app = make_app(topic, token)
    runner, url = await open_site(app, host, port, ssl_context, "the service", "--port")
    ordered = asyncio.Event()  # admin shutdown: the serve loop's thread sets it through the event loop
    loop = asyncio.get_running_loop()
    topic.on_shutdown_order = lambda: loop.call_soon_threadsafe(ordered.set)
    ready(url)
    await stop_signal(ordered)
    _log.info(
        "group %s: stopping: settling %d held ranges of %s",
        topic.settings.group,
        topic.held_summary()["leases"],
        topic.topic,
    )
    topic.begin_stop()
    app[_NEWS].announce()  # reads waiting answer now
    give_up = time.monotonic() + shutdown_timeout
    while not topic.stopped() and time.monotonic() < give_up:
        await asyncio.sleep(0.05)
    if not topic.stopped():
        _log.warning(
            "group %s: %s: ranges still held after the shutdown timeout: they lapse and their messages not "
            "acked are delivered again",
            topic.settings.group,
            topic.topic,
        )
        topic.abandon()
    await runner.cleanup()
    await topic.close_writes()  # hand-outs answered and not yet written go in a last write
