"""The app's life: ``@app.on_startup`` / ``@app.on_shutdown`` once in the supervisor process, ``@app.lifespan`` once
in each worker process (FastStream's on_startup, on_shutdown and lifespan; Celery's worker_process_init/shutdown).

* on_startup hooks run in registration order after the app is loaded and before the supervisor claims anything; one
  that raises stops the start-up (AppStartupError, its own exit code) and the later ones do not run.
* on_shutdown hooks run in registration order once the supervisor has stopped: every worker stopped, every partition
  released.  They run whenever every on_startup hook did (a start-up that fails later, on Kafka, included); one that
  raises is logged and the others still run: the exit code stays what the stop made it.
* A lifespan is a generator function with one ``yield``: the code before it runs as the worker starts (with the
  on_worker_start hooks, in registration order), the code after it as the worker stops (before the on_worker_stop
  hooks, the last entered first), a crashed worker's too while it can still run Python.

Startup and shutdown hooks may be ``async def``: each is run to its end on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from marshal_workers.errors import AppStartupError, ConfigError
from marshal_workers.handlers.hooks import hook_name

_log = logging.getLogger(__name__)

LifespanFunction = Callable[[], Iterator[Any]]


class WorkerLifespan:
    """A lifespan generator function as a pair of worker hooks: ``enter`` on start, ``exit`` on stop.

    What it entered is kept per process (a worker is a process of its own), on a stack: an ``exit`` with nothing
    entered does nothing (a start that failed before it, or a second stop)."""

    def __init__(self, function: LifespanFunction, where: str) -> None:
        if not inspect.isgeneratorfunction(function):
            kind = "an async generator" if inspect.isasyncgenfunction(function) else repr(function)
            raise ConfigError(
                f"{where} takes a generator function with one yield (open what the worker needs, yield, close it), "
                f"got {kind}: a worker's hooks run outside any event loop"
            )
        self._manager = contextlib.contextmanager(function)
        self._entered: list[contextlib.AbstractContextManager[Any]] = []

    def enter(self) -> None:
        manager = self._manager()
        manager.__enter__()  # a failure here is the worker's start failing, as an on_worker_start hook's is
        self._entered.append(manager)

    def exit(self) -> None:
        if self._entered:
            self._entered.pop().__exit__(None, None, None)


def run_startup_hooks(hooks: Iterable[Callable[[], Any]]) -> None:
    """Each on_startup hook in turn; AppStartupError naming the first that raised (its traceback logged)."""
    for hook in hooks:
        try:
            _run(hook)
        except Exception as exc:
            _log.exception("on_startup hook %s failed", hook_name(hook))
            raise AppStartupError(
                f"on_startup hook {hook_name(hook)} failed ({type(exc).__name__}: {exc}): nothing was claimed"
            ) from exc


def run_shutdown_hooks(hooks: Iterable[Callable[[], Any]]) -> None:
    """Each on_shutdown hook; one that raises is logged and the others still run."""
    for hook in hooks:
        try:
            _run(hook)
        except Exception:  # noqa: BLE001 - one hook's failure must not keep the others from closing what they opened
            _log.exception("on_shutdown hook %s failed", hook_name(hook))


def _run(hook: Callable[[], Any]) -> None:
    result = hook()
    if inspect.iscoroutine(result):  # an async def hook: run to its end on a loop of its own
        asyncio.run(result)
