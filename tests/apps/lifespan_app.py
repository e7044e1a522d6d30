"""An application with middleware and the three kinds of lifespan hooks, for the middleware e2e test: each notes a
line in MW_TEST_SINK with the pid of the process it ran in.

``startup PID MS`` and ``shutdown PID MS`` (on_startup, on_shutdown, in the supervisor; MS: the wall clock in
milliseconds), ``enter PID`` and ``exit PID`` (the worker lifespan), ``mw VALUE PID`` (the middleware, before it
calls the handler) and ``handled VALUE PID`` (the handler).  MW_TEST_STARTUP_FAILS=1: the on_startup hook raises.
MW_TEST_TOPIC names the topic.
"""

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from marshal_workers import App, Message

app = App()


def note(line: str) -> None:
    with open(os.environ["MW_TEST_SINK"], "a") as sink:  # O_APPEND: one line per write, whichever process writes
        sink.write(line + "\n")


@app.on_startup
def check_database() -> None:
    if os.environ.get("MW_TEST_STARTUP_FAILS") == "1":
        raise ConnectionError("no database at db:5432")
    note(f"startup {os.getpid()} {time.time() * 1000:.0f}")


@app.on_shutdown
async def say_goodbye() -> None:
    note(f"shutdown {os.getpid()} {time.time() * 1000:.0f}")


@app.lifespan
def pool() -> Iterator[None]:
    note(f"enter {os.getpid()}")
    yield
    note(f"exit {os.getpid()}")


@app.middleware
def seen(msg: Message, call_next: Callable[[Message], Any]) -> Any:
    note(f"mw {msg.value.decode()} {os.getpid()}")
    return call_next(msg)


@app.handler(os.environ["MW_TEST_TOPIC"])
def handle(msg: Message) -> None:
    note(f"handled {msg.value.decode()} {os.getpid()}")
