"""The ceilings of bench_serve.py: a bare aiohttp server that answers the service's requests, in memory or with
one durable write per ack.

    python serve_ceiling.py PORT [--durable BROKERS TOPIC [--linger-ms N]]

``POST /read?max=N`` answers ``{"messages": [...]}`` with N messages shaped as the service's (the same fields, a
value of the benchmark's size), from memory; ``POST /ack`` parses the JSON list and answers
``{"acked": n, "already": 0}``; ``GET /healthz`` answers ``{"status": "ok"}``.

In memory (no ``--durable``), the ack writes nothing: what any server could do at most on this machine with the
same web server, the same JSON library and the same client.  With ``--durable``, each ack request produces one
record (the request's body) to TOPIC on BROKERS, by one producer built as the package builds its output producer
(``client_profiles.output_producer``: ``acks=all``, idempotent, librdkafka's defaults otherwise, among them
``linger.ms`` 5; ``--linger-ms`` sets it as a user would, in ``[kafka.producer]``), and is answered only after
that record's delivery report: the least a server must do to say "done" durably, with no
log to judge the ack against.  A thread polls the producer (its delivery reports), so the records of many
requests are in flight at once, and hands the reports of one poll to the event loop in one wake-up.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time

import checkout  # noqa: F401  (sys.path: the checkout's package, this folder)
import orjson
from aiohttp import web
from confluent_kafka import KafkaError, Message, Producer

from marshal_workers.core.config import Settings
from marshal_workers.kafka import client_profiles

VALUE = "x" * 100  # bench_run.value_of's size, about
Reported = list[tuple["asyncio.Future[None]", KafkaError | None]]


class DurableAcks:
    """One output producer; ``write`` resolves once its record's delivery report came."""

    def __init__(self, brokers: str, topic: str, loop: asyncio.AbstractEventLoop, linger_ms: str = "") -> None:
        passthrough = {"linger.ms": linger_ms} if linger_ms else {}
        settings = Settings(brokers=brokers, client_id="serve-ceiling", kafka_producer=passthrough)
        self.producer = Producer(client_profiles.output_producer(settings))
        self.topic, self.loop = topic, loop
        self.reported: Reported = []  # filled by the delivery reports, in the polling thread
        # Connected, its producer id granted and the topic's leader known before the first request.
        self.producer.produce(topic, b"warm-up")
        if self.producer.flush(30):
            raise RuntimeError(f"could not write to {topic} on {brokers}")
        threading.Thread(target=self._poll, name="ceiling-poll", daemon=True).start()

    def write(self, value: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = self.loop.create_future()

        def report(error: KafkaError | None, _message: Message) -> None:
            self.reported.append((done, error))

        self.producer.produce(self.topic, value, on_delivery=report)
        return done

    def _poll(self) -> None:
        while True:
            self.producer.poll(0.1)  # waits without the GIL; the reports run here
            if self.reported:
                batch, self.reported = self.reported, []
                self.loop.call_soon_threadsafe(settle, batch)


def settle(batch: Reported) -> None:
    for done, error in batch:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(RuntimeError(str(error)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--durable", nargs=2, metavar=("BROKERS", "TOPIC"), help="One durable record per ack.")
    parser.add_argument("--linger-ms", default="", help="The producer's linger.ms (default: the profile's).")
    args = parser.parse_args()
    offsets = itertools.count()
    durable: list[DurableAcks] = []  # made on the server's loop, at start-up

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
        body = await request.read()
        ids = orjson.loads(body)
        if durable:
            try:
                await durable[0].write(body)
            except RuntimeError as exc:
                return web.Response(status=503, body=orjson.dumps({"error": str(exc)}), content_type="application/json")
        return web.Response(body=orjson.dumps({"acked": len(ids), "already": 0}), content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"status": "ok"}), content_type="application/json")

    async def start_durable(app: web.Application) -> None:
        if args.durable:
            brokers, topic = args.durable
            durable.append(DurableAcks(brokers, topic, asyncio.get_running_loop(), args.linger_ms))

    app = web.Application()
    app.on_startup.append(start_durable)
    app.router.add_post("/read", read)
    app.router.add_post("/ack", ack)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
