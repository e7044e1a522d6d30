"""A handler that fails shows where: its traceback in the supervisor's log (once per failed call, at the level of
what became of it) and in its dead letter's ``traceback`` header, under every runner; SIGUSR2 says whose stacks."""

from __future__ import annotations

import re
import signal

import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker

ERROR_LINE = "ValueError: order 13 has no amount"


def failures_logged(log: str) -> list[tuple[str, str]]:
    """(the log line, its traceback) of every log line followed by a traceback."""
    lines = log.splitlines()
    found = []
    for index, line in enumerate(lines):
        if line == "Traceback (most recent call last):":
            end = index + 1
            # Up to its last line (the error), or to the next log line.
            while end < len(lines) and not lines[end].startswith(("ValueError", "20")):
                end += 1
            found.append((lines[index - 1], "\n".join(lines[index : end + 1])))
    return found


@pytest.mark.parametrize("runner", ["plain", "batch", "threads", "async", "shared"])
def test_a_failed_call_is_logged_once_with_its_traceback_and_its_dead_letter_carries_it(
    fleet: Fleet, runner: str
) -> None:
    fleet.app = "traceback_app:app"
    fleet.env |= {"MW_TEST_RUNNER": runner}
    supervisor = fleet.start("only", "--processes", "1")
    fleet.produce(range(20))  # 13 is on partition 5, at offset 1 (after 5)

    [letter] = fleet.dead_letters(1)  # a batch handler's batch may be 5 and 13: both carry its traceback
    headers = dict(letter.headers() or [])
    assert (headers["error_type"], headers["original_partition"]) == (b"ValueError", b"5")
    traceback = headers["traceback"].decode()
    assert traceback.startswith("Traceback (most recent call last):") and traceback.endswith(ERROR_LINE + "\n")
    assert 'traceback_app.py", line' in traceback and ", in check_order\n" in traceback, traceback

    def dead_letter_logged() -> list[tuple[str, str]] | None:
        found = failures_logged(fleet.log_of("only"))
        return found if any(" ERROR " in line for line, _ in found) else None

    failures = poll_until(dead_letter_logged, what="the dead letter's log line")
    # retries=1: two calls failed, each logged once with its traceback: the retry at warning, the dead letter at error.
    assert fleet.log_of("only").count(", in check_order\n") == 2, fleet.log_of("only")
    [(retried, first), (dead, last)] = failures
    where = f"group {fleet.group} {fleet.topic}[5]: handler "
    failed = r" failed at offset [01] \(ValueError\('order 13 has no amount'\)\)"
    assert " WARNING " in retried and where in retried and re.search(failed + "; retry 1 in ", retried), retried
    sent = re.search(failed + rf": sent (\d) message\(s\) to {fleet.topic}.dlq", dead)
    assert " ERROR " in dead and where in dead and sent, dead
    assert sent.group(1) == "1" or runner == "batch", "one message, or (a batch handler) the batch"
    for logged in (first, last):
        assert ", in check_order\n" in logged and logged.endswith(ERROR_LINE)

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK


def test_sigusr2_heads_each_shared_workers_stacks_with_its_pid_group_and_topic(fleet: Fleet) -> None:
    supervisor = fleet.start("only", "--processes", "2", MW_TEST_SHARED="1")
    fleet.produce(range(40))
    poll_until(lambda: len(fleet.counts()) == 40, what="every message")
    supervisor.send_signal(signal.SIGUSR2)
    heading = (
        rf"SIGUSR2: stacks of worker pid (\d+), group {fleet.group}, topic {fleet.topic}( partition \d)?, "
        r"shared worker #([01]), (between ranges|range from \d+):\n"
    )  # the partition of the range in hand
    headings = poll_until(
        lambda: len(found := re.findall(heading, fleet.log_of("only"))) == 2 and found,
        what="both shared workers' stacks",
    )
    assert sorted(number for _, _, number, _ in headings) == ["0", "1"] and len({h[0] for h in headings}) == 2
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK
