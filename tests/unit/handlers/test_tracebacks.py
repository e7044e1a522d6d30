"""A failed handler call's traceback: in its one log line (failure_logs.py), in its dead letter's bounded header
(dead_letter_writer.py), in the testing harness's result, and carried back by the executors; the SIGUSR2 heading."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from polling import poll_until

from marshal_workers import App, Message, Reject
from marshal_workers.core.logs import JsonFormatter, TextFormatter, partition_log
from marshal_workers.errors import SoftTimeLimitExceeded, WorkerLost
from marshal_workers.handlers.failure_logs import (
    apart_from,
    log_dead_letter,
    log_ignored,
    log_left_for_later,
    log_release,
    log_retry,
)
from marshal_workers.kafka.dead_letter_writer import (
    TRACEBACK_HEADER,
    TRACEBACK_MAX_BYTES,
    bounded_traceback,
    error_headers,
    traceback_text,
)
from marshal_workers.runtime.worker.executors import AsyncExecutor, Executor, ThreadExecutor
from marshal_workers.runtime.worker.stack_dumps import worker_heading
from marshal_workers.testing import FakeRecord, make_message, run_handler


def check_order(order: dict[str, Any]) -> None:
    if "amount" not in order:
        raise ValueError("an order without an amount")


def raised_in_check_order() -> ValueError:
    try:
        check_order({})
    except ValueError as exc:
        return exc
    raise AssertionError("check_order did not raise")


def ping(depth: int) -> None:
    if depth == 0:
        raise RuntimeError("the bottom of a deep stack")
    pong(depth - 1)


def pong(depth: int) -> None:
    ping(depth)  # two functions in turn: Python shortens a run of the same frame, not this


RECORD = FakeRecord("orders", 3, 42)

# ------------------------------------------------------------------ the dead letter's header


@given(st.text(max_size=3000), st.integers(min_value=80, max_value=2000))
def test_a_bounded_traceback_fits_its_bound_and_keeps_the_end_of_the_text(text: str, limit: int) -> None:
    data = text.encode("utf-8", "backslashreplace")
    bounded = bounded_traceback(text, limit)
    kept = bounded.decode("utf-8")  # whole characters: never one cut in two
    assert len(bounded) <= limit
    if len(data) <= limit:
        assert bounded == data, "one that fits is kept whole, without a marker"
        return
    marker, _, tail = kept.partition(" cut ...]\n")
    assert data.endswith(tail.encode()), "what is kept is the end: the innermost frames and the error"
    cut = int(marker.removeprefix("[... the first ").removesuffix(" bytes of the traceback"))
    assert cut + len(tail.encode()) == len(data), "the marker says how much was cut"


def test_a_dead_letter_carries_the_traceback_of_the_error_with_the_function_that_raised_it() -> None:
    headers = dict(error_headers("on_order", RECORD, raised_in_check_order()))
    text = headers[TRACEBACK_HEADER].decode()
    assert text.startswith("Traceback (most recent call last):")
    assert "in check_order" in text and text.endswith("ValueError: an order without an amount\n")
    assert (headers["error_type"], headers["original_offset"]) == (b"ValueError", b"42"), "the others are still there"


def test_a_deep_traceback_keeps_its_innermost_frames_within_8_kib() -> None:
    try:
        ping(300)
    except RuntimeError as exc:
        error = exc
    whole = traceback_text(error)
    assert whole is not None and len(whole.encode()) > 4 * TRACEBACK_MAX_BYTES
    header = dict(error_headers("h", RECORD, error))[TRACEBACK_HEADER]
    assert len(header) <= TRACEBACK_MAX_BYTES == 8192
    text = header.decode()
    marker, after = text.split("\n", 1)
    assert marker.startswith("[... the first ") and marker.endswith(" bytes of the traceback cut ...]")
    assert whole.endswith("\n" + after), "the end, from a line's start"
    assert text.endswith(
        '    raise RuntimeError("the bottom of a deep stack")\nRuntimeError: the bottom of a deep stack\n'
    )


def test_an_error_never_raised_has_no_traceback_header() -> None:
    made_up = WorkerLost("the worker died on it 3 times in a row")  # a message never handed to the handler
    assert TRACEBACK_HEADER not in dict(error_headers("h", RECORD, made_up))
    assert traceback_text(made_up) is None


# ------------------------------------------------------------------ the testing harness


def harness_app(**options: Any) -> App:
    app = App(group="g")

    @app.handler("orders", retries=1, retry_backoff="1ms", **options)
    def on_order(msg: Message) -> None:
        order = msg.json()
        if order.get("reject"):
            raise Reject("not an order")
        check_order(order)

    return app


def test_the_harness_returns_the_traceback_of_a_dead_lettered_message_and_its_header() -> None:
    ok, failed, rejected = run_handler(harness_app(), "orders", [{"amount": 1}, {}, {"reject": True}])
    assert (ok.outcome, ok.traceback) == ("done", None)
    assert failed.outcome == "dead_letter" and failed.attempts == 2
    assert failed.traceback is not None and "in check_order" in failed.traceback
    assert failed.traceback.endswith("ValueError: an order without an amount\n")
    assert dict(failed.dead_letter_headers or [])[TRACEBACK_HEADER] == failed.traceback.encode()
    assert rejected.outcome == "dead_letter" and "raise Reject" in (rejected.traceback or "")


def test_the_harness_returns_the_traceback_of_a_release() -> None:
    [released] = run_handler(harness_app(on_error="release"), "orders", [make_message({}, topic="orders")])
    assert released.outcome == "released" and "in check_order" in (released.traceback or "")
    assert released.dead_letter_headers is None


def test_a_message_too_old_has_no_traceback() -> None:
    [old] = run_handler(
        harness_app(max_age="1s", on_too_old="dlq"), "orders", [make_message({}, topic="orders", timestamp=1)]
    )
    assert old.outcome == "dead_letter" and old.traceback is None
    assert TRACEBACK_HEADER not in dict(old.dead_letter_headers or [])


# ------------------------------------------------------------------ the log line of a failure

LOG = partition_log(logging.getLogger("marshal_workers.runtime.worker.worker"), "billing", "orders", 3)


def logged(caplog: pytest.LogCaptureFixture, write: Any) -> logging.LogRecord:
    """The one record ``write()`` logs."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="marshal_workers"):
        write()
    [record] = caplog.records
    return record


@pytest.mark.parametrize(
    ("write", "level", "says"),
    [
        (lambda e: log_retry(LOG, "on_order", 42, e, 1, 0.25), logging.WARNING, "retry 1 in 0.25s"),
        (
            lambda e: log_left_for_later(LOG, "on_order", 42, e, "delivery 1 of 5, it will be delivered again"),
            logging.WARNING,
            "it will be delivered again",
        ),
        (
            lambda e: log_dead_letter(LOG, "on_order", 42, e, 1, "orders.dlq"),
            logging.ERROR,
            "sent 1 message(s) to orders.dlq",
        ),
        (lambda e: log_release(LOG, "on_order", 42, e), logging.ERROR, "releasing the partition"),
    ],
)
def test_a_failure_is_one_line_at_the_level_of_its_outcome_with_its_traceback(
    caplog: pytest.LogCaptureFixture, write: Any, level: int, says: str
) -> None:
    error = raised_in_check_order()
    record = logged(caplog, lambda: write(error))
    assert record.levelno == level and says in record.getMessage()
    assert "handler on_order failed at offset 42 (ValueError('an order without an amount'))" in record.getMessage()
    fields = (record.group, record.topic, record.partition, record.offset)  # type: ignore[attr-defined]
    assert fields == ("billing", "orders", 3, 42)
    assert record.exc_info is not None and record.exc_info[1] is error

    text = TextFormatter().format(record)
    first, *rest = text.splitlines()
    assert f" {logging.getLevelName(level)} " in first and "group billing orders[3]: handler on_order failed" in first
    assert rest[0] == "Traceback (most recent call last):" and "in check_order" in text
    assert rest[-1] == "ValueError: an order without an amount"
    line = json.loads(JsonFormatter().format(record))
    assert (line["group"], line["topic"], line["partition"], line["offset"]) == ("billing", "orders", 3, 42)
    assert "in check_order" in line["exception"]


def test_a_retry_made_while_the_first_failure_is_handled_keeps_a_traceback_of_its_own() -> None:
    first = raised_in_check_order()
    try:
        raise first
    except (
        ValueError
    ):  # a worker's loop calls Failures.recover here: its retries run while the first failure is handled
        retried = raised_in_check_order()
        try:
            try:
                {}["amount"]
            except KeyError as own:
                raise ValueError("no amount") from own
        except ValueError as exc:
            chained = exc
    assert retried.__context__ is first, "Python chains it to the first failure"
    text = traceback_text(apart_from(retried, first)) or ""
    assert text.count("Traceback (most recent call last):") == 1 and "During handling" not in text
    own_chain = traceback_text(apart_from(chained, first)) or ""
    assert "KeyError: 'amount'" in own_chain and "ValueError: no amount" in own_chain, "the handler's own chain stays"
    assert "an order without an amount" not in own_chain


def test_an_ignored_message_and_an_error_never_raised_are_logged_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ignored = logged(caplog, lambda: log_ignored(LOG, "on_order", 7, raised_in_check_order()))
    assert (ignored.levelno, ignored.exc_info, ignored.offset) == (logging.INFO, None, 7)  # type: ignore[attr-defined]
    lost = logged(caplog, lambda: log_dead_letter(LOG, "on_order", 7, WorkerLost("died"), 1, "orders.dlq"))
    assert lost.levelno == logging.ERROR and lost.exc_info is None
    assert "Traceback" not in TextFormatter().format(lost)


# ------------------------------------------------------------------ the executors keep the traceback


def completed_error(executor: Executor, argument: Any) -> BaseException:
    try:
        executor.submit([(0, argument)])
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the call did not finish"
            executor.enforce_soft_limit(time.monotonic())
            done = executor.wait(0.01)
            if done:
                assert done[0].error is not None
                return done[0].error
    finally:
        executor.close()


def test_a_call_on_a_thread_or_a_task_brings_back_its_traceback() -> None:
    async def on_order_async(order: dict[str, Any]) -> None:
        check_order(order)

    for executor in (ThreadExecutor(check_order, 2, 0.0), AsyncExecutor(on_order_async, 0.0)):
        text = traceback_text(completed_error(executor, {}))
        assert text is not None and "in check_order" in text, text


def test_an_async_call_past_its_soft_time_limit_says_where_it_was() -> None:
    async def waits_for_the_payment_provider(_: Any) -> None:
        await asyncio.sleep(30)

    error = completed_error(AsyncExecutor(waits_for_the_payment_provider, 0.05), None)
    assert isinstance(error, SoftTimeLimitExceeded)
    text = traceback_text(error)
    assert text is not None and "in waits_for_the_payment_provider" in text, text


# ------------------------------------------------------------------ SIGUSR2


def test_the_stack_dump_heading_says_whose_stacks_follow() -> None:
    assert worker_heading(4242, "billing", "orders", 3, "at offset 1207") == (
        "SIGUSR2: stacks of worker pid 4242, group billing, topic orders partition 3, at offset 1207:"
    )
    assert worker_heading(7, "billing", "orders", None, "shared worker #0, between ranges") == (
        "SIGUSR2: stacks of worker pid 7, group billing, topic orders, shared worker #0, between ranges:"
    )


STUCK = """
import sys, threading, time
from marshal_workers.runtime.worker.stack_dumps import dump_stacks_on_sigusr2

dump_stacks_on_sigusr2(lambda: "HEADING of the test")

def stuck_in_a_call():
    print("ready", flush=True)
    time.sleep(60)

stuck_in_a_call()
"""


def test_sigusr2_writes_the_heading_then_the_stack_of_a_call_stuck_in_the_main_thread() -> None:
    process = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == b"ready\n"
        os.set_blocking(process.stderr.fileno(), False)
        dumped = [b""]

        def dumps(count: int) -> bool:
            assert process.poll() is None, "SIGUSR2 must not end the process"
            dumped[0] += process.stderr.read() or b""  # type: ignore[union-attr]
            return dumped[0].count(b"in stuck_in_a_call") >= count

        process.send_signal(signal.SIGUSR2)
        poll_until(lambda: dumps(1), what="the first dump")
        process.send_signal(signal.SIGUSR2)  # again: a dump each time, and the process goes on
        poll_until(lambda: dumps(2), what="the second dump")
        text = dumped[0].decode()
        assert text.startswith("HEADING of the test\n") and text.count("HEADING of the test\n") == 2
        assert text.index("HEADING") < text.index("in stuck_in_a_call")
    finally:
        process.kill()
        process.wait(timeout=10)
