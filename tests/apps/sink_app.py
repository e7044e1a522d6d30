"""The application the end-to-end tests run: it writes one line per handled message to a sink file.

Configured by environment variables so one module serves every test:
MW_TEST_TOPIC, MW_TEST_MODE (alo|amo), MW_TEST_BATCH (0|1), MW_TEST_BATCH_SIZE,
MW_TEST_SINK (file), MW_TEST_DELAY (seconds per message), MW_TEST_FAIL_VALUE
(a message value whose handling always raises), MW_TEST_CRASH_VALUE (one that
kills the worker), MW_TEST_STUCK_VALUE (one the handler hangs on),
MW_TEST_BOOT_FAILS=1 (on_worker_start raises), MW_TEST_ON_ERROR (dlq|release),
MW_TEST_SLOW_FORK (seconds every new worker sleeps right after its fork, before it
installs its SIGTERM handler: widens the window in which it ignores SIGTERM).
MW_TEST_FAIL_FROM (every value from this number on fails), MW_TEST_FAIL_VALUES (values that always fail,
comma-separated), MW_TEST_DLQ_LIMIT.
Shared partitions: MW_TEST_SHARED=1, MW_TEST_RANGE_SIZE, MW_TEST_ADAPTIVE_RANGES (0: fixed ranges), MW_TEST_PENDING_TIMEOUT,
MW_TEST_MAX_DELIVERIES.
Limits: MW_TEST_RATE_LIMIT (e.g. 50/s), MW_TEST_MAX_AGE (e.g. 1h), MW_TEST_ON_TOO_OLD (skip|dlq);
MW_TEST_CONCURRENCY (calls in flight per worker, on lanes).
"""

import os
import time

from marshal_workers import App, Message

app = App()
SINK = os.environ.get("MW_TEST_SINK", os.devnull)
DELAY = float(os.environ.get("MW_TEST_DELAY", "0"))
FAIL_VALUE = os.environ.get("MW_TEST_FAIL_VALUE", "").encode() or None
FAIL_FROM = int(os.environ.get("MW_TEST_FAIL_FROM", "-1"))
FAIL_VALUES = {v.encode() for v in os.environ.get("MW_TEST_FAIL_VALUES", "").split(",") if v}
CRASH_VALUE = os.environ.get("MW_TEST_CRASH_VALUE", "").encode() or None  # the worker process dies on it
STUCK_VALUE = os.environ.get("MW_TEST_STUCK_VALUE", "").encode() or None  # the handler hangs on it
BOOT_FAILS = os.environ.get("MW_TEST_BOOT_FAILS") == "1"
CLIENT = os.environ.get("MARSHAL_WORKERS_CLIENT_ID", "?")
SLOW_FORK = float(os.environ.get("MW_TEST_SLOW_FORK", "0"))
_sink = None

if SLOW_FORK:
    # This module is preloaded in the fork server, so this runs in every worker just after its fork,
    # while it still ignores SIGTERM as the fork server does.
    os.register_at_fork(after_in_child=lambda: time.sleep(SLOW_FORK))


@app.on_worker_start
def open_sink() -> None:
    global _sink
    if BOOT_FAILS:
        raise ConnectionError("the database is not there")
    _sink = open(SINK, "a", buffering=1)  # noqa: SIM115 - open for the worker's life; line-buffered: one append a line


@app.on_worker_stop
def close_sink() -> None:
    if _sink is not None:
        _sink.close()


def record(msg: Message) -> None:
    if (FAIL_VALUE is not None and msg.value == FAIL_VALUE) or msg.value in FAIL_VALUES:
        raise ValueError(f"cannot handle {msg.value!r}")
    if FAIL_FROM >= 0 and int(msg.value) >= FAIL_FROM:
        raise ConnectionError("the database is down")
    if CRASH_VALUE is not None and msg.value == CRASH_VALUE:
        os._exit(70)
    if STUCK_VALUE is not None and msg.value == STUCK_VALUE:
        time.sleep(3600)
    if DELAY:
        time.sleep(DELAY)
    assert _sink is not None
    _sink.write(f"{CLIENT} {os.getpid()} {msg.partition} {msg.offset} {msg.value.decode()} {time.time():.3f}\n")


def handle(msg: Message) -> None:
    record(msg)


def handle_batch(msgs: list) -> None:
    for msg in msgs:
        record(msg)


BATCH = os.environ.get("MW_TEST_BATCH") == "1"
app.handler(
    os.environ.get("MW_TEST_TOPIC", "test-topic"),
    mode=os.environ.get("MW_TEST_MODE", "alo"),
    batch=BATCH,
    batch_size=int(os.environ.get("MW_TEST_BATCH_SIZE", "50")),
    retries=2,
    retry_backoff="10ms",
    on_error=os.environ.get("MW_TEST_ON_ERROR", "dlq"),
    shared=os.environ.get("MW_TEST_SHARED") == "1",
    range_size=int(os.environ.get("MW_TEST_RANGE_SIZE", "100")),
    adaptive_ranges=os.environ.get("MW_TEST_ADAPTIVE_RANGES", "1") == "1",
    pending_timeout=os.environ.get("MW_TEST_PENDING_TIMEOUT", "60s"),
    max_deliveries=int(os.environ.get("MW_TEST_MAX_DELIVERIES", "5")),
    dlq_limit=int(os.environ.get("MW_TEST_DLQ_LIMIT", "0")),
    rate_limit=os.environ.get("MW_TEST_RATE_LIMIT") or None,
    max_age=os.environ.get("MW_TEST_MAX_AGE") or None,
    on_too_old=os.environ.get("MW_TEST_ON_TOO_OLD", "skip"),
    concurrency=int(os.environ.get("MW_TEST_CONCURRENCY", "1")),
)(handle_batch if BATCH else handle)
