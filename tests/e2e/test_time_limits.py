"""Handler time limits: the soft one raises inside the handler, the hard one kills the worker."""

from __future__ import annotations

import pytest
from fleet import Fleet
from polling import poll_until

pytestmark = pytest.mark.broker


def test_past_the_soft_limit_a_message_fails_and_is_dead_lettered_after_its_retries(fleet: Fleet) -> None:
    fleet.env |= {"MW_TEST_STUCK_VALUE": "13", "MARSHAL_WORKERS_SOFT_TIME_LIMIT": "200ms"}
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: len(fleet.counts()) == 79, what="every other message")
    [message] = fleet.dead_letters(1)
    headers = dict(message.headers())
    assert message.value() == b"13" and headers["error_type"] == b"SoftTimeLimitExceeded"
    assert fleet.log_of("only").count("SoftTimeLimitExceeded") >= 2, "retried before it was dead-lettered"
    assert "13" not in fleet.counts() and max(fleet.counts().values()) == 1


def test_past_the_hard_limit_the_worker_is_killed_and_the_message_retried_then_dead_lettered(fleet: Fleet) -> None:
    fleet.env |= {"MW_TEST_STUCK_VALUE": "13", "MARSHAL_WORKERS_TIME_LIMIT": "500ms"}
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: len(fleet.counts()) == 79, timeout=60, what="every other message")
    [message] = fleet.dead_letters(1)
    headers = dict(message.headers())
    assert message.value() == b"13" and headers["error_type"] == b"TimeLimitExceeded"
    assert (headers["original_partition"], headers["original_offset"]) == (b"5", b"1")
    log = fleet.log_of("only")
    assert log.count("ran past time_limit") == 3, "the first call and its 2 retries (the sink app's retries=2)"
    assert "crashed" not in log and "released" not in log, "a time limit is not a crash"
    poll_until(lambda: fleet.status_rows()[5]["offset"] == 10, what="partition 5 moving past the message")
    assert max(fleet.counts().values()) == 1
