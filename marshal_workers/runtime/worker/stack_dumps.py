"""SIGUSR2 in a worker: every thread's stack to stderr (the supervisor's log), under a heading that says whose.

The supervisor passes its SIGUSR2 on to each worker; their dumps land in the one log, one after the other, so
each starts with a heading: the worker's pid, group, topic and partition (and the offset it is at), which a
bare faulthandler dump does not say.

The dump is written by a thread of its own, woken through the signal wake-up fd (written by Python's C-level
signal handler, whichever thread the signal lands on), not by a Python signal handler, which runs only when the
main thread gets back to Python code: a handler stuck in a C library call that retries on EINTR (a database
driver, say) would never see it.  Only a call that holds the interpreter lock all along (a long computation
in C) holds the dump up until it lets go.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable

Heading = Callable[[], str]


def worker_heading(pid: int, group: str, topic: str, partition: int | None, detail: str = "") -> str:
    """The line above a worker's stacks; ``partition`` None: a shared worker between ranges."""
    where = f"topic {topic}" if partition is None else f"topic {topic} partition {partition}"
    return f"SIGUSR2: stacks of worker pid {pid}, group {group}, {where}{f', {detail}' if detail else ''}:"


def dump_stacks_on_sigusr2(heading: Heading) -> None:
    """From now on, SIGUSR2 writes ``heading()`` and every thread's stack to stderr.  Call from the main thread
    (signal handlers are set there), once per process: it takes the process's signal wake-up fd."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C-level handler must never block
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)  # every handled signal's number, one byte each
    signal.signal(signal.SIGUSR2, _nothing)  # a Python-level handler, so that the signal is written there
    threading.Thread(target=_dump_when_woken, args=(read_fd, heading), name="stack-dump", daemon=True).start()


def _nothing(_signum: int, _frame: object) -> None:
    pass  # the stack-dump thread does the work


def _dump_when_woken(read_fd: int, heading: Heading) -> None:
    while True:
        try:
            woken = os.read(read_fd, 64)
        except OSError:
            return
        if not woken:
            return
        for _ in range(woken.count(signal.SIGUSR2)):  # the other signals' bytes (SIGTERM, SIGALRM) are not ours
            dump_stacks(heading())


def dump_stacks(heading: str) -> None:
    """``heading``, then every thread's stack, on stderr."""
    sys.stderr.write(heading + "\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
