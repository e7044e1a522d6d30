"""The ceiling of bench_serve.py: a bare aiohttp server that answers the service's requests without Kafka.

    python serve_ceiling.py PORT

``POST /read?max=N`` answers ``{"messages": [...]}`` with N messages shaped as the service's (the same fields, a
value of the benchmark's size), ``POST /ack`` parses the JSON list and answers ``{"acked": n, "already": 0}``,
``GET /healthz`` answers ``{"status": "ok"}``.  What the HTTP service could do at most on this machine with the
same web server, the same JSON library and the same client: its messages per second and per CPU-second are the
bar the service is measured against.
"""

from __future__ import annotations

import itertools
import sys
import time

import orjson
from aiohttp import web

VALUE = "x" * 100  # bench_run.value_of's size, about


def main() -> None:
    port = int(sys.argv[1])
    offsets = itertools.count()

    async def read(request: web.Request) -> web.Response:
        most = int(request.query.get("max", "1"))
        now = int(time.time() * 1000)
        messages = [
            {
                "topic": "ceiling",
                "partition": 0,
                "offset": next(offsets),
                "key": None,
                "value": VALUE,
                "headers": [],
                "encoding": "utf-8",
                "timestamp": now,
                "deadline": now + 30_000,
                "deliveries": 1,
            }
            for _ in range(most)
        ]
        return web.Response(body=orjson.dumps({"messages": messages}), content_type="application/json")

    async def ack(request: web.Request) -> web.Response:
        ids = orjson.loads(await request.read())
        return web.Response(body=orjson.dumps({"acked": len(ids), "already": 0}), content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"status": "ok"}), content_type="application/json")

    app = web.Application()
    app.router.add_post("/read", read)
    app.router.add_post("/ack", ack)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
