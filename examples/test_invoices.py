"""Tests of examples/invoices.py, as a user of marshal-workers writes them.

In process, without a broker: marshal_workers.testing.run_handler applies the handler's retry policy,
on_error and hooks, and says what became of each message.  Against a real broker: the fixtures of the
marshal-workers pytest plugin (installed with the package), marshal_broker and running_app.
"""

import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Producer

from examples.invoices import LedgerUnavailable, app
from marshal_workers.testing import make_message, run_handler


def test_an_order_becomes_an_invoice_with_tax(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INVOICES_FILE", str(tmp_path / "invoices"))
    [result] = run_handler(app, "orders", [make_message({"id": 7, "amount": 10})])
    assert result.outcome == "done"
    assert (tmp_path / "invoices").read_text() == "7 12.00\n"


def test_bad_and_test_orders_are_rejected_and_ignored_without_retries(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INVOICES_FILE", str(tmp_path / "invoices"))
    no_amount, test_order = run_handler(app, "orders", [{"id": 1}, {"id": 2, "amount": 5, "test": True}])
    assert (no_amount.outcome, no_amount.attempts) == ("dead_letter", 1)
    assert dict(no_amount.dead_letter_headers or [])["error_type"] == b"Reject"
    assert (test_order.outcome, test_order.attempts) == ("ignored", 1)


def test_an_unreachable_ledger_is_retried_then_dead_lettered(monkeypatch) -> None:
    monkeypatch.delenv("INVOICES_FILE", raising=False)
    [result] = run_handler(app, "orders", [make_message({"id": 3, "amount": 1})], seed=1)
    assert (result.outcome, result.attempts) == ("dead_letter", 4), "the first try and 3 retries"
    assert isinstance(result.error, LedgerUnavailable)
    assert all(0 <= wait <= 0.1 * 2**i for i, wait in enumerate(result.delays)), "jittered, doubling backoff"


def test_a_running_supervisor_invoices_what_is_produced(marshal_broker, running_app, tmp_path: Path) -> None:
    invoices = tmp_path / "invoices"  # running_app creates the topic "orders" of the app's handler
    running_app("examples.invoices:app", group=f"invoices-{uuid.uuid4().hex[:8]}", env={"INVOICES_FILE": str(invoices)})
    producer = Producer({"bootstrap.servers": marshal_broker})
    order_id = uuid.uuid4().int % 10**9
    producer.produce("orders", orjson.dumps({"id": order_id, "amount": 100}))
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 60
    while f"{order_id} 120.00" not in (invoices.read_text() if invoices.exists() else ""):
        assert time.monotonic() < deadline, "the order was not invoiced within 60 s"
        time.sleep(0.1)
