"""The application the Spark tests replay: every handler appends a line per message to a sink file.

Configured by the environment, read at import (by the driver and by Spark's Python workers, which inherit
the environment the session was started with):

MW_SPARK_TOPIC_PREFIX  the topics: <prefix>-plain, -times, -short (one message per call), <prefix>-batch
                       (batch_size 7), <prefix>-fail (fails on the value b"fail", after 2 retries)
MW_SPARK_SINK_DIR      the sink files: <topic>.txt, one "<partition> <offset> <value> <batch size>" line per
                       message handled; hooks.txt, one "start" or "stop" line per worker hook run
"""

import os

from marshal_workers import App, Message

PREFIX = os.environ.get("MW_SPARK_TOPIC_PREFIX", "spark-test")
SINK = os.environ.get("MW_SPARK_SINK_DIR", os.devnull)
FAIL_VALUE = b"fail"

app = App(group=f"{PREFIX}-group")


def _append(name: str, lines: list[str]) -> None:
    fd = os.open(os.path.join(SINK, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(lines).encode())  # one write with O_APPEND: two workers' lines never interleave
    finally:
        os.close(fd)


def _lines(msgs: list[Message]) -> list[str]:
    return [f"{m.partition} {m.offset} {m.value.decode()} {len(msgs)}\n" for m in msgs]


@app.on_worker_start
def started() -> None:
    _append("hooks.txt", ["start\n"])


@app.on_worker_stop
def stopped() -> None:
    _append("hooks.txt", ["stop\n"])


def plain(msg: Message) -> None:
    _append(f"{msg.topic}.txt", _lines([msg]))


app.handler(f"{PREFIX}-plain")(plain)
app.handler(f"{PREFIX}-times")(plain)
app.handler(f"{PREFIX}-short")(plain)


@app.handler(f"{PREFIX}-batch", batch=True, batch_size=7)
def batch(msgs: list[Message]) -> None:
    _append(f"{msgs[0].topic}.txt", _lines(msgs))


@app.handler(f"{PREFIX}-fail", retries=2, retry_backoff="1ms")
def failing(msg: Message) -> None:
    if msg.value == FAIL_VALUE:
        raise ValueError(f"cannot handle offset {msg.offset}")
    _append(f"{msg.topic}.txt", _lines([msg]))
