"""The application that tests/benchmarks/bench_shared.py runs: one handler, shared or not.

MW_BENCH_TOPIC, MW_BENCH_SHARED (1: shared=True), MW_BENCH_RANGE_SIZE, MW_BENCH_ADAPTIVE (0: fixed ranges), MW_BENCH_DELAY (seconds slept per
message: a slow handler; 0: parse the JSON value, the fast handler of bench_run.py), MW_BENCH_OUT (a
directory).  Each worker process writes ``<pid>``: "count first_time last_time" of what it handled, every
0.1 s from a thread, so the benchmark sums them without the handler doing I/O per message.  With
MW_BENCH_LATENCY=1 it also writes ``<pid>.lat``: a JSON list of each message's end-to-end latency (handled
time minus its Kafka timestamp, ms; bench_serve.py).  With MW_BENCH_OFFSETS=1 it appends each handled message's
"partition offset" line to ``<pid>.offsets`` at once (one write per message, so a kill -9 loses none: the crash
section of bench_shared.py counts repeats from them).  With MW_BENCH_PROFILE=DIR each worker runs cProfile on
its main thread (the loop and the handler) and writes ``DIR/<pid>.prof`` every 100,000 messages (read it with
``python -m pstats``): where a worker's time goes, by function.
"""

from __future__ import annotations

import cProfile
import json
import os
import threading
import time
from pathlib import Path

from marshal_workers import App, Message

app = App()
TOPIC = os.environ.get("MW_BENCH_TOPIC", "bench")
DELAY = float(os.environ.get("MW_BENCH_DELAY", "0"))
OUT = Path(os.environ.get("MW_BENCH_OUT", "/tmp"))
_handled = [0, 0.0, 0.0]  # count, first, last (wall time)
LATENCY = os.environ.get("MW_BENCH_LATENCY") == "1"
_latencies: list[float] = []
OFFSETS = os.environ.get("MW_BENCH_OFFSETS") == "1"
_offsets_file: list[int] = []  # the file descriptor, once open
PROFILE = os.environ.get("MW_BENCH_PROFILE")
_profiler = cProfile.Profile() if PROFILE else None


def _report() -> None:
    path, temporary = OUT / str(os.getpid()), OUT / f".{os.getpid()}"
    while True:
        time.sleep(0.1)
        if _handled[0]:
            temporary.write_text(f"{_handled[0]} {_handled[1]:.4f} {_handled[2]:.4f}\n")
            temporary.rename(path)
        if LATENCY and _latencies:
            temporary.write_text(json.dumps(_latencies))
            temporary.rename(OUT / f"{os.getpid()}.lat")


@app.on_worker_start
def start_reporting() -> None:
    threading.Thread(target=_report, daemon=True).start()
    if _profiler is not None:
        _profiler.enable()  # the worker's main thread, from here on (its loop runs after the start hooks)


def _dump_profile() -> None:
    assert _profiler is not None and PROFILE
    _profiler.dump_stats(str(Path(PROFILE) / f"{os.getpid()}.prof"))  # stops it: enabled again
    _profiler.enable()


def handle(msg: Message) -> None:
    if DELAY:
        time.sleep(DELAY)
    else:
        msg.json()["amount"]
    if OFFSETS:
        if not _offsets_file:
            _offsets_file.append(os.open(OUT / f"{os.getpid()}.offsets", os.O_WRONLY | os.O_CREAT | os.O_APPEND))
        os.write(_offsets_file[0], f"{msg.partition} {msg.offset}\n".encode())
    now = time.time()
    if LATENCY and msg.timestamp is not None:
        _latencies.append(now * 1000 - msg.timestamp)
    if not _handled[0]:
        _handled[1] = now
    _handled[0] += 1
    _handled[2] = now
    if _profiler is not None and _handled[0] % 100_000 == 0:
        _dump_profile()


app.handler(
    TOPIC,
    shared=os.environ.get("MW_BENCH_SHARED") == "1",
    range_size=int(os.environ.get("MW_BENCH_RANGE_SIZE", "100")),
    adaptive_ranges=os.environ.get("MW_BENCH_ADAPTIVE", "1") != "0",
)(handle)
