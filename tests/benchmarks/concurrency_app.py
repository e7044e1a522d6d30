"""The application bench_concurrency.py runs: one handler, configured by environment variables.

MW_BENCH_TOPIC, MW_BENCH_CONCURRENCY, MW_BENCH_KIND (io-def | io-async | cpu), MW_BENCH_TOTAL (messages
to wait for), MW_BENCH_RESULT (file). When the handler has returned MW_BENCH_TOTAL times, the worker writes
one line to the result file: the first call's start, the last call's end (time.time()) and its CPU seconds
(user + system, whole process, since it started).
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import threading
import time

from marshal_workers import App, Message

app = App()
TOTAL = int(os.environ.get("MW_BENCH_TOTAL", "10000"))
RESULT = os.environ.get("MW_BENCH_RESULT", os.devnull)
KIND = os.environ.get("MW_BENCH_KIND", "io-def")
CPU_LOOPS = 20_000  # about 1 ms of pure Python on this machine
_lock = threading.Lock()
_first_start: float | None = None
_count = 0


def _started() -> None:
    global _first_start
    if _first_start is None:
        _first_start = time.time()


def _finished() -> None:
    global _count
    with _lock:
        _count += 1
        if _count != TOTAL:
            return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(RESULT, "w") as out:
        out.write(f"{_first_start} {time.time()} {usage.ru_utime + usage.ru_stime}\n")


def io_def(msg: Message) -> None:
    _started()
    time.sleep(random.uniform(0, 0.005))
    _finished()


async def io_async(msg: Message) -> None:
    _started()
    await asyncio.sleep(random.uniform(0, 0.005))
    _finished()


def cpu(msg: Message) -> None:
    _started()
    total = 0
    for n in range(CPU_LOOPS):
        total += n * n
    _finished()


concurrency = int(os.environ.get("MW_BENCH_CONCURRENCY", "1"))
handler = {"io-def": io_def, "io-async": io_async, "cpu": cpu}[KIND]
app.handler(os.environ.get("MW_BENCH_TOPIC", "bench"), concurrency=concurrency)(handler)
