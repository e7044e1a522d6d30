"""A handler's options, checked as ``@app.handler`` is applied: each mistake refused at import time, naming the
topic and the option, with what to do instead (docs/handlers.md), so a bad application never reaches a fork.
Each function checks one group of the options and returns what HandlerSpec keeps of them."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from marshal_workers.core.durations import parse_duration, parse_limit
from marshal_workers.errors import ConfigError
from marshal_workers.handlers.message_age import OnTooOld
from marshal_workers.handlers.middleware import Middleware, check_middleware
from marshal_workers.handlers.rate_limits import parse_rate
from marshal_workers.handlers.retry_policy import RetryPolicy
from marshal_workers.protocol.done_set import MAX_RUNS
from marshal_workers.protocol.lanes import Ordering
from marshal_workers.protocol.range_leases import MAX_LEASE_MS

MAX_RANGE_SIZE = 10_000  # offsets per lease: a crash acks them all as failed in one record, which must stay small


class Mode(str, enum.Enum):
    ALO = "alo"  # at least once: process, then report progress
    AMO = "amo"  # at most once: claim a batch in the coordination log, then process it


class OnError(str, enum.Enum):
    DLQ = "dlq"  # after the retries, write the message to <topic>.dlq and go on
    RELEASE = "release"  # after the retries, stop and release the partition at that message


def basics(
    topic: str,
    mode: str,
    batch_size: int,
    retries: int,
    retry_backoff: float | str,
    on_error: str,
    soft_time_limit: float | str | None,
    time_limit: float | str | None,
) -> dict[str, Any]:
    """mode, batch_size, retries, retry_backoff, on_error and the time limits, checked."""
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"a handler needs a topic name, got {topic!r}")
    try:
        parsed_mode = Mode(mode)
    except ValueError:
        raise ConfigError(f"handler for {topic!r}: mode must be 'alo' or 'amo', got {mode!r}") from None
    try:
        parsed_on_error = OnError(on_error)
    except ValueError:
        raise ConfigError(f"handler for {topic!r}: on_error must be 'dlq' or 'release', got {on_error!r}") from None
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"handler for {topic!r}: batch_size must be a whole number >= 1, got {batch_size!r}")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ConfigError(f"handler for {topic!r}: retries must be a whole number >= 0, got {retries!r}")
    return {
        "mode": parsed_mode,
        "batch_size": batch_size,
        "retries": retries,
        "retry_backoff": _duration(topic, "retry_backoff", retry_backoff, parse_duration),
        "on_error": parsed_on_error,
        "soft_time_limit": _time_limit(topic, "soft_time_limit", soft_time_limit),
        "time_limit": _time_limit(topic, "time_limit", time_limit),
    }


def retry_policy(
    topic: str,
    options: dict[str, Any],
    backoff_max: float | str,
    jitter: bool,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    no_retry_on: type[BaseException] | tuple[type[BaseException], ...],
) -> RetryPolicy:
    if not isinstance(jitter, bool):
        raise ConfigError(f"handler for {topic!r}: retry_jitter must be True or False, got {jitter!r}")
    return RetryPolicy(
        retries=options["retries"],
        backoff=options["retry_backoff"],
        backoff_max=_duration(topic, "retry_backoff_max", backoff_max, parse_duration),
        jitter=jitter,
        retry_on=_exception_types(topic, "retry_on", retry_on),
        no_retry_on=_exception_types(topic, "no_retry_on", no_retry_on),
    )


def _exception_types(topic: str, name: str, value: Any) -> tuple[type[BaseException], ...]:
    """An exception class or a tuple of them, as ``except`` takes them."""
    found = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in found):
        raise ConfigError(
            f"handler for {topic!r}: {name} must be an exception class or a tuple of them, e.g. "
            f"{name}=(ConnectionError, TimeoutError); got {value!r}"
        )
    return found


# Default window: room for every lane to run and plenty queued behind a slow message, within the done-set bound.
_WINDOW_PER_LANE = 16
_MIN_WINDOW = 1024


def lanes(
    topic: str, batch: bool, options: dict[str, Any], concurrency: int, ordering: str | None, window: int | None
) -> dict[str, Any]:
    """concurrency, ordering and window checked together: a wrong combination is refused with what to do."""
    where = f"handler for {topic!r}"
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 4096:
        raise ConfigError(f"{where}: concurrency must be a whole number in [1, 4096], got {concurrency!r}")
    if ordering is None:  # key order where it means something, else one at a time
        parsed = Ordering.PARTITION if concurrency == 1 else (Ordering.NONE if batch else Ordering.KEY)
    else:
        try:
            parsed = Ordering(ordering)
        except ValueError:
            raise ConfigError(f"{where}: ordering must be 'key', 'none' or 'partition', got {ordering!r}") from None
        if concurrency == 1 and parsed is not Ordering.PARTITION:
            raise ConfigError(
                f"{where}: ordering={ordering!r} needs concurrency > 1 (with concurrency=1 messages run one at a "
                "time in offset order); set concurrency=N, or drop ordering"
            )
        if concurrency > 1 and parsed is Ordering.PARTITION:
            raise ConfigError(
                f"{where}: ordering='partition' runs one message at a time; drop concurrency, or use "
                "ordering='key' (same-key messages in order) or 'none'"
            )
        if batch and parsed is Ordering.KEY:
            raise ConfigError(
                f"{where}: a batch handler cannot keep key order across batches in flight; use ordering='none', "
                "or a message handler with ordering='key'"
            )
    batch_size: int = options["batch_size"]
    in_flight = concurrency * (batch_size if batch else 1)
    # At most once claims a whole fetch (batch_size) before dispatching it: the window must hold it.
    least = max(in_flight, batch_size if options["mode"] is Mode.AMO else 1)
    if window is None:
        window = max(least, min(MAX_RUNS, max(_MIN_WINDOW, _WINDOW_PER_LANE * in_flight)))
    if not isinstance(window, int) or isinstance(window, bool) or not least <= window <= MAX_RUNS:
        raise ConfigError(
            f"{where}: window must be a whole number in [{least}, {MAX_RUNS}] (at least the messages in flight"
            f"{' and an AMO claim of batch_size' if options['mode'] is Mode.AMO else ''}), got {window!r}"
            + ("; lower batch_size or concurrency" if least > MAX_RUNS else "")
        )
    return {"concurrency": concurrency, "ordering": parsed, "window": window}


def shared_partitions(
    topic: str,
    shared: bool,
    range_size: int,
    pending_timeout: float | str,
    max_deliveries: int,
    batch: bool,
    concurrency: int,
    options: dict[str, Any],
    adaptive_ranges: bool = True,
) -> dict[str, Any]:
    """The shared-partition options, checked: refused with what to do instead."""
    where = f"handler for {topic!r}"
    if not isinstance(shared, bool):
        raise ConfigError(f"{where}: shared must be True or False, got {shared!r}")
    if not isinstance(range_size, int) or isinstance(range_size, bool) or not 1 <= range_size <= MAX_RANGE_SIZE:
        raise ConfigError(f"{where}: range_size must be a whole number in [1, {MAX_RANGE_SIZE}], got {range_size!r}")
    if not isinstance(adaptive_ranges, bool):
        raise ConfigError(
            f"{where}: adaptive_ranges must be True (ranges sized from the handler's measured rate, range_size the "
            f"first size) or False (every range range_size offsets), got {adaptive_ranges!r}"
        )
    if not isinstance(max_deliveries, int) or isinstance(max_deliveries, bool) or max_deliveries < 1:
        raise ConfigError(f"{where}: max_deliveries must be a whole number >= 1, got {max_deliveries!r}")
    timeout = _duration(topic, "pending_timeout", pending_timeout, parse_duration)
    if not 1.0 <= timeout <= MAX_LEASE_MS / 1000:
        raise ConfigError(f"{where}: pending_timeout must be between 1s and 24h, got {pending_timeout!r}")
    if shared and (batch or concurrency > 1):
        raise ConfigError(
            f"{where}: a shared handler takes one message per call in each worker; drop batch/concurrency and "
            "raise --processes (workers per supervisor) instead"
        )
    if shared and options["on_error"] is OnError.RELEASE:
        raise ConfigError(
            f"{where}: on_error='release' releases a whole partition, which a shared handler never holds; "
            "failures are delivered again up to max_deliveries, then dead-lettered"
        )
    return {
        "shared": shared,
        "range_size": range_size,
        "adaptive_ranges": adaptive_ranges,
        "pending_timeout": timeout,
        "max_deliveries": max_deliveries,
    }


def limits(topic: str, rate_limit: float | str | None, max_age: float | str | None, on_too_old: str) -> dict[str, Any]:
    """rate_limit, max_age and on_too_old, checked."""
    where = f"handler for {topic!r}"
    rate = None
    if rate_limit is not None:
        try:
            rate = parse_rate(rate_limit)
        except ConfigError as exc:
            raise ConfigError(f"{where}: rate_limit: {exc}") from None
    age = None if max_age is None else _duration(topic, "max_age", max_age, parse_duration)
    try:
        parsed = OnTooOld(on_too_old)
    except ValueError:
        raise ConfigError(f"{where}: on_too_old must be 'skip' or 'dlq', got {on_too_old!r}") from None
    if parsed is not OnTooOld.SKIP and age is None:
        raise ConfigError(
            f"{where}: on_too_old={on_too_old!r} needs max_age (e.g. max_age='1h'): no message is too old"
        )
    return {"rate_limit": rate, "max_age": age, "on_too_old": parsed}


def own_middleware(topic: str, middleware: Any) -> tuple[Middleware, ...]:
    """A handler's own middleware: one function or a list of them, each checked."""
    given = (middleware,) if callable(middleware) else middleware
    if not isinstance(given, (list, tuple)):
        raise ConfigError(
            f"handler for {topic!r}: middleware must be a function mw(msg, call_next) or a list of them, "
            f"got {middleware!r}"
        )
    return tuple(check_middleware(m, f"handler for {topic!r}") for m in given)


def _time_limit(topic: str, name: str, value: float | str | None) -> float | None:
    """None (not given: the setting of the same name applies), 0 (none) or seconds."""
    return None if value is None else _duration(topic, name, value, parse_limit)


def _duration(topic: str, name: str, value: float | str, parse: Callable[[Any], float]) -> float:
    try:
        return parse(value)
    except ConfigError as exc:
        raise ConfigError(f"handler for {topic!r}: {name}: {exc}") from None
