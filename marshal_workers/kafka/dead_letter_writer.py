"""Writing messages to a handler's dead-letter topic, ``<topic>.dlq``, and making sure they are there.

The one writer of dead letters: the partition worker's (runtime/worker/failures.py), the shared worker's (after
``max_deliveries``) and the HTTP service's, each letter's headers made by :func:`letter_headers` (which the testing
harness shows as those a letter would carry).  Each dead letter keeps the original value, key,
headers (a trace id survives) and timestamp; headers added after the original
ones say what failed (with the traceback, when the handler raised it, and with
tracing on the failed call's traceparent: core/tracing.py), where the
message came from and, for shared handlers, how many times it was delivered; the
last ones say which group and client wrote it (dead_letter_groups.py: ``dlq
list/redrive --group``).  A write that Kafka does not confirm raises: the caller
then has not moved past the message, so it is handled again rather than lost.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, Producer

from marshal_workers.core import tracing
from marshal_workers.core.config import Settings
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.kafka_clients import ask_producer_id
from marshal_workers.protocol.dead_letter_groups import origin_headers

FLUSH_TIMEOUT_S = 30
TRACEBACK_HEADER = "traceback"
# When the letter was written (ms since the epoch, the writer's clock): a letter keeps the original message's
# timestamp, so this is what `dlq redrive --since` and `dlq list` go by.
WRITTEN_AT_HEADER = "dead_lettered_at"
# The traceback header's bound, the cut marker included: a deep stack or a long chain of causes keeps its end
# (the innermost frames and the error itself), and a dead letter stays far below Kafka's message size limit.
TRACEBACK_MAX_BYTES = 8192
_LINE_SEARCH_BYTES = 1024  # how far a cut traceback may be shortened further to begin at a line


def error_headers(handler_name: str, record: Any, error: BaseException) -> list[tuple[str, bytes]]:
    """The headers of a dead letter: the error, the handler and where the message came from; the traceback too
    if the error was raised (not one made up for a message never handed to the handler, such as WorkerLost)."""
    headers = [
        ("error", repr(error)[:2000].encode()),
        ("error_type", type(error).__qualname__.encode()),
        ("handler", handler_name.encode()),
        ("original_topic", record.topic().encode()),
        ("original_partition", str(record.partition()).encode()),
        ("original_offset", str(record.offset()).encode()),
        (WRITTEN_AT_HEADER, str(int(time.time() * 1000)).encode()),
    ]
    text = traceback_text(error)
    if text is not None:
        headers.append((TRACEBACK_HEADER, bounded_traceback(text)))
    if tracing.active():  # the failed call's span as the dead letter's parent: after the record's own, so it wins
        headers += tracing.failed_call_trace_headers(error)
    return headers


def letter_headers(
    handler_name: str, record: Any, error: BaseException, deliveries: int | None = None
) -> list[tuple[str, bytes]]:
    """What a dead letter says of its failure: :func:`error_headers`, and for a message delivered again and again
    (a shared range, a served topic) after how many deliveries."""
    headers = error_headers(handler_name, record, error)
    return headers if deliveries is None else headers + [("deliveries", str(deliveries).encode())]


def traceback_text(error: BaseException) -> str | None:
    """The error's traceback as Python prints it (its causes first, the error last); None if it was never raised."""
    if error.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(error))


def bounded_traceback(text: str, limit: int = TRACEBACK_MAX_BYTES) -> bytes:
    """``text`` in UTF-8, at most ``limit`` bytes: if longer, its start is cut (up to a line's start, if one comes
    within _LINE_SEARCH_BYTES) and a marker line says how much, so the innermost frames and the error survive."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data
    room = limit - len(_cut_marker(len(data)))  # the marker for the largest possible cut: the longest one
    tail = data[len(data) - room :].decode("utf-8", "ignore")  # "ignore": a character cut in two is dropped
    line_start = tail.find("\n", 0, _LINE_SEARCH_BYTES) + 1
    if 0 < line_start < len(tail):
        tail = tail[line_start:]  # begin at a line, unless that leaves nothing (one long last line)
    kept = tail.encode()
    return _cut_marker(len(data) - len(kept)) + kept


def _cut_marker(cut: int) -> bytes:
    return f"[... the first {cut} bytes of the traceback cut ...]\n".encode()


class DeadLetterWriter:
    """One idempotent producer per worker process, created at the first dead letter."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: Producer | None = None
        self._origin = origin_headers(settings.group, settings.client_id)  # who wrote it: after every other header

    def write(self, topic: str, records: Sequence[Any], headers: Sequence[Sequence[tuple[str, bytes]]]) -> None:
        """Write ``records`` (raw Kafka messages) to ``topic``, their own headers followed by ``headers``; wait until
        Kafka has them."""
        if self._producer is None:
            self._producer = Producer(client_profiles.dead_letter_producer(self._settings))
            ask_producer_id(self._producer, topic)
        producer = self._producer
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failures.append(err)

        for record, record_headers in zip(records, headers):
            kept = list(record.headers() or []) + list(record_headers) + self._origin  # ours last: they win in a dict()
            kind, stamp = record.timestamp()
            when = {"timestamp": stamp} if kind != 0 and stamp >= 0 else {}  # 0: the record has no timestamp
            while True:
                try:
                    producer.produce(
                        topic, value=record.value(), key=record.key(), headers=kept, on_delivery=delivered, **when
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        if producer.flush(FLUSH_TIMEOUT_S) > 0:
            raise RuntimeError(f"could not write to {topic} within {FLUSH_TIMEOUT_S}s")
        if failures:
            raise RuntimeError(f"could not write to {topic}: {failures[0]}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
