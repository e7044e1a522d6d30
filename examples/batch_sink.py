"""A batch handler that writes to a sink: one call per batch of up to 1000 messages.

    MARSHAL_WORKERS_SINK_DIR=/tmp/sink marshal-workers run examples.batch_sink:app --brokers 127.0.0.1:9092

Each worker opens its own file in on_worker_start (a database connection
would go there too) and closes it in on_worker_stop.  A batch is written
with one call and flushed before the handler returns, so the progress the
supervisor reports never runs ahead of what is in the sink (at least once).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from marshal_workers import App, Message

app = App(group="examples.batch-sink")
SINK_DIR = Path(os.environ.get("MARSHAL_WORKERS_SINK_DIR", "sink"))
_file: IO[str] | None = None


@app.on_worker_start
def open_sink() -> None:
    global _file
    SINK_DIR.mkdir(parents=True, exist_ok=True)
    _file = open(SINK_DIR / f"events-{os.getpid()}.jsonl", "a")  # noqa: SIM115 - open for the worker's life


@app.on_worker_stop
def close_sink() -> None:
    if _file is not None:
        _file.close()


@app.handler("events", batch=True, batch_size=1000, on_error="release")
def write_batch(msgs: list[Message]) -> None:
    assert _file is not None
    _file.write("".join(m.value.decode() + "\n" for m in msgs if m.value))
    _file.flush()
    os.fsync(_file.fileno())
