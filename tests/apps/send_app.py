"""An application that sends one output message per input (app.send): value = the input's value.

Each handled input is also written to the sink file first (the sink app's line format), so a test can tell
how often an input was handled; its output is sent after that line, so an input's outputs are never more
than its lines.  Environment: MW_TEST_TOPIC, MW_TEST_OUTPUT (the output topic), MW_TEST_SINK,
MW_TEST_MODE (alo|amo), MW_TEST_BATCH (0|1), MW_TEST_BATCH_SIZE, MW_TEST_DELAY (seconds per message),
MW_TEST_CONCURRENCY, MW_TEST_ASYNC (1: an async def handler), MW_TEST_SHARED (1: a shared handler),
MW_TEST_RANGE_SIZE.
"""

import asyncio
import os
import time

from marshal_workers import App, Message

app = App()
OUTPUT = os.environ.get("MW_TEST_OUTPUT", "test-output")
SINK = os.environ.get("MW_TEST_SINK", os.devnull)
DELAY = float(os.environ.get("MW_TEST_DELAY", "0"))
CLIENT = os.environ.get("MARSHAL_WORKERS_CLIENT_ID", "?")
_sink = None


@app.on_worker_start
def open_sink() -> None:
    global _sink
    _sink = open(SINK, "a", buffering=1)  # noqa: SIM115 - open for the worker's life; line-buffered: one append a line


def forward(msg: Message) -> None:
    assert _sink is not None
    _sink.write(f"{CLIENT} {os.getpid()} {msg.partition} {msg.offset} {msg.value.decode()} {time.time():.3f}\n")
    app.send(OUTPUT, msg.value, key=msg.key, headers={"from": f"{msg.partition}:{msg.offset}"})


def handle(msg: Message) -> None:
    if DELAY:
        time.sleep(DELAY)
    forward(msg)


async def handle_async(msg: Message) -> None:
    if DELAY:
        await asyncio.sleep(DELAY)
    forward(msg)


def handle_batch(msgs: list) -> None:
    for msg in msgs:
        handle(msg)


BATCH = os.environ.get("MW_TEST_BATCH") == "1"
ASYNC = os.environ.get("MW_TEST_ASYNC") == "1"
app.handler(
    os.environ.get("MW_TEST_TOPIC", "test-topic"),
    mode=os.environ.get("MW_TEST_MODE", "alo"),
    batch=BATCH,
    batch_size=int(os.environ.get("MW_TEST_BATCH_SIZE", "50")),
    concurrency=int(os.environ.get("MW_TEST_CONCURRENCY", "1")),
    shared=os.environ.get("MW_TEST_SHARED") == "1",
    range_size=int(os.environ.get("MW_TEST_RANGE_SIZE", "100")),
    adaptive_ranges=os.environ.get("MW_TEST_ADAPTIVE_RANGES", "1") == "1",
    retries=0,
)(handle_batch if BATCH else handle_async if ASYNC else handle)
