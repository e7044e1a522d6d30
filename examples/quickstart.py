"""Quick start: an at-least-once handler.

    marshal-workers run examples.quickstart:app --brokers 127.0.0.1:9092

Every message of the topic "orders" is handled at least once; a clean
shutdown (Ctrl-C, SIGTERM) hands every partition over with nothing repeated.
"""

import logging

from marshal_workers import App, Message

app = App(group="examples.quickstart")
log = logging.getLogger("examples.quickstart")
totals = {"orders": 0, "amount": 0.0}


@app.handler("orders")
def on_order(msg: Message) -> None:
    order = msg.json()
    totals["orders"] += 1
    totals["amount"] += float(order.get("amount", 0))
    if totals["orders"] % 10_000 == 0:
        log.info("%s[%d]: %d orders, %.2f in all", msg.topic, msg.partition, totals["orders"], totals["amount"])
