"""At most once: a payment is charged zero times rather than twice.

    marshal-workers run examples.amo_payments:app --brokers 127.0.0.1:9092

Before a batch is handled, the supervisor claims it in the coordination log
(claim_messages); only a claimed batch is handled, and a claimed batch is
never handed to another worker, whatever crashes.  An unclean failure loses
at most the batch in flight.  ``batch_size`` trades coordination traffic
against what can be lost.
"""

import logging

from marshal_workers import App, Message

app = App(group="examples.payments")
log = logging.getLogger("examples.amo_payments")


@app.handler("payments", mode="amo", batch_size=500)
def charge(msg: Message) -> None:
    payment = msg.json()
    # A real handler would call the payment provider here, once.
    if payment.get("amount", 0) < 0:
        raise ValueError(f"negative amount in {payment}")  # retried, then sent to payments.dlq
