"""A worked example of testing handlers (docs/handlers.md#testing): an invoicing handler with a retry
policy, and its tests in examples/test_invoices.py, in process (run_handler) and against a real broker
(the pytest plugin's fixtures).

    marshal-workers run examples.invoices:app --brokers 127.0.0.1:9092

Each order on "orders" becomes a line "<order id> <amount with tax>" in the file INVOICES_FILE names (a
stand-in for a database).  An order without an amount is rejected (to orders.dlq at once); a test order is
ignored; the ledger being unreachable is retried.
"""

import os

from marshal_workers import App, Ignore, Message, Reject

app = App(group="examples.invoices")
TAX = 0.2


class LedgerUnavailable(Exception):
    """The ledger (the invoices file) cannot be written just now."""


@app.handler("orders", retries=3, retry_backoff="100ms", retry_on=(LedgerUnavailable,))
def on_order(msg: Message) -> None:
    order = msg.json()
    if order.get("test"):
        raise Ignore()
    if "amount" not in order:
        raise Reject(f"order {order.get('id')} has no amount")
    path = os.environ.get("INVOICES_FILE")
    if not path:
        raise LedgerUnavailable("INVOICES_FILE is not set")
    with open(path, "a") as ledger:
        ledger.write(f"{order['id']} {order['amount'] * (1 + TAX):.2f}\n")
