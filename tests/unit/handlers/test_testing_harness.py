"""marshal_workers.testing: run_handler applies a handler's policy, limits and hooks in process, as a worker does."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from marshal_workers import App, Message, Retry, SoftTimeLimitExceeded
from marshal_workers.errors import ConfigError, TimeLimitExceeded
from marshal_workers.testing import make_message, run_app, run_handler


def test_make_message_gives_what_a_handler_reads() -> None:
    msg = make_message(
        {"id": 1},
        topic="orders",
        partition=3,
        offset=42,
        key="k",
        headers={"trace": "abc"},
        timestamp=1_700_000_000_000,
    )
    assert (msg.topic, msg.partition, msg.offset, msg.key, msg.json()) == ("orders", 3, 42, b"k", {"id": 1})
    assert (msg.headers, msg.timestamp, msg.attempt) == ([("trace", b"abc")], 1_700_000_000_000, 1)
    assert make_message("text").value == b"text" and make_message(b"\x00").timestamp is None
    with pytest.raises(TypeError, match="expected bytes"):
        make_message(3.5)  # type: ignore[arg-type]


def test_a_message_made_without_a_topic_is_on_the_handlers_topic_as_plain_values_are() -> None:
    app = App(group="g")
    seen: list[str] = []

    @app.handler("orders", retries=0)
    def handle(msg: Message) -> None:
        seen.append(msg.topic)
        if msg.value == b"bad":
            raise ValueError("bad")

    made, bad, plain, _named = run_handler(
        app, "orders", [make_message(b"ok"), make_message(b"bad"), b"ok", make_message(b"ok", topic="orders-eu")]
    )
    assert seen == ["orders", "orders", "orders", "orders-eu"], "a topic given is kept"
    assert made.message.topic == plain.message.topic == "orders"
    assert dict(bad.dead_letter_headers or [])["original_topic"] == b"orders"
    assert make_message(b"x").topic == "test", "outside run_handler, no handler's topic is known"


def test_the_quickstart_handler_counts_its_orders() -> None:
    from examples import quickstart

    before = dict(quickstart.totals)
    results = run_handler(quickstart.app, "orders", [{"amount": 2.5}, {"amount": 1}])
    assert [r.outcome for r in results] == ["done", "done"]
    assert quickstart.totals["orders"] == before["orders"] + 2 and quickstart.totals["amount"] == before["amount"] + 3.5


def test_a_negative_payment_is_retried_then_dead_lettered() -> None:
    from examples import amo_payments

    ok, negative = run_handler(amo_payments.app, "payments", [{"amount": 5}, {"amount": -1}], seed=3)
    assert ok.outcome == "done"
    assert (negative.outcome, negative.attempts, len(negative.delays)) == ("dead_letter", 4, 3)
    headers = dict(negative.dead_letter_headers or [])
    assert headers["error_type"] == b"ValueError" and headers["original_topic"] == b"payments"


def test_the_batch_sink_writes_batches_and_a_failing_batch_releases_its_partition(tmp_path: Path, monkeypatch) -> None:
    from examples import batch_sink

    monkeypatch.setattr(batch_sink, "SINK_DIR", tmp_path)
    messages = [make_message(f"e{i}", topic="events", partition=i % 2, offset=i // 2) for i in range(6)]
    assert {r.outcome for r in run_handler(batch_sink.app, "events", messages)} == {"done"}
    [written] = tmp_path.glob("events-*.jsonl")
    assert sorted(written.read_text().split()) == [f"e{i}" for i in range(6)], "on_worker_start opened the sink"

    # Without its worker's start (the sink closed by on_worker_stop above), every batch fails: past its retries,
    # on_error="release" gives the partition up at that batch, and the rest waits for the next owner.
    failed = run_handler(batch_sink.app, "events", messages, lifecycle=False)
    assert {r.outcome for r in failed} == {"released"} and {r.attempts for r in failed} == {4}

    monkeypatch.setattr(batch_sink, "SINK_DIR", tmp_path / "not-a-dir-file")
    (tmp_path / "not-a-dir-file").write_text("")  # the sink cannot be opened: on_worker_start fails, as a worker would
    with pytest.raises(FileExistsError):
        run_handler(batch_sink.app, "events", messages)


def test_on_error_release_stops_the_partition_and_leaves_the_rest_to_the_next_owner() -> None:
    app = App(group="g")

    @app.handler("t", on_error="release", retries=0)
    def handle(msg: Message) -> None:
        if msg.value == b"bad":
            raise ValueError("bad")

    values = [
        make_message(v, topic="t", partition=p, offset=o)
        for v, p, o in [("ok", 0, 0), ("bad", 0, 1), ("ok", 0, 2), ("ok", 1, 0)]
    ]
    assert [r.outcome for r in run_handler(app, "t", values)] == ["done", "released", "not_handled", "done"]


def test_time_limits_raise_inside_the_call_as_in_a_worker() -> None:
    app = App(group="g")
    seen: list[str] = []

    @app.handler("soft", soft_time_limit="50ms", time_limit="2s", retries=0)
    def cleans_up(msg: Message) -> None:
        try:
            time.sleep(1)
        except SoftTimeLimitExceeded:
            seen.append("cleaned up")

    @app.handler("hard", time_limit="50ms", retries=1, retry_backoff="1ms")
    def hangs(msg: Message) -> None:
        time.sleep(1)

    assert run_handler(app, "soft", [b"x"])[0].outcome == "done" and seen == ["cleaned up"]
    [hung] = run_handler(app, "hard", [b"x"])
    assert (hung.outcome, hung.attempts, type(hung.error)) == ("dead_letter", 2, TimeLimitExceeded)


def test_hooks_and_retries_run_as_in_a_worker_and_the_backoff_is_not_slept() -> None:
    app = App(group="g", time_limit=0)
    calls: list[str] = []
    app.on_worker_start(lambda: calls.append("start"))
    app.on_partition_claimed(lambda topic, partition: calls.append(f"claimed {partition}"))
    app.before_message(lambda msg: calls.append(f"before {msg.attempt}"))
    app.after_message(lambda msg, outcome, error, seconds: calls.append(f"after {outcome}"))
    app.on_dead_letter(lambda msg, error: calls.append("dead"))
    app.on_partition_released(lambda topic, partition: calls.append(f"released {partition}"))
    app.on_worker_stop(lambda: calls.append("stop"))

    @app.handler("t", retries=5)
    async def handle(msg: Message) -> None:
        if msg.attempt < 3:
            raise Retry(delay="1h")

    began = time.monotonic()
    [result] = run_handler(app, "t", [b"x"])
    assert time.monotonic() - began < 5 and result.delays == [3600.0, 3600.0]
    assert (result.outcome, result.attempts) == ("done", 3)
    assert calls == [
        "start",
        "claimed 0",
        "before 1",
        "after retry",
        "before 2",
        "after retry",
        "before 3",
        "after done",
        "released 0",
        "stop",
    ]
    with pytest.raises(ConfigError, match="no handler for topic 'nope'"):
        run_handler(app, "nope", [b"x"])


def test_what_a_handler_sends_is_captured_retries_included() -> None:
    app = App(group="g")

    @app.handler("orders", retries=1, retry_backoff="1ms")
    def handle(msg: Message) -> None:
        app.send("invoices", {"order": msg.json()["id"]}, key=str(msg.json()["id"]))
        if msg.attempt == 1:
            raise ConnectionError("the ledger hiccuped after sending")

    [result] = run_handler(app, "orders", [{"id": 9}])
    assert (result.outcome, result.attempts) == ("done", 2)
    assert result.sent == [("invoices", b'{"order":9}', b"9", None)] * 2, "a retry sends again, as in a worker"
    assert app.outbox is None, "outside run_handler, app.send is refused again"


def test_messages_older_than_max_age_are_skipped_or_dead_lettered_without_a_call() -> None:
    app = App(group="g")
    called: list[int] = []
    app.handler("skip", max_age="1h")(lambda msg: called.append(msg.offset))
    app.handler("dlq", max_age="1h", on_too_old="dlq")(lambda msg: called.append(msg.offset))
    now_ms = int(time.time() * 1000)
    for topic, outcome in (("skip", "too_old"), ("dlq", "dead_letter")):
        old = make_message(b"x", topic=topic, offset=0, timestamp=now_ms - 2 * 3_600_000)
        fresh = make_message(b"y", topic=topic, offset=1, timestamp=now_ms)
        assert [r.outcome for r in run_handler(app, topic, [old, fresh])] == [outcome, "done"]
    assert called == [1, 1], "an old message is never handed to the handler"
    [dead] = run_handler(app, "dlq", [make_message(b"x", topic="dlq", timestamp=1)])
    assert dict(dead.dead_letter_headers or [])["error_type"] == b"MessageTooOld"


class Invoice(msgspec.Struct):
    order_id: int
    amount: float


def test_a_typed_batch_with_one_bad_payload_dead_letters_only_that_one_as_a_worker_does() -> None:
    """Messages made without offsets all carry offset 0: they are still told apart (issue 40, item 1)."""
    app = App(group="g")
    handled: list[int] = []

    @app.handler("invoices", batch=True)
    def handle(invoices: list[Invoice]) -> None:
        handled.extend(i.order_id for i in invoices)

    results = run_handler(
        app,
        "invoices",
        [make_message(Invoice(1, 9.5)), make_message(b'{"order_id":"x"}'), make_message(Invoice(3, 2.0))],
    )
    assert [r.outcome for r in results] == ["done", "dead_letter", "done"] and handled == [1, 3]
    assert dict(results[1].dead_letter_headers or [])["error_type"] == b"PayloadError"


def test_dlq_limit_releases_the_partition_after_that_many_dead_letters_in_a_row_as_a_worker_does() -> None:
    app = App(group="g")

    @app.handler("t", retries=0, dlq_limit=2)
    def handle(msg: Message) -> None:
        raise ValueError("the ledger is down")

    outcomes = [r.outcome for r in run_handler(app, "t", [b"a", b"b", b"c", b"d"])]
    assert outcomes == ["dead_letter", "dead_letter", "released", "not_handled"]


# ------------------------------------------------------------------ run_app: a whole app in process


def test_run_app_hands_what_a_retried_call_sent_on_twice_as_a_worker_would() -> None:

    app = App(group="g")
    calls: list[int] = []

    @app.handler("orders", retries=1, retry_backoff="1ms")
    def on_order(msg: Message) -> None:
        calls.append(msg.offset)
        app.send("invoices", msg.value)
        if len(calls) == 1:
            raise ConnectionError("db blip: retried")

    @app.handler("invoices")
    def on_invoice(msg: Message) -> None: ...

    run = run_app(app, {"orders": [b"o-1"]})
    assert run.outcomes("orders") == ["done"] and calls == [0, 0]
    assert [r.message.offset for r in run.results_of("invoices")] == [0, 1], "sent twice, told apart by offset"
    assert all(s.sent_by.topic == "orders" and s.handled for s in run.sent)


def test_run_app_refuses_an_unknown_topic_and_stops_a_loop() -> None:

    app = App(group="g")

    @app.handler("ping")
    def on_ping(msg: Message) -> None:
        app.send("pong", msg.value)

    @app.handler("pong")
    def on_pong(msg: Message) -> None:
        app.send("ping", msg.value)

    with pytest.raises(ConfigError, match="no handler for 'nosuch'"):
        run_app(app, {"nosuch": [b"x"]})
    with pytest.raises(ConfigError, match="still send to each other after 5 rounds"):
        run_app(app, {"ping": [b"x"]}, max_rounds=5)
