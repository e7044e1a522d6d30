"""Rate and age limits (issue 14 part 4): ``rate_limit`` across one supervisor's workers, ``max_age``."""

from __future__ import annotations

import time

import pytest
from fleet import Fleet
from polling import poll_until
from test_observability import scrape, total

from marshal_workers.kafka.embedded_broker import free_port

pytestmark = pytest.mark.broker

RATE = 50  # messages per second, for the supervisor's 8 workers together
WINDOW_S = 10.0


def test_a_rate_limit_holds_within_ten_percent_across_a_supervisors_workers(fleet: Fleet) -> None:
    fleet.env["MW_TEST_RATE_LIMIT"] = f"{RATE}/s"
    fleet.produce(range(1000))  # 20 s of work at the limit: a backlog through the whole window
    fleet.start("only")
    first = poll_until(lambda: fleet.lines(), what="the first message handled")[0].at
    begins = first + 1.0  # past the workers' start
    ends = begins + WINDOW_S
    poll_until(lambda: time.time() > ends + 0.5, timeout=WINDOW_S + 30, interval=0.5, what="the end of the window")

    lines = fleet.lines()
    in_window = [line for line in lines if begins <= line.at < ends]
    rate = len(in_window) / WINDOW_S
    assert abs(rate - RATE) <= 0.1 * RATE, f"{rate:.1f} messages/s for a limit of {RATE}/s"
    assert {line.partition for line in in_window} == set(range(8)), "every worker took its share of the one limit"
    assert len(lines) < 1000, "the backlog lasted past the window"


@pytest.mark.parametrize("runner", ["plain", "batch", "lanes", "shared"])
def test_messages_older_than_max_age_are_skipped_or_dead_lettered_and_counted(fleet: Fleet, runner: str) -> None:
    dead_lettered = runner in ("plain", "batch")  # on_too_old="dlq" on these runners; the others skip
    fleet.env |= {"MW_TEST_MAX_AGE": "1h", "MW_TEST_ON_TOO_OLD": "dlq" if dead_lettered else "skip"}
    fleet.env |= {
        "plain": {},
        "batch": {"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "50"},
        "lanes": {"MW_TEST_CONCURRENCY": "4"},
        "shared": {"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20"},
    }[runner]
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    fleet.produce(range(80), timestamp=two_hours_ago)
    fleet.produce(range(80, 160))  # now
    fleet.produce(range(160, 240), timestamp=two_hours_ago)
    port = free_port()
    fleet.start("only", "--metrics-port", str(port), "--processes", "2", MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")

    poll_until(lambda: len(fleet.counts()) >= 80, timeout=60, what="the fresh messages")

    def too_old_counted() -> bool:
        try:
            return total(scrape(port), "marshal_workers_handler_outcomes_total", outcome="too_old") == 160
        except OSError:
            return False

    poll_until(too_old_counted, timeout=30, what="160 messages counted too old")
    assert sorted(fleet.counts(), key=int) == [str(n) for n in range(80, 160)], "only the fresh ones handled"
    if dead_lettered:
        dead = fleet.dead_letters(160)
        assert sorted(int(d.value()) for d in dead) == [*range(80), *range(160, 240)]
        assert {dict(d.headers())["error_type"] for d in dead} == {b"MessageTooOld"}


@pytest.mark.parametrize("runner", ["batch", "amo", "lanes", "shared"])
def test_every_runner_takes_a_token_per_message(fleet: Fleet, runner: str) -> None:
    """Not a timing figure: a backlog of 100 at 50/s cannot be handled much faster than (100 - 20) / 50 s."""
    count, ahead = 100, 20  # the burst (5), or a batch of 20 taken on a full bucket
    fleet.env["MW_TEST_RATE_LIMIT"] = f"{RATE}/s"
    fleet.env |= {
        "batch": {"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "20"},
        "amo": {"MW_TEST_MODE": "amo", "MW_TEST_BATCH_SIZE": "10"},
        "lanes": {"MW_TEST_CONCURRENCY": "4"},
        "shared": {"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20"},
    }[runner]
    fleet.produce(range(count))
    fleet.start("only", "--processes", "2")
    poll_until(lambda: len(fleet.counts()) == count, timeout=60, what="every message")
    times = sorted(line.at for line in fleet.lines())
    assert times[-1] - times[0] >= (count - ahead) / RATE - 0.5, "no faster than the rate limit"
    assert max(fleet.counts().values()) == 1
