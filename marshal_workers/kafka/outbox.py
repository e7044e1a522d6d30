"""Producing from handlers: ``app.send(topic, value, key=None, headers=None)``.

Each worker process has one :class:`Outbox`, and in it one idempotent producer
(``acks=all``, ``enable.idempotence``; ``[kafka.producer]`` settings apply),
created at the first send.  A send only hands the message to the producer,
which batches it; every runner flushes the outbox before it reports progress
(the slot's next offset, the lanes' done set, a shared range settled, the
next at-most-once claim), so progress never covers an input whose output
Kafka has not confirmed.  Runners ask ``outbox.pending`` first: a worker
whose handlers never send pays one attribute read per progress report.

A delivery that fails (an error in a delivery report, a topic librdkafka
already knows is missing, or no answer within ``FLUSH_TIMEOUT_S``) raises
:class:`SendError` from that flush and from every later one: the worker
crashes without reporting progress past the inputs whose output may be
missing, and they are handled again (at least once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer

from marshal_workers.core.config import Settings
from marshal_workers.errors import SendError
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.kafka_clients import ask_producer_id

FLUSH_TIMEOUT_S = 30
_BUFFER_FULL_WAIT_S = 0.1
# What produce() raises at once for a topic it knows the broker lacks (or refuses): a refusal of the send.
_REFUSED_AT_ONCE = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION, KafkaError.TOPIC_EXCEPTION})

_log = logging.getLogger(__name__)

# As the producer takes them (confluent-kafka's type); ours hold bytes, or None for a header without a value.
Headers = list[tuple[str, str | bytes | None]]


def encode_send(
    topic: Any, value: Any, key: Any = None, headers: Any = None
) -> tuple[str, bytes | None, bytes | None, Headers | None]:
    """``app.send``'s arguments checked and encoded: (topic, value, key, headers) as the producer takes them.

    value: bytes (bytearray, memoryview), str (UTF-8), a dict or list (JSON, by orjson) or None (a tombstone);
    key: bytes, str or None; headers: a dict or a list of (name, value) pairs, names str, values bytes, str or None.
    """
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"app.send: topic must be a non-empty str, got {topic!r}")
    return topic, _value(value), _bytes("key", key), _headers(headers)


def _value(value: Any) -> bytes | None:
    if isinstance(value, (dict, list)):
        try:
            return orjson.dumps(value)
        except TypeError as exc:
            raise TypeError(f"app.send: value cannot be serialised as JSON: {exc}") from None
    return _bytes("value", value, " or a dict or list (sent as JSON)")


def _bytes(what: str, value: Any, also: str = "") -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"app.send: {what} must be bytes, str{also} or None, got {type(value).__name__}")


def _headers(headers: Any) -> Headers | None:
    if headers is None:
        return None
    if isinstance(headers, Mapping):
        pairs: Iterable[Any] = headers.items()
    elif isinstance(headers, (list, tuple)):
        pairs = headers
    else:
        raise TypeError(f"app.send: headers must be a dict or a list of (name, value) pairs, got {headers!r}")
    encoded: Headers = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            raise TypeError(f"app.send: each header must be a (str, bytes | str) pair, got {pair!r}")
        encoded.append((pair[0], _bytes(f"header {pair[0]!r}", pair[1])))
    return encoded


class Outbox:
    """The messages a worker's handlers send, on one idempotent producer created at the first send.

    ``send`` may be called from any thread (lanes run ``def`` handlers on threads); ``flush`` and ``close``
    from the worker's own loop.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: Producer | None = None
        self._creating = threading.Lock()
        self._failure: str | None = None  # the first delivery that failed: every flush from then on raises
        self.pending = False  # sent since the last flush began: a flush is due before reporting progress
        self.sent = 0  # messages handed to the producer (delivered or not)

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers | None) -> None:
        """Hand an encoded message (encode_send) to the producer; it is delivered by the next flush at the latest."""
        producer = self._producer or self._first_producer(topic)
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, on_delivery=self._delivered)
                break
            except BufferError:  # the producer's queue is full: wait for deliveries to make room
                producer.poll(_BUFFER_FULL_WAIT_S)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() not in _REFUSED_AT_ONCE:
                    raise  # about this message (too large, say): the handler's failure, with its retries
                # A topic librdkafka already knows is missing or invalid is refused here rather than in a delivery
                # report: the same refusal, so the same crash at the next flush, whichever send was first.
                self._refused(topic, error)
                break
        # Only now, with the message in the producer: set before produce, a flush on the worker's loop could clear
        # it in between and flush without this message, and the input's progress would be reported (and its
        # output dropped at exit) with the output never confirmed.
        self.pending = True
        self.sent += 1

    def _first_producer(self, topic: str) -> Producer:
        """The producer, created by the first send.  Under a lock: handler threads (lanes) may send their first
        messages at once, and a second producer would replace the first with its messages never flushed."""
        with self._creating:
            if self._producer is None:
                producer = self._new_producer()
                ask_producer_id(producer, topic)
                self._producer = producer
            return self._producer

    def _new_producer(self) -> Producer:
        return Producer(client_profiles.output_producer(self._settings))

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._refused(msg.topic(), err)

    def _refused(self, topic: str, error: KafkaError) -> None:
        if self._failure is None:
            self._failure = f"could not send to {topic}: {error.str()}"

    def flush(self) -> None:
        """Wait until Kafka has confirmed every message sent so far; SendError if one failed or is still
        unconfirmed after FLUSH_TIMEOUT_S (and at every flush after that)."""
        if self._failure is None and self.pending and self._producer is not None:
            self.pending = False  # before flushing: a send from another thread meanwhile sets it again
            if self._producer.flush(FLUSH_TIMEOUT_S) > 0 and self._failure is None:
                left = len(self._producer)
                self._failure = f"{left} sent message(s) not confirmed by Kafka within {FLUSH_TIMEOUT_S}s"
        if self._failure is not None:
            self.pending = True  # never clean again: no progress is reported past this point
            raise SendError(self._failure)

    def close(self, log: Any = _log) -> None:
        """The worker is exiting: deliver what is left (sent after the last progress report: its inputs are
        handled again anyway, so a failure here is only logged)."""
        if self._producer is None:
            return
        self.pending = True  # whatever the producer still holds is delivered, whoever last cleared the flag
        try:
            self.flush()
        except SendError as exc:
            log.error("messages sent by handlers after the last progress report may be missing: %s", exc)
