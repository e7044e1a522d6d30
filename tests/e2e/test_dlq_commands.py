"""``marshal-workers dlq list`` and ``dlq redrive`` on a real dead-letter topic."""

from __future__ import annotations

import signal
import subprocess
import sys

import orjson
import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.exit_codes import ExitCode

pytestmark = pytest.mark.broker


def dlq(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marshal_workers", "dlq", *args, "--brokers", fleet.brokers, "--topic", fleet.topic],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_dead_letters_are_listed_by_error_type_and_redriven_once_to_their_topic(fleet: Fleet) -> None:
    fleet.env["MW_TEST_FAIL_VALUE"] = "13"
    failing = fleet.start("failing")
    fleet.produce(range(40), headers=[("traceparent", b"00-aa")])
    poll_until(lambda: len(fleet.counts()) == 39, what="every other message")
    fleet.dead_letters(1)
    failing.send_signal(signal.SIGTERM)
    assert failing.wait(timeout=30) == ExitCode.OK

    listed = dlq(fleet, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = orjson.loads(listed.stdout)["error_types"]
    assert (row["error_type"], row["count"], row["from_topics"]) == ("ValueError", 1, [fleet.topic])

    refused = dlq(fleet, "redrive", "--to", "no-such-topic-anywhere")
    assert refused.returncode == ExitCode.UNKNOWN_TOPIC and "nothing sent" in refused.stderr
    assert dlq(fleet, "redrive", "--error-type", "KeyError").stdout.startswith("nothing to send")
    sent = dlq(fleet, "redrive", "--error-type", "ValueError")
    assert sent.returncode == 0 and f"sent 1 dead letters of {fleet.topic}.dlq to {fleet.topic}" in sent.stdout

    del fleet.env["MW_TEST_FAIL_VALUE"]  # the handler is fixed: it handles the redriven message, once
    fleet.start("fixed")
    poll_until(lambda: "13" in fleet.counts(), what="the redriven message")
    assert fleet.counts()["13"] == 1 and len(fleet.counts()) == 40
    assert max(fleet.counts().values()) == 1, "nothing else was sent again"
