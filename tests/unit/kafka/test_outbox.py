"""app.send: its arguments, where it may be called, and the outbox's flush (on a fake producer; no broker)."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from marshal_workers import App
from marshal_workers.core.config import Settings
from marshal_workers.errors import SendError
from marshal_workers.kafka.outbox import Outbox, encode_send

# ------------------------------------------------------------ arguments


def test_str_values_and_keys_are_sent_as_utf8() -> None:
    assert encode_send("out", "héllo", key="k1") == ("out", "héllo".encode(), b"k1", None)


def test_bytes_are_sent_as_they_are() -> None:
    assert encode_send("out", b"\x00\xff", key=b"\x01") == ("out", b"\x00\xff", b"\x01", None)
    assert encode_send("out", bytearray(b"ab"), key=memoryview(b"cd")) == ("out", b"ab", b"cd", None)


def test_dicts_and_lists_are_sent_as_json() -> None:
    _, value, _, _ = encode_send("out", {"id": 7, "tags": ["a"]})
    assert orjson.loads(value) == {"id": 7, "tags": ["a"]}
    assert encode_send("out", [1, 2])[1] == b"[1,2]"


def test_none_is_a_tombstone() -> None:
    assert encode_send("out", None, key="k") == ("out", None, b"k", None)


def test_headers_as_a_dict_or_pairs_with_str_or_bytes_values() -> None:
    expected = [("trace", b"t-1"), ("raw", b"\x00")]
    assert encode_send("out", b"v", headers={"trace": "t-1", "raw": b"\x00"})[3] == expected
    assert encode_send("out", b"v", headers=[("trace", "t-1"), ("raw", b"\x00")])[3] == expected
    assert encode_send("out", b"v", headers=[("same", b"1"), ("same", b"2")])[3] == [("same", b"1"), ("same", b"2")]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", b"v"), "topic must be a non-empty str"),
        ((b"out", b"v"), "topic must be a non-empty str"),
        (("out", 42), "value must be bytes, str or a dict or list"),
        (("out", {"when": object()}), "cannot be serialised as JSON"),
        (("out", b"v", 5), "key must be bytes, str or None"),
        (("out", b"v", None, "trace=1"), "headers must be a dict or a list"),
        (("out", b"v", None, [("trace",)]), r"each header must be a \(str, bytes \| str\) pair"),
        (("out", b"v", None, [(1, b"x")]), "each header must be"),
        (("out", b"v", None, {"n": 1}), "header 'n' must be bytes, str or None"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_expected(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        encode_send(*args)


# -------------------------------------------------------------- outbox


class FakeProducer:
    """Records what is produced; ``fail`` makes delivery reports carry an error, ``stuck`` makes flush time out."""

    def __init__(
        self, fail: bool = False, stuck: bool = False, full_for: int = 0, refuse: KafkaError | None = None
    ) -> None:
        self.refuse = refuse  # what produce() raises at once (librdkafka knows the topic is missing, say)
        self.produced: list[dict[str, Any]] = []
        self.metadata_asked: list[str] = []  # ask_producer_id's requests, before the first produce
        self.reports: list[Any] = []
        self.flushes = self.polls = 0
        self.fail, self.stuck, self.full_for = fail, stuck, full_for

    def list_topics(self, topic: str, timeout: float) -> None:
        assert not self.produced, "the producer id is asked for before the first message"
        self.metadata_asked.append(topic)

    def produce(self, topic: str, **kwargs: Any) -> None:
        if self.full_for:
            self.full_for -= 1
            raise BufferError("queue full")
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        self.produced.append({"topic": topic, **kwargs})
        self.reports.append((kwargs["on_delivery"], topic))

    def poll(self, _timeout: float) -> int:
        self.polls += 1
        return 0

    def flush(self, _timeout: float) -> int:
        self.flushes += 1
        if self.stuck:
            return len(self.reports)
        for callback, topic in self.reports:
            callback(_Error() if self.fail else None, _Msg(topic))
        self.reports.clear()
        return 0

    def __len__(self) -> int:
        return len(self.reports)


class _Error:
    def str(self) -> str:
        return "Broker: Unknown topic or partition"


class _Msg:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


def outbox_on(producer: FakeProducer) -> Outbox:
    outbox = Outbox(Settings(brokers="127.0.0.1:1"))
    outbox._new_producer = lambda: producer  # type: ignore[method-assign]
    return outbox


def test_a_send_in_a_worker_goes_to_the_producer_encoded_and_is_flushed_once() -> None:
    producer = FakeProducer()
    app = App(group="g")
    app.outbox = outbox_on(producer)
    app.send("out", "v1", key="k", headers={"h": "x"})
    app.send("out", {"n": 2})
    assert [(p["topic"], p["value"], p["key"], p["headers"]) for p in producer.produced] == [
        ("out", b"v1", b"k", [("h", b"x")]),
        ("out", b'{"n":2}', None, None),
    ]
    assert app.outbox.pending and producer.flushes == 0, "buffered, not waited for"
    assert producer.metadata_asked == ["out", "out"], (
        "the new producer asked for its producer id at once (twice: ask_producer_id)"
    )
    app.outbox.flush()
    app.outbox.flush()  # nothing sent since: no round trip
    assert not app.outbox.pending and producer.flushes == 1


def test_an_outbox_never_used_costs_no_producer_and_no_flush() -> None:
    outbox = outbox_on(FakeProducer())
    outbox.flush()
    outbox.close()
    assert outbox._producer is None and not outbox.pending


def test_a_failed_delivery_raises_at_the_flush_and_at_every_flush_after() -> None:
    producer = FakeProducer(fail=True)
    outbox = outbox_on(producer)
    outbox.send("missing", b"v", None, None)
    with pytest.raises(SendError, match="could not send to missing: Broker: Unknown topic"):
        outbox.flush()
    with pytest.raises(SendError):
        outbox.flush()  # sticky: no progress may be reported from now on
    assert outbox.pending and producer.flushes == 1


def test_a_send_refused_at_once_for_its_topic_raises_at_the_flush_as_a_failed_delivery() -> None:
    # The first send of a worker is queued and fails in its delivery report; once librdkafka knows the topic is
    # missing, produce() refuses at once.  Either way the worker must crash before its progress (not fail the
    # handler's call, whose retries would end in a dead letter while a deployment's output topic is missing).
    outbox = outbox_on(FakeProducer(refuse=KafkaError(KafkaError._UNKNOWN_TOPIC, "Local: Unknown topic")))
    outbox.send("missing", b"v", None, None)
    assert outbox.pending, "a flush is due before any progress"
    with pytest.raises(SendError, match="could not send to missing: Local: Unknown topic"):
        outbox.flush()


def test_a_message_produce_refuses_for_itself_fails_the_handlers_call() -> None:
    outbox = outbox_on(FakeProducer(refuse=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: too large")))
    with pytest.raises(KafkaException, match="too large"):
        outbox.send("out", b"v" * 10, None, None)
    assert not outbox.pending


def test_a_flush_kafka_does_not_confirm_in_time_raises() -> None:
    outbox = outbox_on(FakeProducer(stuck=True))
    outbox.send("out", b"v", None, None)
    with pytest.raises(SendError, match="1 sent message\\(s\\) not confirmed"):
        outbox.flush()


def test_a_failure_at_close_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    outbox = outbox_on(FakeProducer(fail=True))
    outbox.send("out", b"v", None, None)
    outbox.close()
    assert "may be missing" in caplog.text


def test_a_full_producer_queue_waits_for_room() -> None:
    producer = FakeProducer(full_for=2)
    outbox = outbox_on(producer)
    outbox.send("out", b"v", None, None)
    assert producer.polls == 2 and len(producer.produced) == 1


class SlowProducer(FakeProducer):
    """A produce that waits for ``go``: the window in which a handler thread has called send and the message is
    not yet in the producer."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.entered.set()
        assert self.go.wait(10)
        super().produce(topic, **kwargs)


def test_a_flush_racing_a_send_from_a_handler_thread_leaves_a_flush_due() -> None:
    # A lane's handler thread sends while the worker's loop flushes: the flush must not mark the outbox clean
    # for a message it did not wait for, or the input's progress is reported with its output still unsent.
    producer = SlowProducer()
    outbox = outbox_on(producer)
    sender = threading.Thread(target=outbox.send, args=("out", b"v", None, None))
    sender.start()
    assert producer.entered.wait(10)
    outbox.flush()  # the worker's loop, while the message is not in the producer yet
    producer.go.set()
    sender.join(10)
    assert outbox.pending, "the message the flush missed still needs one"
    outbox.flush()
    assert producer.reports == [] and not outbox.pending


def test_close_delivers_what_the_producer_holds_even_when_no_flush_is_marked_due() -> None:
    producer = FakeProducer()
    outbox = outbox_on(producer)
    outbox.send("out", b"v", None, None)
    outbox.pending = False  # however the flag got cleared, close must not leave messages in the producer
    outbox.close()
    assert producer.reports == [] and producer.flushes == 1


def test_handler_threads_sending_their_first_messages_at_once_share_one_producer() -> None:
    # Lanes run def handlers on threads: the first sends can race to create the producer.  A second producer
    # would replace the first, and what was produced on the first would never be flushed.
    created: list[FakeProducer] = []
    gate = threading.Barrier(8)

    def new_producer() -> FakeProducer:
        time.sleep(0.05)  # creating a real producer takes a while: the other threads get to run meanwhile
        created.append(FakeProducer())
        return created[-1]

    outbox = Outbox(Settings(brokers="127.0.0.1:1"))
    outbox._new_producer = new_producer  # type: ignore[method-assign]

    def first_send() -> None:
        gate.wait(10)
        outbox.send("out", b"v", None, None)

    senders = [threading.Thread(target=first_send) for _ in range(8)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(10)
    assert len(created) == 1 and len(created[0].produced) == 8
