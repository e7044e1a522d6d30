"""An application whose handler says what to do with each message, for the retry-policy e2e tests.

Values: ``retry`` raises ``Retry(delay="50ms")`` until its third try, then is recorded; ``reject`` raises
``Reject``; ``ignore`` raises ``Ignore``; ``down`` raises ConnectionError (retried, then dead-lettered);
``bad`` raises KeyError (not retried: not one of retry_on); anything else is recorded.  The sink gets
``value attempt`` per recorded message.  MW_TEST_TOPIC, MW_TEST_SINK; MW_TEST_RUNNER: plain (one call at a
time), lanes (concurrency 4) or shared (shared partitions).
"""

import os

from marshal_workers import App, Ignore, Message, Reject, Retry

app = App()
RUNNER = os.environ.get("MW_TEST_RUNNER", "plain")
_options = {"lanes": {"concurrency": 4}, "shared": {"shared": True, "range_size": 10, "pending_timeout": "10s"}}


@app.handler(
    os.environ["MW_TEST_TOPIC"],
    retries=2,
    retry_backoff="10ms",
    retry_on=(ConnectionError,),
    **_options.get(RUNNER, {}),
)
def handle(msg: Message) -> None:
    value = msg.value.decode()
    if value == "retry" and msg.attempt < 3:
        raise Retry(delay="50ms")
    if value == "reject":
        raise Reject("not an order")
    if value == "ignore":
        raise Ignore()
    if value == "down":
        raise ConnectionError("the database is down")
    if value == "bad":
        raise KeyError("amount")
    with open(os.environ["MW_TEST_SINK"], "a") as sink:
        sink.write(f"{value} {msg.attempt}\n")
