"""An application with every kind of hook, for the hooks e2e test: each hook appends a line to MW_TEST_SINK.

Values: ``fail`` raises ValueError (retried once, then dead-lettered), ``ignore`` raises Ignore, anything else is
handled.  MW_TEST_TOPIC names the topic.
"""

import os

from marshal_workers import App, Ignore, Message

app = App()


def note(line: str) -> None:
    with open(os.environ["MW_TEST_SINK"], "a") as sink:
        sink.write(line + "\n")


@app.before_message
def before(msg: Message) -> None:
    note(f"before {msg.value.decode()} {msg.attempt}")


@app.after_message
def after(msg: Message, outcome: str, error: BaseException | None, seconds: float) -> None:
    assert seconds >= 0
    note(f"after {msg.value.decode()} {outcome} {type(error).__name__ if error else '-'}")


@app.on_dead_letter
def dead(msg: Message, error: BaseException) -> None:
    note(f"dead {msg.value.decode()} {type(error).__name__}")


@app.on_partition_claimed
def claimed(topic: str, partition: int) -> None:
    note(f"claimed {partition}")


@app.on_partition_released
def released(topic: str, partition: int) -> None:
    note(f"released {partition}")


@app.handler(os.environ["MW_TEST_TOPIC"], retries=1, retry_backoff="10ms")
def handle(msg: Message) -> None:
    if msg.value == b"fail":
        raise ValueError("cannot")
    if msg.value == b"ignore":
        raise Ignore()
