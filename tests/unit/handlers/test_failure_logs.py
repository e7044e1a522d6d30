"""The line a failed call logs (handlers/failure_logs.py): what an operator reads first."""

from __future__ import annotations

import logging

import pytest

from marshal_workers.core.logs import partition_log
from marshal_workers.handlers.failure_logs import log_decision
from marshal_workers.handlers.failure_path import Decision, Fate, dead_letter
from marshal_workers.handlers.signals import PayloadError


def test_a_typed_batch_with_one_bad_payload_is_a_warning_that_the_others_were_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The call succeeded for the good messages: no ERROR, no traceback, the bad one's own reason (an ERROR
    "handler ... failed at offset 10 (PayloadError('1 of 3 messages did not decode ...'))" said otherwise)."""
    log = partition_log(logging.getLogger("test.failure_logs"), "billing", "invoices", 2)
    bad = PayloadError("order_id: Expected `str`, got `int`")
    error = PayloadError("1 of 3 messages did not decode", by_position={1: bad})
    decision = Decision(Fate.DEAD_LETTER, error, letters={1: bad})
    with caplog.at_level(logging.DEBUG, logger="test.failure_logs"):
        log_decision(log, "tasks.on_invoices", [10, 11, 12], decision, 1, "invoices.dlq")
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "handler tasks.on_invoices: 1 of 3 messages did not decode (PayloadError) and went to invoices.dlq, the other 2 "
        "were handled (offset 11: order_id: Expected `str`, got `int`)"
    )
    assert record.offset == 11 and record.partition == 2 and record.group == "billing"  # type: ignore[attr-defined]


def test_a_call_that_failed_for_good_is_still_an_error(caplog: pytest.LogCaptureFixture) -> None:
    log = partition_log(logging.getLogger("test.failure_logs"), "billing", "invoices", 2)
    with caplog.at_level(logging.DEBUG, logger="test.failure_logs"):
        log_decision(log, "tasks.on_invoices", [10, 11, 12], dead_letter(ValueError("db down"), 3), 4, "invoices.dlq")
        every_bad = PayloadError(
            "3 of 3 messages did not decode", by_position=dict.fromkeys(range(3), PayloadError("x"))
        )
        log_decision(log, "tasks.on_invoices", [10, 11, 12], dead_letter(every_bad, 3), 1, "invoices.dlq")
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR], "nothing of those calls was handled"
    assert "sent 3 message(s) to invoices.dlq" in caplog.records[0].getMessage()
