"""Per-message and per-partition hooks, run in the worker process (Celery's signals, Dramatiq's middleware).

``@app.before_message`` hooks get what the handler gets (a Message; a list for a batch handler) before each
call; ``@app.after_message`` hooks get it after the call with its outcome, the error (or None) and the call's
seconds.  Outcomes:

========== ==============================================================================
done       the handler returned
failed     it raised: the handler's retry policy then retries it or applies on_error
retry      it raised ``Retry``
ignored    it raised ``Ignore``
rejected   it raised ``Reject`` (the message goes to the dead-letter topic)
========== ==============================================================================

``@app.on_dead_letter`` hooks get each message written to the dead-letter topic and its error;
``@app.on_partition_claimed`` / ``@app.on_partition_released`` hooks get (topic, partition) when a worker
starts on a partition and when it stops (workers of shared partitions hold no partition: they call neither).

A hook that raises is logged and otherwise ignored: tracing or bookkeeping must not stop the work.  With no
message hook registered the handler is not wrapped at all (nothing on the hot path).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from marshal_workers.handlers.signals import Ignore, Reject, Retry

_log = logging.getLogger(__name__)

BeforeHook = Callable[[Any], None]
AfterHook = Callable[[Any, str, BaseException | None, float], None]
DeadLetterHook = Callable[[Any, BaseException], None]
PartitionHook = Callable[[str, int], None]


@dataclass
class Hooks:
    """The hooks an App registered, in registration order."""

    before_message: list[BeforeHook] = field(default_factory=list)
    after_message: list[AfterHook] = field(default_factory=list)
    on_dead_letter: list[DeadLetterHook] = field(default_factory=list)
    on_partition_claimed: list[PartitionHook] = field(default_factory=list)
    on_partition_released: list[PartitionHook] = field(default_factory=list)


def outcome_of(error: BaseException | None) -> str:
    """The outcome an after_message hook is told for a call that raised ``error`` (None: it returned)."""
    if error is None:
        return "done"
    if isinstance(error, Retry):
        return "retry"
    if isinstance(error, Ignore):
        return "ignored"
    if isinstance(error, Reject):
        return "rejected"
    return "failed"


def run_hooks(hooks: Iterable[Callable[..., None]], *args: Any) -> None:
    """Call each hook; one that raises is logged, and the others still run."""
    for hook in hooks:
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - a user's hook may raise anything: logged, and the others still run
            _failed(hook)


def with_message_hooks(function: Callable[[Any], Any], hooks: Hooks) -> Callable[[Any], Any]:
    """``function`` wrapped to run the before/after message hooks around each call (itself if there are none).

    The hot path of a worker with hooks: the before loop is inlined (no helper call per message), and with no
    after_message hook the call is made directly, without reading the clock.
    """
    before, after = tuple(hooks.before_message), tuple(hooks.after_message)
    if not before and not after:
        return function
    clock = time.perf_counter

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def call_async(argument: Any) -> Any:
            run_hooks(before, argument)
            if not after:
                return await function(argument)
            started = clock()
            try:
                result = await function(argument)
            except BaseException as exc:
                run_hooks(after, argument, outcome_of(exc), exc, clock() - started)
                raise
            run_hooks(after, argument, "done", None, clock() - started)
            return result

        return call_async

    if len(before) == 1 and not after:
        # The common case (a tracer, a session): one hook, no loop and no clock, as close to a bare call as Python
        # gets (bench_run.py's "f" against "c").
        (only,) = before

        @functools.wraps(function)
        def call_after_one_hook(argument: Any) -> Any:
            try:
                only(argument)
            except Exception:  # noqa: BLE001 - a user's hook may raise anything: logged, and the handler still runs
                _failed(only)
            return function(argument)

        return call_after_one_hook

    @functools.wraps(function)
    def call(argument: Any) -> Any:
        for hook in before:
            try:
                hook(argument)
            except Exception:  # noqa: BLE001 - a user's hook may raise anything: logged, and the handler still runs
                _failed(hook)
        if not after:
            return function(argument)
        started = clock()
        try:
            result = function(argument)
        except BaseException as exc:
            run_hooks(after, argument, outcome_of(exc), exc, clock() - started)
            raise
        seconds = clock() - started
        for after_hook in after:
            try:
                after_hook(argument, "done", None, seconds)
            except Exception:  # noqa: BLE001 - a user's hook may raise anything: logged, the result kept
                _failed(after_hook)
        return result

    return call


def hook_name(function: Any) -> str:
    """``module.qualname`` of a hook or middleware, for the log and errors."""
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"


def _failed(hook: Callable[..., None]) -> None:
    _log.exception("hook %s failed", getattr(hook, "__qualname__", hook))
