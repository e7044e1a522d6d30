"""Wrap-around middleware: ``mw(msg, call_next)`` around each handler call (FastStream's middleware, Dramatiq's
``before/after_process_message`` in one function).

``msg`` is what ``before_message`` hooks get: the Message (a list of them for a batch handler), before a typed
handler's payload is decoded; ``call_next(msg)`` runs the rest of the chain (the next middleware, at the end the
handler, decoding first) and returns what it returns.  A middleware may run code before and after, time the call,
set context, catch an exception and raise another (what escapes is the call's error: retries and dead letters
apply to it), or return without calling ``call_next`` (the message is then handled: done).

Middlewares nest in registration order: the app's first registered is the outermost, a handler's own
(``@app.handler(..., middleware=[...])``) are inside the app's.  An ``async def`` handler needs ``async def``
middleware (``await call_next(msg)``) and a ``def`` handler ``def`` middleware: a mismatch is a ConfigError when
the second of the pair is registered.  The chain is built once per worker; each layer passes the next one itself
as ``call_next``, so a call costs one Python call per middleware and nothing else (docs/handlers.md, "Middleware").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from marshal_workers.errors import ConfigError
from marshal_workers.handlers.hooks import hook_name

Middleware = Callable[[Any, Callable[[Any], Any]], Any]


def check_middleware(middleware: Any, where: str) -> Middleware:
    """``middleware`` if it can be called as ``mw(msg, call_next)``; else a ConfigError saying what to write."""
    if not callable(middleware):
        raise ConfigError(f"{where}: middleware must be a function mw(msg, call_next), got {middleware!r}")
    try:
        inspect.signature(middleware).bind(None, None)
    except TypeError:
        raise ConfigError(
            f"{where}: middleware {hook_name(middleware)} must take two arguments, (msg, call_next)"
        ) from None
    except ValueError:
        pass  # a builtin without a signature: it gets its chance at the first call
    return middleware


def check_kind(function: Callable[..., Any], middleware: Middleware, where: str) -> None:
    """A ConfigError if ``middleware`` cannot wrap ``function``: an ``async def`` one around a ``def`` handler, or the
    other way round (a ``def`` middleware would get the handler's coroutine back before it has run)."""
    handler_async, middleware_async = inspect.iscoroutinefunction(function), inspect.iscoroutinefunction(middleware)
    if handler_async and not middleware_async:
        raise ConfigError(
            f"{where} is async def, but middleware {hook_name(middleware)} is a def function: write it as "
            "`async def mw(msg, call_next): ... return await call_next(msg)`, or give it only to the def handlers "
            "with @app.handler(..., middleware=[mw])"
        )
    if middleware_async and not handler_async:
        raise ConfigError(
            f"{where} is a def function, but middleware {hook_name(middleware)} is async def: write it as "
            "`def mw(msg, call_next): ... return call_next(msg)`, or give it only to the async def handlers "
            "with @app.handler(..., middleware=[mw])"
        )


def with_middleware(function: Callable[[Any], Any], middlewares: Sequence[Middleware]) -> Callable[[Any], Any]:
    """``function`` inside ``middlewares``, the first the outermost (itself if there are none).  Each layer keeps the
    handler's name (logs, dead letters) and kind (an async handler stays a coroutine function, for the lanes)."""
    wrapped = function
    for middleware in reversed(middlewares):
        wrapped = _layer(middleware, wrapped, function)
    return wrapped


def _layer(
    middleware: Middleware, call_next: Callable[[Any], Any], handler: Callable[..., Any]
) -> Callable[[Any], Any]:
    if inspect.iscoroutinefunction(call_next):

        @functools.wraps(handler)
        async def call_async(argument: Any) -> Any:
            return await middleware(argument, call_next)

        return call_async

    @functools.wraps(handler)
    def call(argument: Any) -> Any:
        return middleware(argument, call_next)

    return call
