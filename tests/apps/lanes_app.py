"""The application of the concurrency tests: it logs the start and the end of every handler call.

Every call appends two lines to the sink (MW_TEST_SINK), each one write(2) on an
O_APPEND descriptor, so lines from many threads never interleave:

    S <client> <pid> <partition> <offset> <key> <value> <time>     the call began
    E <client> <pid> <partition> <offset> <key> <value> <time>     it returned (handled)

Configured by environment variables:
MW_TEST_TOPIC, MW_TEST_MODE (alo|amo), MW_TEST_CONCURRENCY, MW_TEST_ORDERING (key|none|partition),
MW_TEST_ASYNC (1: an async def handler), MW_TEST_DELAY (seconds per call), MW_TEST_MAX_DELAY (a random
wait in [0, this) instead), MW_TEST_GATE_VALUES (every value divisible by this blocks until the file
MW_TEST_GATE_FILE exists), MW_TEST_FAIL_KEY (calls on this key fail until their third attempt),
MW_TEST_BATCH_SIZE, MW_TEST_RETRY_BACKOFF, MW_TEST_RETRY_JITTER (0: the backoff exactly, not a random wait up
to it), MW_TEST_WINDOW, MW_TEST_BATCH (1: a batch handler, which logs each message of a batch).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import threading
import time
from pathlib import Path

from marshal_workers import App, Message

app = App()
CLIENT = os.environ.get("MARSHAL_WORKERS_CLIENT_ID", "?")
DELAY = float(os.environ.get("MW_TEST_DELAY", "0"))
MAX_DELAY = float(os.environ.get("MW_TEST_MAX_DELAY", "0"))
GATE_EVERY = int(os.environ.get("MW_TEST_GATE_VALUES", "0"))
GATE_FILE = Path(os.environ.get("MW_TEST_GATE_FILE", "/nonexistent/gate"))
FAIL_KEY = os.environ.get("MW_TEST_FAIL_KEY", "").encode() or None
_sink_fd: int | None = None
_attempts: collections.Counter[int] = collections.Counter()
_attempts_lock = threading.Lock()


@app.on_worker_start
def open_sink() -> None:
    global _sink_fd
    _sink_fd = os.open(os.environ["MW_TEST_SINK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


@app.on_worker_stop
def close_sink() -> None:
    if _sink_fd is not None:
        os.close(_sink_fd)


def _line(kind: str, msg: Message) -> None:
    assert _sink_fd is not None
    key = (msg.key or b"-").decode()
    value = (msg.value or b"").decode()
    line = f"{kind} {CLIENT} {os.getpid()} {msg.partition} {msg.offset} {key} {value} {time.time():.6f}\n"
    os.write(_sink_fd, line.encode())


def _must_fail(msg: Message) -> bool:
    if FAIL_KEY is None or msg.key != FAIL_KEY:
        return False
    with _attempts_lock:
        _attempts[msg.offset] += 1
        return _attempts[msg.offset] < 3


def _gated(msg: Message) -> bool:
    return bool(GATE_EVERY) and int(msg.value or b"0") % GATE_EVERY == 0 and not GATE_FILE.exists()


def _wait() -> float:
    return random.uniform(0, MAX_DELAY) if MAX_DELAY else DELAY


def handle(msg: Message) -> None:
    _line("S", msg)
    if _must_fail(msg):
        raise ConnectionError(f"key {msg.key!r} is down")
    while _gated(msg):
        time.sleep(0.05)
    wait = _wait()
    if wait:
        time.sleep(wait)
    _line("E", msg)


async def handle_async(msg: Message) -> None:
    _line("S", msg)
    if _must_fail(msg):
        raise ConnectionError(f"key {msg.key!r} is down")
    while _gated(msg):
        await asyncio.sleep(0.05)
    wait = _wait()
    if wait:
        await asyncio.sleep(wait)
    _line("E", msg)


def handle_batch(msgs: list[Message]) -> None:
    for msg in msgs:
        _line("S", msg)
    time.sleep(_wait())
    for msg in msgs:
        _line("E", msg)


ordering = os.environ.get("MW_TEST_ORDERING") or None
batch = os.environ.get("MW_TEST_BATCH") == "1"
window = int(os.environ["MW_TEST_WINDOW"]) if "MW_TEST_WINDOW" in os.environ else None
app.handler(
    os.environ.get("MW_TEST_TOPIC", "test-topic"),
    mode=os.environ.get("MW_TEST_MODE", "alo"),
    concurrency=int(os.environ.get("MW_TEST_CONCURRENCY", "32")),
    ordering=ordering,
    batch_size=int(os.environ.get("MW_TEST_BATCH_SIZE", "500")),
    retries=3,
    retry_backoff=os.environ.get("MW_TEST_RETRY_BACKOFF", "10ms"),
    retry_jitter=os.environ.get("MW_TEST_RETRY_JITTER", "1") == "1",
    batch=batch,
    window=window,
)(handle_batch if batch else handle_async if os.environ.get("MW_TEST_ASYNC") == "1" else handle)
