"""An ``async def`` handler called where there is no event loop of the worker's own: a shared worker (one message
per call) and Spark replay's tasks.  Each call runs to its end on one event loop of the process, so the handler is
awaited, its failures go through the failure path like any, and its loop-bound clients (made on the first call)
work on the next.  Partition workers run ``async def`` handlers on lanes instead (runtime/worker/executors.py)."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace
from typing import Any

from marshal_workers.handlers.app import HandlerSpec


def blocking(handler: HandlerSpec) -> HandlerSpec:
    """``handler`` with each call of an ``async def`` function run to its end; any other as it is."""
    if not handler.is_async:
        return handler
    function, loop = handler.function, asyncio.new_event_loop()

    @functools.wraps(function)
    def run_to_end(argument: Any) -> Any:
        return loop.run_until_complete(function(argument))

    return replace(handler, function=run_to_end)
