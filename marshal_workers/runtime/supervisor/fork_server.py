"""The fork server every worker comes from, forked from the supervisor rather than started as a new Python.

librdkafka is not fork-safe, so workers are forked from a server that exists before any Kafka client does:
``multiprocessing``'s fork server, the application preloaded.  The standard library starts that server (and
its resource tracker) as a new interpreter, which imports the package and the application again: about a
quarter of a CPU-second per supervisor start, as much as the rest of the start-up after the imports
(docs/benchmarks.md).  The supervisor has imported all of it already, so we fork it instead and run the very
command the new interpreter would have run.  The forked copy is made to look like a new interpreter where that
matters: only the file descriptors the server was given stay open, and no signal handler of the supervisor's
stays installed.

Forking is safe only while the supervisor has a single thread; with more (a thread an imported module started)
the server is started the standard way, as a new interpreter.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.context import BaseContext

import setproctitle

from marshal_workers.handlers.loader import split_app_path

PRELOAD = ("marshal_workers.runtime.worker.forkserver_preload", "marshal_workers.runtime.worker.worker")
"""Imported by the fork server before the app's module; the first names the process and makes it ignore SIGTERM
(so the supervisor must never import it itself)."""

_STANDARD_SPAWN = multiprocessing.util.spawnv_passfds


def start_fork_server(app_path: str) -> BaseContext:
    """The fork server every worker comes from, the application preloaded: start it before any Kafka client."""
    context = multiprocessing.get_context("forkserver")
    module, _ = split_app_path(app_path)
    context.set_forkserver_preload([*PRELOAD, module])
    if threading.active_count() == 1:
        with _new_interpreters_forked():
            multiprocessing.forkserver.ensure_running()
    else:
        multiprocessing.forkserver.ensure_running()
    return context


@contextmanager
def _new_interpreters_forked() -> Iterator[None]:
    """While inside, the helper processes ``multiprocessing`` starts (its fork server, its resource tracker) are
    forks of this process instead of new interpreters.  Both start through ``util.spawnv_passfds``."""
    multiprocessing.util.spawnv_passfds = fork_running  # type: ignore[assignment]
    try:
        yield
    finally:
        multiprocessing.util.spawnv_passfds = _STANDARD_SPAWN


def fork_running(_path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """Fork, and run in the child the ``-c`` command of ``args`` with only ``passfds`` open; return its pid.

    The signature and the contract are ``multiprocessing.util.spawnv_passfds``'s, whose ``args`` are a Python
    command line ending with ``-c`` and the command: running that command in a fork of a process that has the
    modules imported is what the new interpreter would have done, without importing them again.
    """
    command = args[list(args).index("-c") + 1]
    sys.stdout.flush()  # or the child would write what was buffered here again
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _look_like_a_new_interpreter(passfds)
        setproctitle.setproctitle(f"marshal-workers: {_helper_name(command)}")  # not the supervisor's command line
        exec(command, {"__name__": "__fork_server__"})  # noqa: S102 - the standard library's own command
        code = 0
    except SystemExit as stop:  # the fork server's way out: the supervisor is gone
        code = stop.code if isinstance(stop.code, int) else 0
    except BaseException:  # noqa: BLE001 - said on stderr, then the child ends
        traceback.print_exc()
    finally:
        os._exit(code)  # never the supervisor's atexit handlers or its buffered output


def _helper_name(command: str) -> str:
    """``from multiprocessing.resource_tracker import main; ...`` -> ``resource tracker``."""
    module = re.search(r"from multiprocessing\.(\w+) import", command)
    return module.group(1).replace("_", " ") if module else "multiprocessing helper"


def _look_like_a_new_interpreter(passfds: Sequence[int]) -> None:
    """Only stdio and ``passfds`` open, every signal at the disposition a new interpreter would start with,
    ``multiprocessing``'s own way of starting helpers back, and its fork server's lock free (we were forked while
    it was held)."""
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if callable(signal.getsignal(signum)):  # a Python handler of the supervisor's: exec() would reset it
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    _close_fds_except(passfds)
    # Forked inside _new_interpreters_forked(): what the fork server's workers start must be new interpreters.
    multiprocessing.util.spawnv_passfds = _STANDARD_SPAWN
    # connect_to_new_process() takes this lock: a handler that starts a forkserver process of its own would wait
    # on it for ever.  The standard library offers no other way to free it.
    lock = getattr(multiprocessing.forkserver._forkserver, "_lock", None)
    if lock is not None and lock.locked():
        lock.release()


def _close_fds_except(keep: Sequence[int]) -> None:
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
