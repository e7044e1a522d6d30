"""The application object: handlers by topic, per-process hooks, settings.

    from marshal_workers import App

    app = App(group="billing.invoices")

    @app.handler("orders")
    def on_order(msg):
        order = msg.json()

The decorator refuses mistakes at import time (a second handler for a topic,
an unknown mode or error policy: handler_options.py checks the options), so a
bad application never reaches a fork.
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import orjson

from marshal_workers.core import tracing
from marshal_workers.core.config import SETTINGS, Settings, load_settings
from marshal_workers.errors import ConfigError
from marshal_workers.handlers import handler_options
from marshal_workers.handlers.handler_options import Mode, OnError
from marshal_workers.handlers.hooks import (
    AfterHook,
    BeforeHook,
    DeadLetterHook,
    Hooks,
    PartitionHook,
    with_message_hooks,
)
from marshal_workers.handlers.lifespan import LifespanFunction, WorkerLifespan
from marshal_workers.handlers.message_age import OnTooOld
from marshal_workers.handlers.middleware import Middleware, check_kind, check_middleware, with_middleware
from marshal_workers.handlers.models import ModelPlan, check_serializer, plan_for, typed
from marshal_workers.handlers.retry_policy import RetryPolicy
from marshal_workers.handlers.serializers import BUILT_IN, is_model_value
from marshal_workers.kafka.outbox import Outbox, encode_send
from marshal_workers.protocol.lanes import Ordering

_OWN_OUTBOX_LOCK = threading.Lock()  # app.send from threads of a web server: one producer per process


class Message(msgspec.Struct, gc=False, eq=False):
    """One Kafka message, as handlers see it.  Reads the underlying record lazily.

    ``Message(record, attempt=1)``.  A msgspec Struct rather than a class with ``__init__``: one is made per
    message on the workers' hot path, and a Struct is built in C, in about a third of the time.  ``eq=False``:
    messages compare and hash by identity, as objects do; ``gc=False``: it holds a Kafka record and an int, no
    cycle.
    """

    _record: Any
    attempt: int = 1  # which try of this message this call is: 1 for the first, 2 for the first retry...

    @property
    def topic(self) -> str:
        return self._record.topic()

    @property
    def partition(self) -> int:
        return self._record.partition()

    @property
    def offset(self) -> int:
        return self._record.offset()

    @property
    def key(self) -> bytes | None:
        return self._record.key()

    @property
    def value(self) -> bytes | None:
        return self._record.value()

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return self._record.headers() or []

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch, or None if the record has none."""
        kind, stamp = self._record.timestamp()
        return None if kind == 0 else stamp

    def json(self) -> Any:
        """The value parsed as JSON (orjson)."""
        return orjson.loads(self._record.value())

    def with_body(self, body: Any) -> TypedMessage:
        """This message with its value decoded (``msg.body``): what a ``Message[Order]`` handler gets."""
        return TypedMessage(self._record, self.attempt, body)

    def __class_getitem__(cls, model: Any) -> Any:
        """``Message[Order]``: a handler's annotation, for the Message with ``msg.body`` an Order (models.py)."""
        return types.GenericAlias(cls, model)

    def __repr__(self) -> str:
        return f"Message({self.topic}[{self.partition}]@{self.offset})"


class TypedMessage(Message, gc=False, eq=False):
    """A Message whose value was decoded for a ``Message[Order]`` handler: ``msg.body`` is the Order."""

    body: Any = None  # the value decoded by the handler's serializer into its model


class FetchedMessage(Message, gc=False, eq=False):
    """A Message as a worker's one-call loop makes it: topic, partition, offset and value read once, as plain
    attributes.

    ``FetchedMessage(record, attempt, topic, partition, offset, value)``.  The loop knows its topic and partition
    and reads the offset anyway; the value is what nearly every handler reads.  A property costs a Python call
    (about 600 instructions, three of them 15% of a small handler's message; tests/benchmarks/bench_loop.py), an
    attribute of a Struct a few dozen.  Key, headers and timestamp stay lazy.
    """

    topic: str = ""
    partition: int = 0
    offset: int = 0
    value: bytes | None = None

    def json(self) -> Any:
        """The value parsed as JSON (orjson)."""
        return orjson.loads(self.value)  # type: ignore[arg-type]  # (None: orjson's error, as Message.json's)


Handler = Callable[..., Any]
Hook = Callable[[], Any]


@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler and how to run it."""

    topic: str
    function: Handler
    mode: Mode = Mode.ALO
    batch: bool = False
    batch_size: int = 500  # most messages per handler call (batch) or per AMO claim
    retries: int = 3  # retries after the first failure, before on_error applies
    retry_backoff: float = 0.1  # seconds before the first retry; doubles each time
    # Which errors are retried, how long between tries (retries and retry_backoff included): retry_policy.py.
    retry_policy: RetryPolicy = RetryPolicy()  # noqa: RUF009 - frozen: every spec may share the one default
    on_error: OnError = OnError.DLQ
    dlq_limit: int = 0  # dead letters in a row, after which the next failure releases the partition as sick (0: none)
    soft_time_limit: float | None = None  # seconds; None: the soft_time_limit setting
    time_limit: float | None = None  # seconds; None: the time_limit setting
    concurrency: int = 1  # messages (batches, for a batch handler) in flight at once in a worker
    ordering: Ordering = Ordering.PARTITION  # which messages may be in flight together (lanes.Ordering)
    window: int = 1  # most offsets from the lowest unfinished message to the furthest fetched one
    # Shared partitions (docs/shared-partitions.md, docs/shared-partitions.md): workers lease ranges of offsets.
    shared: bool = False
    range_size: int = 100  # offsets per range claim: the first ones (adaptive_ranges), or every one
    adaptive_ranges: bool = True  # size each claim from the workers' measured rate (protocol/range_sizing.py)
    pending_timeout: float = 60.0  # seconds a lease lasts unless renewed; past it another worker may take it
    max_deliveries: int = 5  # deliveries of a message (at least once) before it is dead-lettered instead
    # Limits (docs/handlers.md): messages per second across one supervisor's workers (rate_limits.py), and the
    # age past which a message is skipped or dead-lettered instead of handled (message_age.py).
    rate_limit: float | None = None  # messages per second; None: no limit
    max_age: float | None = None  # seconds; None: any age
    on_too_old: OnTooOld = OnTooOld.SKIP
    # A typed handler (models.py): how its values are decoded; ``function`` then decodes before the user's, which
    # ``declared`` is.  None: the handler takes Messages, called as it is.
    model: ModelPlan | None = None
    declared: Handler | None = None
    serializer: Any = BUILT_IN["json"]  # what decodes its models, and encodes the models app.send sends to its topic
    middleware: tuple[Middleware, ...] = ()  # its own, inside the app's (middleware.py)

    @property
    def is_async(self) -> bool:
        """An ``async def`` handler: its calls run as tasks on the worker's event loop."""
        return inspect.iscoroutinefunction(self.function)

    @property
    def runs_on_lanes(self) -> bool:
        """Handled by the concurrent runner (lane_runner) rather than the one-call-at-a-time loop."""
        return self.concurrency > 1 or self.is_async

    @property
    def lane_capacity(self) -> int:
        """Messages in flight at once: a batch handler's concurrency counts batches."""
        return self.concurrency * (self.batch_size if self.batch else 1)

    @property
    def name(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic}.dlq"

    def call(self, records: list[Any], attempt: int = 1) -> None:
        """The user's function on raw Kafka records: on the batch (batch=True) or on its one message.
        ``attempt``: which try this is (``msg.attempt``), 1 for the first."""
        if self.batch:
            self.function([Message(r, attempt) for r in records])
        else:
            self.function(Message(records[0], attempt))


@dataclass(frozen=True)
class OutputSpec:
    """A topic the app sends to, declared with ``app.sends``: for its AsyncAPI document, and the serializer of
    what ``app.send`` sends there."""

    topic: str
    model: type | None
    description: str | None
    serializer: Any


class App:
    """Handlers by topic, hooks, and settings given in code (the lowest precedence but defaults)."""

    def __init__(self, group: str | None = None, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"App() got unknown settings {unknown}; known settings: {', '.join(sorted(SETTINGS))}")
        self.settings: dict[str, Any] = {"group": group, **settings} if group else dict(settings)
        self.handlers: dict[str, HandlerSpec] = {}
        self.outputs: dict[str, OutputSpec] = {}  # declared with sends()
        self.worker_start_hooks: list[Hook] = []
        self.worker_stop_hooks: list[Hook] = []
        self.startup_hooks: list[Hook] = []  # once in the supervisor, before it claims (lifespan.py)
        self.shutdown_hooks: list[Hook] = []  # once in the supervisor, after it released everything
        self.hooks = Hooks()  # per message and per partition, in the workers (hooks.py)
        self.middlewares: list[Middleware] = []  # around every handler's calls, the first the outermost
        self.outbox: Outbox | None = None  # set in each worker process (app.send); None everywhere else
        self._own_outbox: Outbox | None = None  # app.send outside a worker: this process's own (_process_outbox)
        self._own_outbox_pid = 0

    @property
    def group(self) -> str | None:
        return self.settings.get("group")

    @property
    def topics(self) -> Sequence[str]:
        return sorted(self.handlers)

    def handler(
        self,
        topic: str,
        mode: str = "alo",
        batch: bool = False,
        batch_size: int = 500,
        retries: int = 3,
        retry_backoff: float | str = 0.1,
        retry_backoff_max: float | str = "10m",
        retry_jitter: bool = True,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
        no_retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        on_error: str = "dlq",
        soft_time_limit: float | str | None = None,
        time_limit: float | str | None = None,
        concurrency: int = 1,
        ordering: str | None = None,
        window: int | None = None,
        shared: bool = False,
        range_size: int = 100,
        adaptive_ranges: bool = True,
        pending_timeout: float | str = 60.0,
        max_deliveries: int = 5,
        dlq_limit: int = 0,
        rate_limit: float | str | None = None,
        max_age: float | str | None = None,
        on_too_old: str = "skip",
        serializer: Any = "json",
        middleware: Sequence[Middleware] = (),
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function for every message (or batch, with ``batch=True``) of ``topic``.

        ``soft_time_limit`` and ``time_limit`` (e.g. "30s") override the settings of the same name
        for this handler; 0 turns a limit off.  ``concurrency`` N runs up to N calls at once in each
        worker (a ``def`` handler on N threads, an ``async def`` one as N tasks), ``ordering`` says
        which may overlap ("key", the default then; "none"; "partition") and ``window`` bounds how
        far past a stuck message the worker reads (docs/concurrency.md).

        ``shared=True`` lets many workers on many hosts share each partition: they lease ranges of
        offsets for ``pending_timeout`` (renewed while they work), and a message delivered
        ``max_deliveries`` times goes to the dead-letter topic (docs/shared-partitions.md).  A range
        covers a few seconds of the handler's measured work (``range_size`` offsets at first);
        ``adaptive_ranges=False`` makes every range ``range_size`` offsets.

        ``dlq_limit`` N: once N messages in a row went to the dead-letter topic, the next failure
        releases the partition as sick at that message instead (a broken dependency is not drained
        into the dead-letter topic); 0, the default, sets no limit.

        A failed call is retried ``retries`` times if its error is one of ``retry_on`` and none of
        ``no_retry_on``, after ``retry_backoff`` doubling up to ``retry_backoff_max``, each wait a random
        time up to that with ``retry_jitter`` (on by default, as in Celery); then ``on_error`` applies.
        A handler may also ``raise Retry(delay=...)``, ``Reject(reason)`` (to the dead-letter topic at
        once) or ``Ignore()`` (skip it, counted); ``msg.attempt`` is the try number (docs/handlers.md).

        ``rate_limit`` ("200/s", "100/m", "5/h", or a number per second) bounds the messages handled per
        second across all the workers of one supervisor (docs/handlers.md, "Rate limits").  ``max_age``
        (e.g. "1h"): a message older than that (its Kafka timestamp) when its worker gets to it is not
        handled but skipped, or with ``on_too_old="dlq"`` dead-lettered as ``MessageTooOld``; both counted.

        A handler whose parameter is annotated with a model (``order: Order``, ``msg: Message[Order]``,
        ``orders: list[Order]``; a msgspec Struct, a dataclass or a pydantic model) gets the values decoded by
        ``serializer`` ("json", "msgpack", or an object with ``decode(data, type)`` and ``encode(value)``); one that
        does not decode is dead-lettered at once as a ``PayloadError`` (docs/handlers.md, "Typed handlers").

        ``middleware``: functions ``mw(msg, call_next)`` around this handler's calls only, inside the app's
        (``@app.middleware``), the first the outermost (docs/handlers.md, "Middleware").
        """
        spec_options = handler_options.basics(
            topic, mode, batch_size, retries, retry_backoff, on_error, soft_time_limit, time_limit
        )
        spec_options["retry_policy"] = handler_options.retry_policy(
            topic, spec_options, retry_backoff_max, retry_jitter, retry_on, no_retry_on
        )
        lane_options = handler_options.lanes(topic, batch, spec_options, concurrency, ordering, window)
        shared_options = handler_options.shared_partitions(
            topic,
            shared,
            range_size,
            pending_timeout,
            max_deliveries,
            batch,
            concurrency,
            spec_options,
            adaptive_ranges,
        )
        if not isinstance(dlq_limit, int) or isinstance(dlq_limit, bool) or dlq_limit < 0:
            raise ConfigError(f"handler for {topic!r}: dlq_limit must be a whole number >= 0, got {dlq_limit!r}")
        limit_options = handler_options.limits(topic, rate_limit, max_age, on_too_old)
        checked_serializer = check_serializer(f"handler for {topic!r}", serializer)
        own_middleware = handler_options.own_middleware(topic, middleware)
        if dlq_limit and shared:
            raise ConfigError(
                f"handler for {topic!r}: dlq_limit releases a partition, which a shared handler never holds; "
                "max_deliveries bounds how often a message is tried"
            )

        def register(function: Handler) -> Handler:
            existing = self.handlers.get(topic)
            if existing is not None:
                same = (existing.declared or existing.function) is function
                what = "is already registered" if same else f"already has {existing.name}"
                raise ConfigError(f"topic {topic!r} {what}: one handler per topic; call the others from it")
            if inspect.isasyncgenfunction(function) or (batch and inspect.iscoroutinefunction(function)):
                raise ConfigError(
                    f"handler for {topic!r}: {'an async generator' if not batch else 'an async def batch handler'} "
                    "is not supported; use an async def handler of one message, or a def batch handler"
                )
            plan = plan_for(function, topic, batch, serializer, Message)
            spec = HandlerSpec(
                topic=topic,
                function=function if plan is None else typed(function, plan, batch),
                batch=batch,
                dlq_limit=dlq_limit,
                **spec_options,
                **lane_options,
                **shared_options,
                **limit_options,
                model=plan,
                declared=None if plan is None else function,
                serializer=checked_serializer,
                middleware=own_middleware,
            )
            for wrapper in (*self.middlewares, *own_middleware):
                check_kind(spec.function, wrapper, f"handler for {topic!r} ({spec.name})")
            self.handlers[topic] = spec
            return function

        return register

    def on_worker_start(self, hook: Hook) -> Hook:
        """Run ``hook()`` in each worker process before its first message (open connections here)."""
        self.worker_start_hooks.append(hook)
        return hook

    def on_worker_stop(self, hook: Hook) -> Hook:
        """Run ``hook()`` in each worker process as it stops (close connections here)."""
        self.worker_stop_hooks.append(hook)
        return hook

    def lifespan(self, function: LifespanFunction) -> LifespanFunction:
        """Run the generator function ``function`` in each worker process: up to its ``yield`` as the worker starts
        (with the on_worker_start hooks, in registration order), the rest as it stops (before the on_worker_stop
        hooks, the last lifespan entered first); a crashed worker's too, while it can still run Python."""
        life = WorkerLifespan(function, "app.lifespan")
        self.worker_start_hooks.append(life.enter)
        self.worker_stop_hooks.insert(0, life.exit)
        return function

    def on_startup(self, hook: Hook) -> Hook:
        """Run ``hook()`` (a def or an async def function) once in the supervisor (``marshal-workers run``), after the
        app is loaded and before anything is claimed; if it raises, the supervisor stops (exit 18)."""
        self.startup_hooks.append(hook)
        return hook

    def on_shutdown(self, hook: Hook) -> Hook:
        """Run ``hook()`` (a def or an async def function) once in the supervisor as it exits, after its workers
        stopped and it released every partition; if it raises, the error is logged."""
        self.shutdown_hooks.append(hook)
        return hook

    def middleware(self, function: Middleware) -> Middleware:
        """Run ``function(msg, call_next)`` around each call of every handler (``msg``: what before_message hooks
        get; ``call_next(msg)`` calls the handler, or the next middleware): the first registered is the outermost.
        ``async def`` handlers need ``async def`` middleware (docs/handlers.md, "Middleware")."""
        check_middleware(function, "app.middleware")
        for spec in self.handlers.values():
            check_kind(spec.function, function, f"handler for {spec.topic!r} ({spec.name})")
        self.middlewares.append(function)
        return function

    def before_message(self, hook: BeforeHook) -> BeforeHook:
        """Run ``hook(msg)`` before each handler call (``msg``: what the handler gets; a list for a batch)."""
        self.hooks.before_message.append(hook)
        return hook

    def after_message(self, hook: AfterHook) -> AfterHook:
        """Run ``hook(msg, outcome, error, seconds)`` after each handler call; ``outcome`` is done, failed, retry,
        ignored or rejected (docs/handlers.md#hooks), ``error`` the exception raised or None."""
        self.hooks.after_message.append(hook)
        return hook

    def on_dead_letter(self, hook: DeadLetterHook) -> DeadLetterHook:
        """Run ``hook(msg, error)`` for each message written to the dead-letter topic."""
        self.hooks.on_dead_letter.append(hook)
        return hook

    def on_partition_claimed(self, hook: PartitionHook) -> PartitionHook:
        """Run ``hook(topic, partition)`` in a worker as it starts on its partition."""
        self.hooks.on_partition_claimed.append(hook)
        return hook

    def on_partition_released(self, hook: PartitionHook) -> PartitionHook:
        """Run ``hook(topic, partition)`` in a worker as it stops on its partition (before on_worker_stop)."""
        self.hooks.on_partition_released.append(hook)
        return hook

    def handler_in_worker(self, topic: str) -> HandlerSpec:
        """The handler of ``topic`` as a worker runs it: inside the middleware, if any, and the message hooks around
        that (they see the call as the worker does: a middleware's skip is done, its translated error the error)."""
        spec = self.handlers[topic]
        hooked = with_message_hooks(with_middleware(spec.function, (*self.middlewares, *spec.middleware)), self.hooks)
        return spec if hooked is spec.function else replace(spec, function=hooked)

    def sends(
        self, topic: str, model: type | None = None, description: str | None = None, serializer: Any = None
    ) -> None:
        """Declare that the app sends to ``topic`` (with ``app.send``), and what: a model (a msgspec Struct, a
        dataclass or a pydantic model) or None.  The AsyncAPI document (``marshal-workers asyncapi``) describes it;
        ``serializer`` (default: that of the app's handler of the topic, else JSON) encodes the models app.send
        sends there.  app.send sends to any topic, declared or not."""
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"app.sends needs a topic name, got {topic!r}")
        if model is not None and not isinstance(model, type):
            raise ConfigError(
                f"app.sends({topic!r}): model must be a class (a msgspec Struct, a dataclass or a "
                f"pydantic model), got {model!r}"
            )
        checked = None if serializer is None else check_serializer(f"app.sends({topic!r})", serializer)
        self.outputs[topic] = OutputSpec(topic, model, description, checked)

    def send(
        self, topic: str, value: Any, key: bytes | str | None = None, headers: Any = None, serializer: Any = None
    ) -> None:
        """Send a message to ``topic``: from a handler (or a worker hook), on the worker's idempotent producer;
        anywhere else (a web endpoint, a script), on this process's own (see ``flush``).

        ``value``: bytes, str (UTF-8), a dict or list (JSON), None, or a model (a msgspec Struct, a dataclass or a
        pydantic model), encoded by ``serializer`` if given, else by the serializer of this app's handler of
        ``topic`` (so that handler decodes it), else as JSON; ``key``: bytes, str or None; ``headers``: a
        dict or a list of (name, value) pairs.  The message is buffered, not waited for: the worker makes sure Kafka
        has it before it reports progress past the message being handled, so under at least once no output is
        lost (an input handled twice sends its output twice).  Outside a worker nothing waits for Kafka until
        ``app.flush()`` (or the process's exit).  See docs/handlers.md, "Producing from handlers".
        """
        outbox = self.outbox or self._process_outbox()
        if is_model_value(value):
            value = self._serializer_for(topic, serializer).encode(value)
        topic, value, key, headers = encode_send(topic, value, key, headers)
        if not tracing.active():
            outbox.send(topic, value, key, headers)
            return
        # A PRODUCER span, the current one's child (a handler call's), in the message's headers: the trace runs on
        # to the consumers of what is sent (docs/operations.md, "Tracing").
        with tracing.sending(topic, key):
            outbox.send(topic, value, key, tracing.with_trace_context(headers))

    def flush(self) -> None:
        """Outside a worker (a web endpoint, a script): wait until Kafka has confirmed every message ``app.send``
        sent from this process; SendError if one was refused or not confirmed within 30 s.  In a worker nothing
        needs it: the worker flushes before it reports progress past a message."""
        outbox = self.outbox or self._own_outbox
        if outbox is not None:
            outbox.flush()

    def close(self) -> None:
        """Outside a worker: deliver what ``app.send`` still holds and close this process's producer (a web server
        shutting down; the process's exit does it too).  A later send opens a new one."""
        with _OWN_OUTBOX_LOCK:
            outbox, self._own_outbox = self._own_outbox, None
        if outbox is not None:
            atexit.unregister(outbox.close)
            outbox.close()

    def _process_outbox(self) -> Outbox:
        """Outside a worker: this process's own producer, created at the first send from the app's settings and the
        environment (MARSHAL_WORKERS_BROKERS, a config file named by MARSHAL_WORKERS_CONFIG); a forked child makes
        its own (a Kafka client does not survive a fork).  What is left at exit is delivered then."""
        with _OWN_OUTBOX_LOCK:
            if self._own_outbox is None or self._own_outbox_pid != os.getpid():
                self._own_outbox = Outbox(load_settings(app_defaults=self.settings))
                self._own_outbox_pid = os.getpid()
                atexit.register(self._own_outbox.close)
            return self._own_outbox

    def _serializer_for(self, topic: str, serializer: Any) -> Any:
        """What encodes a model sent to ``topic``: the one given, else that of our handler of the topic, else JSON."""
        if serializer is not None:
            return check_serializer(f"app.send to {topic!r}", serializer)
        handler, output = self.handlers.get(topic), self.outputs.get(topic)
        if handler is not None:
            return handler.serializer
        return output.serializer if output is not None and output.serializer is not None else BUILT_IN["json"]

    def __repr__(self) -> str:
        return f"App(group={self.group!r}, topics={list(self.topics)})"


def effective_time_limits(handler: HandlerSpec, settings: Settings) -> tuple[float, float]:
    """(soft, hard) limits in seconds for a handler (0: none); the handler's own win over the settings."""
    soft = settings.soft_time_limit if handler.soft_time_limit is None else handler.soft_time_limit
    hard = settings.time_limit if handler.time_limit is None else handler.time_limit
    if soft and hard and soft >= hard:
        raise ConfigError(
            f"handler for {handler.topic!r}: soft_time_limit ({soft:g}s) must be shorter than time_limit "
            f"({hard:g}s), or the soft one never fires"
        )
    return soft, hard
