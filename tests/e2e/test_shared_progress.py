"""Bounded repeats at any range size (docs/shared-partitions.md, protocol 0.8.0 ``progress_ranges``): a shared
worker's progress inside a large range survives its kill -9, a freeze of its whole supervisor past the pending
timeout, and a SIGTERM; exact counts from the handled records (the sink) and the log."""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable

import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_reader import read_group_state
from marshal_workers.runtime.worker.shared_worker import PROGRESS_EVERY_S

pytestmark = pytest.mark.broker

PARTITIONS = 2
RANGE_SIZE = 10_000  # the largest a handler may ask for: before 0.8.0 a crash repeated up to all of it
PER_PARTITION = 20_000
TOTAL = PARTITIONS * PER_PARTITION


@pytest.fixture
def big_ranges(fleets: Callable[..., Fleet]) -> Fleet:
    return fleets(
        "progress",
        PARTITIONS,
        env={"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": str(RANGE_SIZE), "MW_TEST_PENDING_TIMEOUT": "3s"},
    )


def lows(fleet: Fleet) -> list[int | None]:
    settings = Settings(
        brokers=fleet.brokers, group=fleet.group, coordination_topic=fleet.coordination_topic, heartbeat_interval=1.0
    )
    state = read_group_state(settings, fleet.group)
    found = [state.shared_partition(fleet.topic, p) for p in range(PARTITIONS)]
    return [None if p is None else p.low for p in found]


def lost(fleet: Fleet) -> int:
    settings = Settings(
        brokers=fleet.brokers, group=fleet.group, coordination_topic=fleet.coordination_topic, heartbeat_interval=1.0
    )
    state = read_group_state(settings, fleet.group)
    return sum(p.lost for p in (state.shared_partition(fleet.topic, n) for n in range(PARTITIONS)) if p is not None)


def all_done(fleet: Fleet) -> bool:
    """Every offset done (or, at most once, lost): the low-water marks at the partitions' ends (at most once, a
    one-offset lease an idle worker took at the end may lapse there, lost, and move the mark one past it)."""
    return all(low is not None and low >= PER_PARTITION for low in lows(fleet))


def repeated(fleet: Fleet) -> list[str]:
    return sorted((value for value, n in fleet.counts().items() if n > 1), key=int)


def stop(*supervisors: object) -> None:
    for supervisor in supervisors:
        supervisor.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        assert supervisor.wait(timeout=120) == ExitCode.OK  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_kill_9_of_a_shared_worker_in_a_large_range_repeats_only_the_message_in_hand(
    big_ranges: Fleet, mode: str
) -> None:
    # A fast handler (0.2 ms a message), slowed just enough that the kill finds the worker inside its range.
    big_ranges.env |= {"MW_TEST_MODE": mode, "MW_TEST_DELAY": "0.0002"}
    supervisor = big_ranges.start("a", "--processes", "2")
    big_ranges.produce(range(TOTAL))
    poll_until(lambda: len(big_ranges.counts()) > 4000, timeout=120, what="a good part of the first ranges")
    by_pid = collections.Counter(line.pid for line in big_ranges.lines())
    victim = max(big_ranges.shared_worker_pids("a") & set(by_pid), key=lambda pid: by_pid[pid])
    os.kill(victim, signal.SIGKILL)  # in the middle of a range of 10,000 (each worker is at most 4,000 into its first)
    poll_until(lambda: victim not in big_ranges.shared_worker_pids("a"), what="the worker gone")
    by_victim = {line.value for line in big_ranges.lines() if line.pid == victim}
    assert len(by_victim) % RANGE_SIZE, "killed between two ranges: the test would show nothing"

    if mode == "alo":
        poll_until(lambda: all_done(big_ranges), timeout=180, interval=1, what="every offset done")
        counts = big_ranges.counts()
        assert len(counts) == TOTAL, "at least once loses nothing"
        twice = repeated(big_ranges)
        assert set(twice) <= by_victim
        # Its position is stored after every message: only the one in hand when it died may be handled again
        # (before 0.8.0: everything it had handled of its range, thousands here).
        assert len(twice) <= 1, twice
    else:
        poll_until(lambda: all_done(big_ranges), timeout=180, interval=1, what="every offset done or lost")
        assert repeated(big_ranges) == [], "at most once handles nothing twice"
        unhandled = TOTAL - len(big_ranges.counts())
        # The rest of its range is lost (any of it may have been in hand), the part it had done is not.
        assert unhandled <= lost(big_ranges) <= RANGE_SIZE + PARTITIONS
    stop(supervisor)


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_a_frozen_supervisor_past_its_leases_gives_back_only_what_its_worker_had_not_done(
    big_ranges: Fleet, mode: str
) -> None:
    # A slower handler (about 1 ms a message) so that what a worker does between two progress records is far
    # below a range: the bound below means something.
    big_ranges.env |= {"MW_TEST_MODE": mode, "MW_TEST_DELAY": "0.001"}
    a = big_ranges.start("a", "--processes", "1")
    big_ranges.produce(range(TOTAL))
    poll_until(lambda: len(big_ranges.counts()) > 1500, timeout=120, what="a's worker well into its first range")
    os.killpg(a.pid, signal.SIGSTOP)  # the supervisor, its fork server and its worker: nothing renews, nothing runs
    stopped_at = time.time()
    before = big_ranges.lines()
    rate = len(before) / max(before[-1].at - before[0].at, 0.1)  # a's messages per second before the freeze
    b = big_ranges.start("b", "--processes", "2")  # takes what a held once its leases lapse (3 s)
    poll_until(lambda: time.time() > stopped_at + 8, timeout=30, what="a's leases lapsed and b at work")
    os.killpg(a.pid, signal.SIGCONT)  # its worker finds its deadline passed and leaves the range alone
    poll_until(lambda: all_done(big_ranges), timeout=240, interval=1, what="every offset done or lost")

    # a's worker may finish the message in hand when it runs again (frozen inside the call): a's too.
    by_a = {line.value for line in big_ranges.lines() if line.client == "a"}
    twice = repeated(big_ranges)
    if mode == "alo":
        assert len(big_ranges.counts()) == TOTAL, "at least once loses nothing"
        assert set(twice) <= by_a
        # What a's worker handled after the last progress record the log accepted: at most one cadence of
        # reports, plus the write's round trip (a generous second) and the message in hand.
        bound = rate * (PROGRESS_EVERY_S + 1.0) + 1
        assert bound < RANGE_SIZE / 4, f"{rate:.0f} msgs/s: too fast for the bound to tell anything"
        assert len(twice) <= bound, (len(twice), rate)
    else:
        assert twice == [], "at most once handles nothing twice"
        assert TOTAL - len(big_ranges.counts()) <= lost(big_ranges)
    assert "ran out" in big_ranges.log_of("a") or not any(
        line.client == "a" and line.at > stopped_at for line in big_ranges.lines()
    )
    stop(a, b)


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_sigterm_in_a_large_range_loses_and_repeats_nothing(big_ranges: Fleet, mode: str) -> None:
    big_ranges.env["MW_TEST_MODE"] = mode
    a = big_ranges.start("a", "--processes", "2")
    big_ranges.produce(range(TOTAL))
    poll_until(lambda: len(big_ranges.counts()) > 3000, timeout=120, what="a at work")
    a.send_signal(signal.SIGTERM)  # its workers finish the ranges in hand and give the next ones back
    assert a.wait(timeout=120) == ExitCode.OK
    b = big_ranges.start("b", "--processes", "2")
    poll_until(lambda: all_done(big_ranges), timeout=180, interval=1, what="every offset done")
    assert len(big_ranges.counts()) == TOTAL and repeated(big_ranges) == []
    assert lost(big_ranges) == 0
    stop(b)
