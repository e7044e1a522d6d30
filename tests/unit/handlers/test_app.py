"""The App object and the Message wrapper handlers see (docs/handlers.md)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fake_record import FakeRecord

from marshal_workers import App, Message
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.app import FetchedMessage, HandlerSpec, Mode, OnError

# ------------------------------------------------------------------- App()


def test_app_keeps_group_and_settings() -> None:
    app = App(group="billing.invoices", max_partitions=2, heartbeat_interval="3s")
    assert app.group == "billing.invoices"
    assert app.settings == {"group": "billing.invoices", "max_partitions": 2, "heartbeat_interval": "3s"}


def test_app_without_group_has_none() -> None:
    app = App(brokers="k1:9092")
    assert app.group is None
    assert app.settings == {"brokers": "k1:9092"}


def test_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown_setting"):
        App(group="g", unknown_setting=1)


def test_new_app_has_no_handlers_and_no_hooks() -> None:
    app = App(group="g")
    assert app.handlers == {}
    assert list(app.topics) == []
    assert app.worker_start_hooks == []
    assert app.worker_stop_hooks == []


# ---------------------------------------------------------------- handlers


def test_handler_registers_a_spec_with_the_defaults() -> None:
    app = App(group="g")

    @app.handler("orders")
    def on_order(msg: Any) -> None:
        pass

    spec = app.handlers["orders"]
    assert isinstance(spec, HandlerSpec)
    assert spec.topic == "orders"
    assert spec.function is on_order
    assert spec.mode is Mode.ALO
    assert spec.mode == "alo"
    assert spec.batch is False
    assert spec.batch_size == 500
    assert spec.retries == 3
    assert spec.retry_backoff == pytest.approx(0.1)
    assert spec.on_error is OnError.DLQ
    assert spec.on_error == "dlq"
    assert spec.dlq_topic == "orders.dlq"
    assert spec.name == f"{__name__}.test_handler_registers_a_spec_with_the_defaults.<locals>.on_order"


def test_handler_options_are_kept() -> None:
    app = App(group="g")

    @app.handler("payments", mode="amo", batch=True, batch_size=50, retries=0, retry_backoff=2, on_error="release")
    def on_payments(msgs: Any) -> None:
        pass

    spec = app.handlers["payments"]
    assert (spec.mode, spec.batch, spec.batch_size, spec.retries, spec.retry_backoff, spec.on_error) == (
        Mode.AMO,
        True,
        50,
        0,
        2.0,
        OnError.RELEASE,
    )
    assert spec.dlq_topic == "payments.dlq"


def test_decorator_returns_the_function_unchanged() -> None:
    app = App(group="g")

    def double(msg: int) -> int:
        return msg * 2

    decorated = app.handler("orders")(double)
    assert decorated is double
    assert decorated(21) == 42


def test_registering_the_same_function_twice_is_refused() -> None:
    app = App(group="g")

    def on_order(msg: Any) -> None:
        pass

    app.handler("orders")(on_order)
    with pytest.raises(ConfigError, match="already registered"):
        app.handler("orders")(on_order)
    assert app.handlers["orders"].function is on_order


def test_second_handler_for_a_topic_is_refused_naming_the_first() -> None:
    app = App(group="g")

    @app.handler("orders")
    def first_handler(msg: Any) -> None:
        pass

    def second_handler(msg: Any) -> None:
        pass

    with pytest.raises(ConfigError, match="first_handler") as info:
        app.handler("orders")(second_handler)
    assert "orders" in str(info.value)
    assert app.handlers["orders"].function is first_handler, "the refused handler must not replace the first"


def test_the_same_function_may_serve_two_topics() -> None:
    app = App(group="g")

    def on_any(msg: Any) -> None:
        pass

    app.handler("orders")(on_any)
    app.handler("refunds")(on_any)
    assert app.handlers["orders"].function is on_any
    assert app.handlers["refunds"].function is on_any


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("mode", "exactly-once"),
        ("mode", "ALO "),
        ("mode", ""),
        ("on_error", "ignore"),
        ("on_error", ""),
        ("batch_size", 0),
        ("batch_size", -1),
        ("batch_size", True),
        ("batch_size", "5"),
        ("batch_size", 2.5),
        ("retries", -1),
        ("retries", True),
        ("retries", "3"),
    ],
)
def test_bad_handler_options_are_refused_naming_the_topic_and_option(option: str, value: Any) -> None:
    app = App(group="g")
    with pytest.raises(ConfigError, match="invoices-topic") as info:
        app.handler("invoices-topic", **{option: value})
    assert option in str(info.value)
    assert app.handlers == {}


@pytest.mark.parametrize("topic", ["", None, 42])
def test_handler_without_a_topic_name_is_refused(topic: Any) -> None:
    app = App(group="g")
    with pytest.raises(ConfigError, match="topic"):
        app.handler(topic)
    assert app.handlers == {}


@pytest.mark.parametrize(("value", "seconds"), [("250ms", 0.25), ("2s", 2.0), (1, 1.0), (0.5, 0.5)])
def test_retry_backoff_accepts_durations_and_numbers(value: Any, seconds: float) -> None:
    app = App(group="g")
    app.handler("orders", retry_backoff=value)(lambda msg: None)
    assert app.handlers["orders"].retry_backoff == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "-1s", 0, True])
def test_bad_retry_backoff_is_refused_naming_the_topic_and_option(value: Any) -> None:
    app = App(group="g")
    with pytest.raises(ConfigError) as info:
        app.handler("invoices-topic", retry_backoff=value)
    assert app.handlers == {}
    # Like every other handler option, the message should say which handler and which option is wrong.
    assert "invoices-topic" in str(info.value)
    assert "retry_backoff" in str(info.value)


def test_topics_are_sorted() -> None:
    app = App(group="g")
    for topic in ["payments", "audit", "orders", "Zeta"]:
        app.handler(topic)(lambda msg: None)
    assert list(app.topics) == ["Zeta", "audit", "orders", "payments"]


def test_repr_names_group_and_topics() -> None:
    app = App(group="billing")
    app.handler("orders")(lambda msg: None)
    assert "billing" in repr(app)
    assert "orders" in repr(app)


# ------------------------------------------------------------------- hooks


def test_worker_hooks_are_kept_in_order_and_returned_unchanged() -> None:
    app = App(group="g")
    calls: list[str] = []

    @app.on_worker_start
    def open_db() -> str:
        calls.append("open_db")
        return "db"

    @app.on_worker_start
    def open_cache() -> None:
        calls.append("open_cache")

    @app.on_worker_stop
    def close_cache() -> None:
        calls.append("close_cache")

    @app.on_worker_stop
    def close_db() -> None:
        calls.append("close_db")

    assert app.worker_start_hooks == [open_db, open_cache]
    assert app.worker_stop_hooks == [close_cache, close_db]
    assert open_db() == "db"  # still the plain function
    assert calls == ["open_db"]


# ----------------------------------------------------------------- Message


def test_message_exposes_the_record() -> None:
    headers = [("trace-id", b"abc"), ("source", b"web")]
    msg = Message(FakeRecord(headers=headers))
    assert msg.topic == "orders"
    assert msg.partition == 3
    assert msg.offset == 1234
    assert msg.key == b"k-1"
    assert msg.value == b'{"id": 7, "items": ["a", "b"]}'
    assert msg.headers == headers
    assert msg.timestamp == 1_700_000_000_123


@pytest.mark.parametrize("value", [b'{"id": 7, "items": ["a", "b"]}', None])
def test_a_fetched_message_reads_as_the_message_of_its_record(value: bytes | None) -> None:
    """What the workers' loops give handlers (its topic, partition, offset and value read once) is a Message
    that answers every question as the lazy one does."""
    record = FakeRecord(headers=[("trace-id", b"abc")], value=value)
    lazy = Message(record, attempt=1)
    fetched = FetchedMessage(record, 1, record.topic(), record.partition(), record.offset(), record.value())
    assert isinstance(fetched, Message)
    for attribute in ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "attempt"):
        assert getattr(fetched, attribute) == getattr(lazy, attribute), attribute
    assert repr(fetched) == repr(lazy) == "Message(orders[3]@1234)"
    assert fetched.with_body("decoded").offset == 1234
    if value is None:
        with pytest.raises(orjson.JSONDecodeError):
            fetched.json()
    else:
        assert fetched.json() == lazy.json()


def test_message_with_no_key_and_no_value() -> None:
    msg = Message(FakeRecord(key=None, value=None))
    assert msg.key is None
    assert msg.value is None


def test_message_headers_none_is_an_empty_list() -> None:
    assert Message(FakeRecord(headers=None)).headers == []


@pytest.mark.parametrize("kind", [1, 2])  # TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
def test_message_timestamp_of_either_kind_is_milliseconds(kind: int) -> None:
    assert Message(FakeRecord(timestamp=(kind, 42_000))).timestamp == 42_000


def test_message_timestamp_not_available_is_none() -> None:
    assert Message(FakeRecord(timestamp=(0, -1))).timestamp is None  # TIMESTAMP_NOT_AVAILABLE


def test_message_json_parses_the_value() -> None:
    assert Message(FakeRecord()).json() == {"id": 7, "items": ["a", "b"]}
    assert Message(FakeRecord(value=b"[1, 2.5, null, true]")).json() == [1, 2.5, None, True]
    assert Message(FakeRecord(value='{"name": "żółw"}'.encode())).json() == {"name": "żółw"}


@pytest.mark.parametrize("value", [b"not json", b'{"id": 7', b""])
def test_message_json_of_invalid_json_raises(value: bytes) -> None:
    msg = Message(FakeRecord(value=value))
    with pytest.raises(orjson.JSONDecodeError):
        msg.json()
    with pytest.raises(ValueError):  # JSONDecodeError is a ValueError, as with the json module
        msg.json()


def test_message_repr_names_topic_partition_offset() -> None:
    msg = Message(FakeRecord(topic="payments", partition=5, offset=99))
    assert "payments[5]@99" in repr(msg)


# ------------------------------------------------------------ time limits


def test_handler_time_limits_override_the_settings() -> None:
    from marshal_workers.core.config import Settings
    from marshal_workers.handlers.app import effective_time_limits

    app = App()
    app.handler("a", soft_time_limit="2s", time_limit="1m")(lambda m: None)
    app.handler("b")(lambda m: None)
    app.handler("c", time_limit=0)(lambda m: None)
    settings = Settings(soft_time_limit=5.0, time_limit=30.0)
    assert effective_time_limits(app.handlers["a"], settings) == (2.0, 60.0)
    assert effective_time_limits(app.handlers["b"], settings) == (5.0, 30.0)
    assert effective_time_limits(app.handlers["c"], Settings()) == (0.0, 0.0)


def test_a_soft_limit_not_shorter_than_the_hard_one_is_refused() -> None:
    from marshal_workers.core.config import Settings
    from marshal_workers.handlers.app import effective_time_limits

    app = App()
    app.handler("a", soft_time_limit="30s", time_limit="30s")(lambda m: None)
    with pytest.raises(ConfigError, match="'a'.*soft_time_limit.*shorter than time_limit"):
        effective_time_limits(app.handlers["a"], Settings())


@pytest.mark.parametrize("value", ["soon", -1, "5 parsecs", True])
def test_bad_time_limits_are_refused_naming_the_topic(value: Any) -> None:
    with pytest.raises(ConfigError, match="'orders'.*time_limit"):
        App().handler("orders", time_limit=value)


# ------------------------------------------------------------- concurrency


def test_concurrency_defaults_to_key_ordering_and_a_window_with_room_behind_a_slow_message() -> None:
    app = App(group="g")

    @app.handler("emails", concurrency=64)
    def send(msg: Message) -> None: ...

    spec = app.handlers["emails"]
    assert (spec.concurrency, spec.ordering.value, spec.window) == (64, "key", 1024)
    assert spec.runs_on_lanes and not spec.is_async


def test_an_async_handler_runs_on_lanes_even_one_at_a_time() -> None:
    app = App(group="g")

    @app.handler("pushes")
    async def push(msg: Message) -> None: ...

    spec = app.handlers["pushes"]
    assert spec.is_async and spec.runs_on_lanes
    assert (spec.concurrency, spec.ordering.value) == (1, "partition")


def test_a_plain_handler_keeps_the_one_call_loop() -> None:
    app = App(group="g")
    app.handler("orders")(lambda msg: None)
    assert not app.handlers["orders"].runs_on_lanes


def test_a_batch_handler_counts_batches_in_flight_and_needs_a_window_for_them() -> None:
    app = App(group="g")
    app.handler("audit", batch=True, batch_size=100, concurrency=8)(lambda msgs: None)
    spec = app.handlers["audit"]
    assert (spec.ordering.value, spec.lane_capacity) == ("none", 800)
    assert spec.window >= 800


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"concurrency": 0}, "concurrency must be a whole number in"),
        ({"concurrency": True}, "concurrency must be a whole number in"),
        ({"concurrency": "8"}, "concurrency must be a whole number in"),
        ({"ordering": "key"}, "ordering='key' needs concurrency > 1"),
        ({"ordering": "none"}, "ordering='none' needs concurrency > 1"),
        ({"concurrency": 8, "ordering": "partition"}, "ordering='partition' runs one message at a time"),
        ({"concurrency": 8, "ordering": "random"}, "ordering must be 'key', 'none' or 'partition'"),
        ({"concurrency": 8, "window": 4}, r"window must be a whole number in \[8, 8192\]"),
        ({"concurrency": 8, "window": 10_000}, r"window must be a whole number in \[8, 8192\]"),
        ({"concurrency": 8, "mode": "amo", "window": 100}, "and an AMO claim of batch_size"),
        ({"concurrency": 8, "batch": True, "ordering": "key"}, "a batch handler cannot keep key order"),
        ({"concurrency": 100, "batch": True}, "lower batch_size or concurrency"),
    ],
)
def test_wrong_concurrency_options_are_refused_with_what_to_do(options: dict[str, Any], says: str) -> None:
    app = App(group="g")
    with pytest.raises(ConfigError, match=says):
        app.handler("t", **options)(lambda msg: None)


def test_async_batch_handlers_and_async_generators_are_refused() -> None:
    app = App(group="g")

    async def batch(msgs: list[Message]) -> None: ...

    async def generator(msg: Message):  # type: ignore[no-untyped-def]
        yield msg

    with pytest.raises(ConfigError, match="async def batch handler is not supported"):
        app.handler("a", batch=True)(batch)
    with pytest.raises(ConfigError, match="async generator is not supported"):
        app.handler("b")(generator)


def test_shared_handler_options_are_checked_with_what_to_do() -> None:
    app = App(group="g")
    with pytest.raises(ConfigError, match="drop batch/concurrency and raise --processes"):
        app.handler("a", shared=True, concurrency=4)(lambda msg: None)
    with pytest.raises(ConfigError, match="drop batch/concurrency"):
        app.handler("b", shared=True, batch=True)(lambda msgs: None)
    with pytest.raises(ConfigError, match="on_error='release'"):
        app.handler("c", shared=True, on_error="release")(lambda msg: None)
    with pytest.raises(ConfigError, match="range_size must be a whole number"):
        app.handler("d", shared=True, range_size=0)(lambda msg: None)
    with pytest.raises(ConfigError, match="pending_timeout must be between 1s and 24h"):
        app.handler("e", shared=True, pending_timeout="100ms")(lambda msg: None)
    with pytest.raises(ConfigError, match="max_deliveries must be a whole number >= 1"):
        app.handler("f", shared=True, max_deliveries=0)(lambda msg: None)
    app.handler("g", shared=True, pending_timeout="2m")(lambda msg: None)
    assert (app.handlers["g"].shared, app.handlers["g"].pending_timeout, app.handlers["g"].range_size) == (
        True,
        120.0,
        100,
    )


def test_dlq_limit_is_a_whole_number_and_not_for_shared_handlers() -> None:
    app = App(group="g")
    with pytest.raises(ConfigError, match="dlq_limit must be a whole number >= 0"):
        app.handler("a", dlq_limit=-1)(lambda msg: None)
    with pytest.raises(ConfigError, match="a shared handler never holds"):
        app.handler("b", shared=True, dlq_limit=3)(lambda msg: None)
    app.handler("c", dlq_limit=3)(lambda msg: None)
    assert app.handlers["c"].dlq_limit == 3 and App(group="g").handler("d")(lambda m: None) is not None


def test_shared_ranges_adapt_by_default_and_a_fixed_size_is_asked_for_with_adaptive_ranges_false() -> None:
    app = App(group="g")
    app.handler("a", shared=True, range_size=500)(lambda msg: None)
    app.handler("b", shared=True, range_size=500, adaptive_ranges=False)(lambda msg: None)
    assert [(h.range_size, h.adaptive_ranges) for h in app.handlers.values()] == [(500, True), (500, False)]
    with pytest.raises(ConfigError, match=r"adaptive_ranges must be True .* or False \(every range range_size"):
        app.handler("c", shared=True, adaptive_ranges="no")(lambda msg: None)  # type: ignore[arg-type]
