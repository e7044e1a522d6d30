"""The ``dashboard`` command's web server (aiohttp): the page, its JSON, its server-sent events.

Routes: ``GET /`` the page, ``GET /api/state`` the latest document, ``GET /events`` one ``data:`` JSON
document per update, ``GET /autoscale`` the group's backlog and the workers it wants (docs/operations.md,
Autoscaling).  Everything comes from a :class:`~marshal_workers.observe.dashboard.Publisher` and an
:class:`~marshal_workers.observe.autoscale_meter.AutoscaleMeter`; this module only moves bytes.  SIGTERM and
SIGINT stop it cleanly: open event streams end, then the server closes.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from aiohttp import web

from marshal_workers.observe.autoscale_meter import AutoscaleMeter
from marshal_workers.observe.dashboard import KEEPALIVE_S, Publisher, asyncapi_answer, page, sse_event
from marshal_workers.observe.web_sites import open_site, stop_signal

_PUBLISHER = web.AppKey("publisher", Publisher)
_STOPPING = web.AppKey("stopping", asyncio.Event)
_AUTOSCALE = web.AppKey("autoscale", AutoscaleMeter)
_ASYNCAPI = web.AppKey[Callable[[], tuple[int, bytes]]]("asyncapi")
_STREAM_POLL_S = 0.2  # how often an event stream looks for a newer document (a dict lookup under a lock)


def make_app(
    publisher: Publisher, asyncapi: Callable[[], bytes] | None = None, autoscale: AutoscaleMeter | None = None
) -> web.Application:
    """``asyncapi``: the app's AsyncAPI document (``dashboard --app``), served at ``/asyncapi.json``;
    ``autoscale``: the meter that answers ``/autoscale``."""
    app = web.Application()
    app[_PUBLISHER] = publisher
    app[_STOPPING] = asyncio.Event()
    app[_ASYNCAPI] = asyncapi_answer(asyncapi)
    app.router.add_get("/", _page)
    app.router.add_get("/api/state", _state)
    app.router.add_get("/events", _events)
    app.router.add_get("/asyncapi.json", _asyncapi)
    if autoscale is not None:
        app[_AUTOSCALE] = autoscale
        app.router.add_get("/autoscale", _autoscale)
    app.on_shutdown.append(_end_streams)
    return app


async def _asyncapi(request: web.Request) -> web.Response:
    status, body = request.app[_ASYNCAPI]()
    return web.Response(status=status, body=body, content_type="application/json")


async def _autoscale(request: web.Request) -> web.Response:
    # In a thread: the sample reads the log under its lock, which the reader's thread takes too.
    status, body = await asyncio.to_thread(request.app[_AUTOSCALE].answer, request.query_string)
    return web.Response(
        status=status, body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
    )


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=page(), content_type="text/html", charset="utf-8")


async def _state(request: web.Request) -> web.Response:
    _, body = request.app[_PUBLISHER].latest()
    return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})


async def _events(request: web.Request) -> web.StreamResponse:
    publisher, stopping = request.app[_PUBLISHER], request.app[_STOPPING]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    sent, quiet = 0, 0.0
    try:
        while not stopping.is_set():
            version, body = publisher.latest()
            if version > sent:
                await response.write(sse_event(body))
                sent, quiet = version, 0.0
            elif quiet >= KEEPALIVE_S:
                await response.write(b": keep-alive\n\n")
                quiet = 0.0
            try:  # wake at once when the server stops
                await asyncio.wait_for(stopping.wait(), _STREAM_POLL_S)
            except TimeoutError:
                quiet += _STREAM_POLL_S
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the browser went away
    return response


async def _end_streams(app: web.Application) -> None:
    app[_STOPPING].set()


async def serve(
    publisher: Publisher,
    host: str,
    port: int,
    ready: Callable[[str], None],
    ssl_context: ssl.SSLContext | None = None,
    asyncapi: Callable[[], bytes] | None = None,
    autoscale: AutoscaleMeter | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; ``ready`` gets the URL once the port is open."""
    app = make_app(publisher, asyncapi, autoscale)
    runner, url = await open_site(app, host, port, ssl_context, "the dashboard", "--port")
    ready(url)
    await stop_signal()
    await runner.cleanup()
