"""A worker process's first and last steps, the same for both kinds (a partition's worker, worker.py, and a shared
worker, shared_worker.py): how it starts (logging, dying with its parent, its signals), takes up its handler,
finishes (hooks, sends, dead letters, consumer) and exits."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from marshal_workers.core import tracing
from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import configure_logging
from marshal_workers.errors import SendError
from marshal_workers.handlers.app import App, HandlerSpec
from marshal_workers.handlers.loader import load_app
from marshal_workers.handlers.rate_limits import Throttle
from marshal_workers.kafka.dead_letter_writer import DeadLetterWriter
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.runtime.worker.stack_dumps import dump_stacks_on_sigusr2

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class TakenUp:
    """The handler a worker runs, with the limits it puts on each message."""

    handler: HandlerSpec
    throttle: Throttle | None  # its rate_limit, through the shared bucket; None: no limit
    max_age_ms: int  # its max_age; 0: none


def start_process(settings: Settings, stack_dump_heading: Callable[[], str], on_stop: Callable[[], None]) -> None:
    """Logging, death with the parent, the stacks on SIGUSR2 (sent by the supervisor on its own SIGUSR2), a stop on
    SIGTERM (``on_stop``, in a signal handler), and Ctrl-C ignored: it reaches the supervisor, which stops us in
    order."""
    configure_logging(settings.log_level, settings.log_format)
    lower_priority(settings.worker_nice)
    die_with_parent()
    dump_stacks_on_sigusr2(stack_dump_heading)

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        on_stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class ProcessEdges:
    """What a worker process (of either kind) takes from outside itself: its process-wide start (start_process),
    its app, its reader of Kafka and its dead-letter writer.  The defaults are the real ones; unit tests pass
    fakes to run a worker's shell in the test's own process, without a broker (tests/unit/runtime/worker)."""

    start: Callable[[Settings, Callable[[], str], Callable[[], None]], None] = start_process
    load: Callable[[str], App] = load_app
    consumer: Callable[..., GuardedConsumer] = GuardedConsumer  # called as GuardedConsumer(config, what, hb, ...)
    dead_letters: Callable[[Settings], DeadLetterWriter] = DeadLetterWriter


REAL_EDGES = ProcessEdges()


def exit_process(code: WorkerExit) -> None:
    """Exit now, without joining threads: a handler call stuck in a thread (concurrency) must not keep the process
    alive once the worker is done, nor keep the fork server alive after the supervisor died (every child of the fork
    server holds its keep-alive pipe)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def lower_priority(increment: int) -> None:
    """Run ``increment`` below the supervisor's CPU priority (``worker_nice``): the supervisor is the fleet's control
    plane (its heartbeats keep the partitions' leases, its claims and releases hand them over) and uses little CPU, so
    it goes first when the handlers keep every core busy.  Sampled during a fault storm, 2 to 9 of the workers'
    threads were runnable while a restarted supervisor imported its modules (docs/operations.md, "Priorities")."""
    if increment:
        try:
            os.nice(increment)
        except OSError:  # not permitted here: the same priority, as before
            pass


def die_with_parent() -> None:
    """SIGKILL when the fork server dies, which it does as soon as the supervisor dies."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe EOF check still catches it
    if os.getppid() != parent:
        os._exit(WorkerExit.SUPERVISOR_GONE)


def take_up_handler(app: App, topic: str, outbox: Outbox, rate_bucket: Any, settings: Settings) -> TakenUp:
    """The handler a worker (of either kind) runs, and what it needs from the app: app.send's outbox, the rate
    limit's shared bucket and the age limit; a span around each call if tracing is configured (core/tracing.py,
    set up here, after fork and after the app is loaded: a provider the app set counts)."""
    handler = app.handler_in_worker(topic)
    if tracing.start_in_worker():
        function = tracing.traced(handler.function, topic, handler.batch, settings.require_group(), settings.client_id)
        handler = replace(handler, function=function)
    app.outbox = outbox
    throttle = Throttle(rate_bucket, handler.rate_limit) if handler.rate_limit and rate_bucket is not None else None
    return TakenUp(handler, throttle, round(handler.max_age * 1000) if handler.max_age else 0)


def finish_worker(
    app: App | None, log: Any, dlq: DeadLetterWriter, consumer: GuardedConsumer | None, outbox: Outbox
) -> None:
    """A worker's last steps (both kinds): the on_worker_stop hooks, then its sends, dead letters and consumer
    closed."""
    for hook in app.worker_stop_hooks if app else []:
        try:
            hook()
        except Exception:
            log.exception("on_worker_stop hook failed")
    outbox.close(log)
    dlq.close()
    if consumer is not None:
        consumer.close()
    if tracing.active():
        tracing.flush()  # the spans still buffered, before the process exits (os._exit skips atexit)


def send_failed(log: Any, error: SendError) -> WorkerExit:
    """A handler's output was not confirmed: exit as a crash, progress still before the input it came from."""
    log.error(
        "a message sent by a handler was not confirmed (%s): the worker stops without reporting progress past "
        "its input, which is handled again",
        error,
    )
    return WorkerExit.SEND_FAILED
