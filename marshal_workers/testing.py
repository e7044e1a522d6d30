"""Testing your handlers: in process without a broker (:func:`run_handler`), or against a real one (the pytest
plugin's fixtures ``marshal_broker`` and ``running_app``, in :mod:`marshal_workers.pytest_plugin`).

:func:`run_handler` runs a handler the way a worker does (docs/handlers.md): its retry policy (``retries``,
``retry_on``, ``Retry``/``Reject``/``Ignore``, the backoff, not slept unless asked), its ``on_error``, its time
limits (raised inside the call: past ``soft_time_limit`` a ``SoftTimeLimitExceeded``, past ``time_limit`` a
``TimeLimitExceeded``, where a worker would be killed; both count as failures), the hooks (per message, on
dead letters, per partition, per worker) and batches of ``batch_size``.  It returns what became of each
message, with the last error's traceback.  Nothing is written anywhere: a dead letter is an outcome with the
headers it would carry.

    from marshal_workers.testing import make_message, run_handler

    [result] = run_handler(app, "orders", [make_message({"id": 1, "amount": 5})])
    assert result.outcome == "done"

:func:`run_app` runs a whole application the same way: the input messages through their topics' handlers, and
what those send (``app.send``) on to the app's handler of the destination, until nothing is left to handle.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import orjson

from marshal_workers.core.config import load_settings
from marshal_workers.errors import ConfigError, SoftTimeLimitExceeded, TimeLimitExceeded
from marshal_workers.handlers.app import App, HandlerSpec, Message, effective_time_limits
from marshal_workers.handlers.failure_path import Decision, FailurePath, Fate
from marshal_workers.handlers.hooks import run_hooks
from marshal_workers.handlers.message_age import OnTooOld, is_too_old, too_old_error
from marshal_workers.handlers.models import check_serializer
from marshal_workers.handlers.serializers import is_model_value
from marshal_workers.kafka.dead_letter_writer import letter_headers, traceback_text
from marshal_workers.protocol.dead_letter_groups import for_another_group, origin_headers

__all__ = ["AppRun", "FakeRecord", "HandlerResult", "SentMessage", "make_message", "run_app", "run_handler"]


class FakeRecord:
    """A stand-in for confluent_kafka.Message, which cannot be built in Python: the accessors a Message reads."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp: tuple[int, int] = (0, -1),  # (kind, ms): kind 0 = none, 1 = create time, 2 = log append time
        topic_given: bool = True,  # False: make_message's stand-in, until run_handler gives it its handler's topic
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers, self._timestamp = key, value, headers, timestamp
        self.topic_given = topic_given

    def on_topic(self, topic: str) -> FakeRecord:
        """The same record on ``topic``."""
        return FakeRecord(topic, self._partition, self._offset, self._key, self._value, self._headers, self._timestamp)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def error(self) -> None:
        return None  # a record, not an error event


UNNAMED_TOPIC = "test"  # the topic of a message made without one, outside run_handler


def make_message(
    value: bytes | str | Mapping[str, Any] | list[Any] | None = b"",
    *,
    topic: str | None = None,
    partition: int = 0,
    offset: int = 0,
    key: bytes | str | None = None,
    headers: Mapping[str, bytes | str] | Sequence[tuple[str, bytes | str]] | None = None,
    timestamp: int | None = None,
    serializer: Any = "json",
) -> Message:
    """A message as a handler gets it.  ``value``: bytes, a str (UTF-8), a dict/list (JSON, as ``msg.json()``
    reads it) or a model (a msgspec Struct, a dataclass or a pydantic model, encoded by ``serializer``: "json",
    "msgpack" or your own, as the typed handler it is for decodes it); ``timestamp`` in ms since the epoch (None: the
    record has none).  Without ``topic``, run_handler gives it the topic of the handler it runs (as values given to
    run_handler get it); elsewhere it is "test"."""
    if is_model_value(value):
        value = check_serializer("make_message", serializer).encode(value)
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or [])
    record = FakeRecord(
        topic or UNNAMED_TOPIC,
        partition,
        offset,
        _bytes(key),
        _bytes(value),
        [(str(name), _bytes(data) or b"") for name, data in pairs] or None,
        (0, -1) if timestamp is None else (1, timestamp),
        topic_given=topic is not None,
    )
    return Message(record)


def _on_handler_topic(msg: Message, topic: str) -> Message:
    """``msg`` as the handler of ``topic`` gets it: one made without a topic (make_message's default) is on it."""
    record = msg._record
    if isinstance(record, FakeRecord) and not record.topic_given:
        return Message(record.on_topic(topic), msg.attempt)
    return msg


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (dict, list)):
        return orjson.dumps(value)
    raise TypeError(f"expected bytes, str, or (for a value) a dict or list; got {type(value).__name__}")


@dataclass
class HandlerResult:
    """What became of one message."""

    message: Message
    # done: handled; ignored: the handler raised Ignore; dead_letter: rejected, or failed past its retries with
    # on_error="dlq" (or too old, with on_too_old="dlq"); released: failed past its retries with on_error="release"
    # (the partition would be released there); not_handled: after a release, the partition's later messages (the
    # next owner gets them); too_old: older than max_age, skipped without a call; other_group: redriven for
    # another group than the app's (dlq redrive), passed by without a call.
    outcome: str
    attempts: int = 0  # handler calls made for it
    error: BaseException | None = None  # the last error, if any
    delays: list[float] = field(default_factory=list)  # the waits before each retry, as the policy chose them
    dead_letter_headers: list[tuple[str, bytes]] | None = None  # the headers its dead letter would carry
    # What its calls sent with app.send, retries included (as a worker's producer would have them): (topic, value,
    # key, headers), encoded as they go to Kafka.  A batch's messages share one list.
    sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = field(default_factory=list)
    # The last error's traceback as a worker logs it (whole: the dead letter's ``traceback`` header keeps its last
    # TRACEBACK_MAX_BYTES); None if there was no error, or one never raised (a message too old).
    traceback: str | None = None

    def __post_init__(self) -> None:
        if self.traceback is None and self.error is not None:
            self.traceback = traceback_text(self.error)


class _CapturingOutbox:
    """Stands in for a worker's producer (outbox.Outbox): app.send's messages are kept, not sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: Any) -> None:
        self.sent.append((topic, value, key, None if headers is None else list(headers)))


def run_handler(
    app: App,
    topic: str,
    messages: Sequence[Message | bytes | str | Mapping[str, Any]],
    *,
    sleep: bool = False,
    lifecycle: bool = True,
    seed: int | None = None,
) -> list[HandlerResult]:
    """Run ``app``'s handler of ``topic`` on ``messages`` (Messages, or values for :func:`make_message`; plain
    values get offsets 0, 1, 2...) as a worker would; one result per message, in order.  Plain values, and
    messages made without a topic, are on ``topic`` (each result's ``message`` is the message the handler got).

    ``sleep``: wait the retry backoff for real (default: record it in ``delays`` and go on).  ``lifecycle``:
    run the ``on_worker_start``/``on_partition_claimed`` hooks first and the released/stop hooks last.
    ``seed``: the random source of the retry jitter.  Time limits use SIGALRM: call from the main thread.
    """
    if topic not in app.handlers:
        raise ConfigError(f"the app has no handler for topic {topic!r}; it has: {', '.join(app.topics) or 'none'}")
    handler = app.handler_in_worker(topic)
    given = [
        _on_handler_topic(m, topic) if isinstance(m, Message) else make_message(m, topic=topic, offset=i)
        for i, m in enumerate(messages)
    ]
    settings = load_settings(app_defaults=app.settings, env={})
    soft, hard = effective_time_limits(handler, settings)
    origin = origin_headers(settings.group, settings.client_id)  # who a dead letter says wrote it
    rng = random.Random(seed)
    partitions = sorted({m.partition for m in given})
    if lifecycle:
        for hook in app.worker_start_hooks:
            hook()  # one that fails stops everything, as it stops a worker from starting
        for partition in partitions:
            run_hooks(app.hooks.on_partition_claimed, topic, partition)
    # As a worker does where it fetches them: a message redriven for another group is passed by, never called.
    group = (settings.group or "").encode()
    others = [m for m in given if group and for_another_group(m.headers, group)]
    results: dict[int, HandlerResult] = {id(m): HandlerResult(m, "other_group") for m in others}
    released: set[int] = set()
    paths: dict[int, FailurePath] = {}
    outbox, app.outbox = app.outbox, _CapturingOutbox()  # type: ignore[assignment]
    try:
        for unit in _units(handler, [m for m in given if id(m) not in results]):
            if unit[0].partition in released:
                for msg in unit:
                    results[id(msg)] = HandlerResult(msg, "not_handled")
                continue
            # One failure path per partition, as each partition has its worker (dlq_limit counts in a row there).
            path = paths.setdefault(unit[0].partition, FailurePath(rng=rng))
            for result in _run_unit(app, handler, unit, soft, hard, sleep, path, origin):
                results[id(result.message)] = result
                if result.outcome == "released":
                    released.add(result.message.partition)
    finally:
        app.outbox = outbox
        if lifecycle:
            for partition in partitions:
                run_hooks(app.hooks.on_partition_released, topic, partition)
            run_hooks(app.worker_stop_hooks)
    return [results[id(m)] for m in given]


def _units(handler: HandlerSpec, messages: list[Message]) -> Iterator[list[Message]]:
    """What one call gets: each message, or for a batch handler up to batch_size messages of one partition."""
    if not handler.batch:
        yield from ([m] for m in messages)
        return
    by_partition: dict[int, list[Message]] = {}
    for msg in messages:
        by_partition.setdefault(msg.partition, []).append(msg)
    for batch in by_partition.values():
        for start in range(0, len(batch), handler.batch_size):
            yield batch[start : start + handler.batch_size]


def _run_unit(
    app: App,
    handler: HandlerSpec,
    unit: list[Message],
    soft: float,
    hard: float,
    sleep: bool,
    path: FailurePath,
    origin: list[tuple[str, bytes]],
) -> list[HandlerResult]:
    if handler.max_age:  # as a worker does when it gets to them: too old, skipped or dead-lettered, never called
        now_ms, max_age_ms = int(time.time() * 1000), round(handler.max_age * 1000)
        old = [m for m in unit if is_too_old(m._record.timestamp(), now_ms, max_age_ms)]
        if old:
            unit = [m for m in unit if m not in old]
            return _too_old(app, handler, old, now_ms, max_age_ms, origin) + (
                _run_unit(app, handler, unit, soft, hard, sleep, path, origin) if unit else []
            )
    attempts = 0
    delays: list[float] = []
    capture = app.outbox
    assert isinstance(capture, _CapturingOutbox)
    capture.sent = sent = []
    offsets = [m.offset for m in unit]
    while True:
        attempts += 1
        argument: Any = (
            [Message(m._record, attempts) for m in unit] if handler.batch else Message(unit[0]._record, attempts)
        )
        try:
            _call(handler, argument, soft, hard)
            return [HandlerResult(m, "done", attempts, None, delays, sent=sent) for m in unit]
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            error: Exception = exc
        decision = path.after_call(handler, offsets, error, attempts)  # the worker's failure path
        if decision.fate is not Fate.RETRY:
            return _results(app, handler, unit, decision, attempts, delays, sent, origin)
        delays.append(decision.delay)
        if sleep:
            time.sleep(decision.delay)


def _results(
    app: App,
    handler: HandlerSpec,
    unit: list[Message],
    decision: Decision,
    attempts: int,
    delays: list[float],
    sent: list[Any],
    origin: list[tuple[str, bytes]],
) -> list[HandlerResult]:
    """What became of the messages of a call that failed for good: as ``decision`` says; of a typed batch whose
    payloads did not all decode, the others were handled."""
    if decision.fate is not Fate.DEAD_LETTER:
        outcome = {Fate.IGNORED: "ignored", Fate.RELEASE: "released"}[decision.fate]
        return [HandlerResult(m, outcome, attempts, decision.error, delays, sent=sent) for m in unit]
    results = []
    for position, msg in enumerate(unit):
        own = decision.letters.get(position)
        if own is None:
            results.append(HandlerResult(msg, "done", attempts, None, delays, sent=sent))
            continue
        headers = letter_headers(handler.name, msg._record, own) + origin
        run_hooks(app.hooks.on_dead_letter, msg, own)
        results.append(HandlerResult(msg, "dead_letter", attempts, own, delays, headers, sent))
    return results


def _too_old(
    app: App, handler: HandlerSpec, old: list[Message], now_ms: int, max_age_ms: int, origin: list[tuple[str, bytes]]
) -> list[HandlerResult]:
    if handler.on_too_old is not OnTooOld.DLQ:
        return [HandlerResult(m, "too_old") for m in old]
    results = []
    for msg in old:
        error = too_old_error(msg._record.timestamp(), now_ms, max_age_ms)
        run_hooks(app.hooks.on_dead_letter, msg, error)
        headers = letter_headers(handler.name, msg._record, error) + origin
        results.append(HandlerResult(msg, "dead_letter", 0, error, dead_letter_headers=headers))
    return results


def _call(handler: HandlerSpec, argument: Any, soft: float, hard: float) -> None:
    """One call, with the time limits raised inside it (SIGALRM), as a worker's soft limit is."""
    function = handler.function
    limits = [(soft, SoftTimeLimitExceeded), (hard, TimeLimitExceeded)] if soft else [(hard, TimeLimitExceeded)]
    limits = [(seconds, kind) for seconds, kind in limits if seconds]
    if not limits:
        _invoke(function, argument)
        return
    started = time.monotonic()
    pending = list(limits)

    def on_alarm(_signum: int, _frame: FrameType | None) -> None:
        seconds, kind = pending.pop(0)
        if pending:  # the soft limit fired: the hard one comes later
            signal.setitimer(signal.ITIMER_REAL, max(pending[0][0] - (time.monotonic() - started), 0.001))
        raise kind(
            f"the handler ran past its {'soft ' if kind is SoftTimeLimitExceeded else ''}time limit ({seconds:g}s)"
        )

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limits[0][0])
    try:
        _invoke(function, argument)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _invoke(function: Any, argument: Any) -> None:
    if inspect.iscoroutinefunction(function):
        asyncio.run(function(argument))
    else:
        function(argument)


# ------------------------------------------------------------------ a whole app


@dataclass(frozen=True)
class SentMessage:
    """A message a handler sent (``app.send``), encoded as it goes to Kafka."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]] | None
    sent_by: Message  # the message whose handler call sent it (a batch: its first)
    handled: bool  # the app has a handler of ``topic``: run_app handed it on to it


@dataclass
class AppRun:
    """What :func:`run_app` did: every message handled (the inputs, then what was sent to topics the app handles,
    in the order handled) and every message sent."""

    results: list[HandlerResult]
    sent: list[SentMessage]

    def results_of(self, topic: str) -> list[HandlerResult]:
        return [r for r in self.results if r.message.topic == topic]

    def sent_to(self, topic: str) -> list[SentMessage]:
        return [s for s in self.sent if s.topic == topic]

    def outcomes(self, topic: str) -> list[str]:
        return [r.outcome for r in self.results_of(topic)]


def run_app(
    app: App,
    messages: Mapping[str, Sequence[Message | bytes | str | Mapping[str, Any]]],
    *,
    sleep: bool = False,
    seed: int | None = None,
    max_rounds: int = 100,
) -> AppRun:
    """Run ``messages`` (topic -> its messages, as :func:`run_handler` takes them) through the app's handlers in
    this process, as its workers would, and deliver what each call sends (``app.send``) to the app's handler of
    the destination, round after round, until nothing is left; everything sent is recorded either way.

    Each topic's messages get offsets from 0 on (the sent ones after the given ones) on partition 0, so a batch's
    messages are told apart.  The ``on_worker_start`` hooks run once first and ``on_worker_stop`` once last.
    A message sent by a call that was retried is sent again, as under at least once.  ConfigError for a topic the
    app has no handler for, or when the handlers still send to each other after ``max_rounds`` rounds (a loop).
    """
    missing = sorted(set(messages) - set(app.handlers))
    if missing:
        raise ConfigError(
            f"the app has no handler for {', '.join(map(repr, missing))}; it has: {', '.join(app.topics) or 'none'}"
        )
    next_offset: dict[str, int] = {}
    pending: dict[str, list[Message]] = {}
    for topic, given in messages.items():
        pending[topic] = [_placed(m, topic, next_offset) for m in given]
    run = AppRun([], [])
    for hook in app.worker_start_hooks:
        hook()
    try:
        for _ in range(max_rounds):
            if not pending:
                return run
            arriving: dict[str, list[Message]] = {}
            for topic, batch in pending.items():
                results = run_handler(app, topic, batch, sleep=sleep, lifecycle=False, seed=seed)
                run.results += results
                for sent, sender in _sent_once(results):
                    handled = sent[0] in app.handlers
                    run.sent.append(SentMessage(*sent, sent_by=sender, handled=handled))
                    if handled:
                        value, key, headers = sent[1], sent[2], sent[3]
                        message = make_message(
                            value, topic=sent[0], key=key, headers=headers, offset=next_offset.get(sent[0], 0)
                        )
                        next_offset[sent[0]] = message.offset + 1
                        arriving.setdefault(sent[0], []).append(message)
            pending = arriving
        raise ConfigError(
            f"the handlers still send to each other after {max_rounds} rounds: a loop? "
            f"(still to handle: {', '.join(sorted(pending))})"
        )
    finally:
        run_hooks(app.worker_stop_hooks)


def _placed(given: Message | bytes | str | Mapping[str, Any], topic: str, next_offset: dict[str, int]) -> Message:
    """A given message on ``topic`` at the topic's next offset (a Message keeps its own offset if it is past)."""
    offset = next_offset.get(topic, 0)
    if isinstance(given, Message):
        message = _on_handler_topic(given, topic)
        next_offset[topic] = max(offset, message.offset) + 1
        return message
    next_offset[topic] = offset + 1
    return make_message(given, topic=topic, offset=offset)


def _sent_once(
    results: list[HandlerResult],
) -> Iterator[tuple[tuple[str, bytes | None, bytes | None, Any], Message]]:
    """What the calls of ``results`` sent, each once (a batch's messages share one list), with the message whose
    call sent it (a batch's first)."""
    seen: set[int] = set()
    for result in results:
        if id(result.sent) in seen:
            continue
        seen.add(id(result.sent))
        for sent in result.sent:
            yield sent, result.message
