"""An application with a typed handler (docs/handlers.md, "Typed handlers"): it takes ``Message[Order]`` and writes
one line per order it got to the sink, ``client pid partition offset id:attempt time`` (the sink app's layout).

MW_TEST_TOPIC, MW_TEST_SINK; MW_TEST_RUNNER: alo (one call at a time), amo (at most once), lanes (concurrency 4 on
threads), async (an ``async def`` handler, concurrency 4), batch (``list[Message[Order]]``, batches of 10) or shared
(shared partitions).  retries=3: a payload that does not decode must not be retried all the same.
"""

import os
import time

import msgspec

from marshal_workers import App, Message

app = App()
RUNNER = os.environ.get("MW_TEST_RUNNER", "alo")
SINK = os.environ["MW_TEST_SINK"]
CLIENT = os.environ.get("MARSHAL_WORKERS_CLIENT_ID", "?")


class Order(msgspec.Struct):
    id: int
    item: str
    quantity: int = 1


def record(msg: Message[Order]) -> None:
    with open(SINK, "a") as sink:
        sink.write(
            f"{CLIENT} {os.getpid()} {msg.partition} {msg.offset} {msg.body.id}:{msg.attempt} {time.time():.3f}\n"
        )


def handle(msg: Message[Order]) -> None:
    record(msg)


async def handle_async(msg: Message[Order]) -> None:
    record(msg)


def handle_batch(msgs: list[Message[Order]]) -> None:
    for msg in msgs:
        record(msg)


_options = {
    "amo": {"mode": "amo", "batch_size": 10},
    "lanes": {"concurrency": 4},
    "async": {"concurrency": 4},
    "batch": {"batch": True, "batch_size": 10},
    "shared": {"shared": True, "range_size": 10},
}
_function = {"async": handle_async, "batch": handle_batch}.get(RUNNER, handle)
app.handler(os.environ["MW_TEST_TOPIC"], retries=3, retry_backoff="10ms", **_options.get(RUNNER, {}))(_function)
