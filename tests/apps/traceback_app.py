"""An application whose handler fails in a function of its own, ``check_order``, for the traceback tests.

The value ``13`` fails (ValueError, retried once, then dead-lettered); any other is written to the sink as
``value attempt``.  MW_TEST_TOPIC, MW_TEST_SINK; MW_TEST_RUNNER: plain (one call at a time), batch (batches of
10), threads (concurrency 4 on a thread pool), async (``async def``, concurrency 4 on an event loop) or shared
(shared partitions, at most once: dead-lettered after the retry, not delivered again).
"""

import os

from marshal_workers import App, Message

app = App()
RUNNER = os.environ.get("MW_TEST_RUNNER", "plain")
SINK = os.environ["MW_TEST_SINK"]
_options = {
    "batch": {"batch": True, "batch_size": 10},
    "threads": {"concurrency": 4},
    "async": {"concurrency": 4},
    "shared": {"shared": True, "mode": "amo", "range_size": 10},
}


def check_order(value: bytes) -> None:
    if value == b"13":
        raise ValueError(f"order {value.decode()} has no amount")


def record(msg: Message) -> None:
    check_order(msg.value)
    with open(SINK, "a") as sink:
        sink.write(f"{msg.value.decode()} {msg.attempt}\n")


def handle(msg: Message) -> None:
    record(msg)


def handle_batch(msgs: list[Message]) -> None:
    for msg in msgs:
        check_order(msg.value)
    for msg in msgs:
        record(msg)


async def handle_async(msg: Message) -> None:
    record(msg)


_function = {"batch": handle_batch, "async": handle_async}.get(RUNNER, handle)
app.handler(os.environ["MW_TEST_TOPIC"], retries=1, retry_backoff="10ms", **_options.get(RUNNER, {}))(_function)
