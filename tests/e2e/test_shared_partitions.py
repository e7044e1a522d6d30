"""Shared partitions (docs/shared-partitions.md): many workers on many supervisors share each partition through range
leases, with every message accounted for under kill -9, SIGSTOP past the pending timeout and SIGTERM."""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable

import pytest
from fleet import Fleet, SinkLine
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_reader import read_group_state
from marshal_workers.protocol.range_leases import SharedPartition
from marshal_workers.protocol.world_state import WorldState

pytestmark = pytest.mark.broker

PARTITIONS = 2


SHARED_ENV = {"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20", "MW_TEST_PENDING_TIMEOUT": "5s"}


@pytest.fixture
def shared_fleet(fleets: Callable[..., Fleet]) -> Fleet:
    """A fresh 2-partition topic whose handler is shared."""
    return fleets("shared", PARTITIONS, env=SHARED_ENV)


def shared_state(fleet: Fleet) -> WorldState:
    settings = Settings(
        brokers=fleet.brokers, group=fleet.group, coordination_topic=fleet.coordination_topic, heartbeat_interval=1.0
    )
    return read_group_state(settings, fleet.group)


def duplicates(fleet: Fleet) -> list[str]:
    return sorted((value for value, n in fleet.counts().items() if n > 1), key=int)


def most_processes_at_once(lines: list[SinkLine], call_s: float) -> int:
    """The most processes whose handler calls (of ``call_s`` each, ending at their lines' times) overlapped."""
    ends = sorted((line.at, line.pid) for line in lines)
    most, first = 0, 0
    for last, (at, _) in enumerate(ends):
        while ends[first][0] <= at - call_s:
            first += 1
        most = max(most, len({pid for _, pid in ends[first : last + 1]}))
    return most


def test_three_supervisors_of_four_processes_share_two_partitions_at_once_and_sigterm_loses_nothing(
    shared_fleet: Fleet,
) -> None:
    total = 1200
    shared_fleet.env["MW_TEST_DELAY"] = "0.02"
    supervisors = {name: shared_fleet.start(name, "--processes", "4") for name in ("a", "b", "c")}
    shared_fleet.produce(range(total))
    # Mid-run, once every host has a share (one started slower on a loaded machine may join late).
    poll_until(
        lambda: (
            len(shared_fleet.counts()) > total // 3
            and {line.client for line in shared_fleet.lines()} == {"a", "b", "c"}
        ),
        timeout=60,
        what="a third of the messages, some on every host",
    )

    supervisors["a"].send_signal(signal.SIGTERM)  # mid-run: it finishes its ranges in hand, gives the rest back
    assert supervisors["a"].wait(timeout=60) == ExitCode.OK
    poll_until(lambda: len(shared_fleet.counts()) == total, timeout=120, what="every message")
    for name in ("b", "c"):
        supervisors[name].send_signal(signal.SIGTERM)
        assert supervisors[name].wait(timeout=60) == ExitCode.OK

    counts = shared_fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)]
    assert duplicates(shared_fleet) == [], "a clean run and a clean stop handle each message once"
    workers_by_partition = collections.defaultdict(set)
    for line in shared_fleet.lines():
        workers_by_partition[line.partition].add((line.client, line.pid))
    # Fan-out beyond the partition count: each partition's messages were handled by many processes on every host.
    assert all(len(workers) >= 6 for workers in workers_by_partition.values()), workers_by_partition
    assert {line.client for line in shared_fleet.lines()} == {"a", "b", "c"}
    # And at once: a process handles one message per 20 ms at most, so messages of many processes ending within the
    # same 20 ms ran side by side (how much faster that makes a topic is a benchmark's: bench_shared.py).
    assert most_processes_at_once(shared_fleet.lines(), 0.02) >= 8
    state = shared_state(shared_fleet)
    for partition in range(PARTITIONS):
        shared = state.shared_partition(shared_fleet.topic, partition)
        assert shared is not None and shared.low == total // PARTITIONS, (
            "every offset done: the low-water mark at the end"
        )
        assert shared.lost == 0 and shared.acked == total // PARTITIONS


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_kill_9_of_a_supervisor_redelivers_only_its_ranges_or_nothing_at_most_once(
    shared_fleet: Fleet, mode: str
) -> None:
    total = 1200
    # Fixed ranges of 20 (not sized by the handler's rate): what b's workers held is bounded by them.
    shared_fleet.env |= {
        "MW_TEST_DELAY": "0.02",
        "MW_TEST_MODE": mode,
        "MW_TEST_PENDING_TIMEOUT": "3s",
        "MW_TEST_ADAPTIVE_RANGES": "0",
    }
    supervisors = {name: shared_fleet.start(name, "--processes", "4") for name in ("a", "b", "c")}
    shared_fleet.produce(range(total))
    poll_until(
        lambda: len({line.client for line in shared_fleet.lines()}) == 3 and len(shared_fleet.counts()) > 300,
        timeout=60,
        what="every supervisor at work",
    )

    os.killpg(supervisors["b"].pid, signal.SIGKILL)  # the supervisor, its fork server and its workers
    supervisors["b"].wait(timeout=30)
    killed_at = time.time()
    by_b = {line.value for line in shared_fleet.lines() if line.client == "b"}

    poll_until(lambda: all_done(shared_fleet, total), timeout=120, interval=0.5, what="every offset done or lost")
    counts = shared_fleet.counts()
    repeated = duplicates(shared_fleet)
    if mode == "alo":
        assert sorted(counts, key=int) == [str(n) for n in range(total)], "at least once loses nothing"
        assert set(repeated) <= by_b, "only what b held is delivered again"
        assert all(
            line.at > killed_at for line in shared_fleet.lines() if line.value in repeated and line.client != "b"
        )
    else:
        assert repeated == [], "at most once handles nothing twice"
        state = shared_state(shared_fleet)
        lost = sum(state.shared_partition(shared_fleet.topic, p).lost for p in range(PARTITIONS))  # type: ignore[union-attr]
        # The log counts b's leases as lost (4 workers x 2 ranges of 20 at most): what was never handled is among
        # them, and so is what b's workers handled from them before they died (not known to be done).
        assert total - len(counts) <= lost <= 4 * 2 * 20


def test_a_supervisor_stopped_past_the_pending_timeout_handles_nothing_from_lapsed_leases(shared_fleet: Fleet) -> None:
    total = 2400  # 24 ranges of 100 for 8 workers: each holds two when b is stopped
    pending = 3.0
    # A range takes 2s to handle (fixed: sized by the handler's pace, a range would take half a second): with its
    # successor queued, a worker is mid-range when its lease runs out.
    shared_fleet.env |= {
        "MW_TEST_DELAY": "0.02",
        "MW_TEST_MODE": "amo",
        "MW_TEST_PENDING_TIMEOUT": f"{pending}s",
        "MW_TEST_RANGE_SIZE": "100",
        "MW_TEST_ADAPTIVE_RANGES": "0",
    }
    supervisors = {name: shared_fleet.start(name, "--processes", "4") for name in ("a", "b")}
    shared_fleet.produce(range(total))
    poll_until(
        lambda: len({line.client for line in shared_fleet.lines()}) == 2 and len(shared_fleet.counts()) > 200,
        timeout=60,
        what="both supervisors at work",
    )

    supervisors["b"].send_signal(signal.SIGSTOP)  # only the supervisor: its workers run on, without renewals
    stopped_at = time.time()
    poll_until(lambda: time.time() > stopped_at + 2 * pending, what="the leases to lapse")
    supervisors["b"].send_signal(signal.SIGCONT)
    poll_until(lambda: all_done(shared_fleet, total), timeout=120, interval=0.5, what="every offset done or lost")

    assert duplicates(shared_fleet) == [], "nothing handled twice"
    late = [
        line
        for line in shared_fleet.lines()
        if line.client == "b" and stopped_at + pending < line.at < stopped_at + 2 * pending
    ]
    assert late == [], "b's workers handled messages past their leases"
    assert "ran out" in shared_fleet.log_of("b"), "a range longer than the lease was left half done"
    unhandled = total - len(shared_fleet.counts())
    assert 0 < unhandled <= _lost(shared_fleet), "what b's workers left is counted lost"


def all_done(fleet: Fleet, total: int) -> bool:
    """Every offset of every partition done (or, at most once, lost): the low-water marks at the end."""
    state = shared_state(fleet)
    partitions = [state.shared_partition(fleet.topic, p) for p in range(PARTITIONS)]
    return all(p is not None and p.low == total // PARTITIONS for p in partitions)


def _lost(fleet: Fleet) -> int:
    state = shared_state(fleet)
    return sum(p.lost for p in (state.shared_partition(fleet.topic, n) for n in range(PARTITIONS)) if p is not None)


def test_a_poison_message_is_dead_lettered_after_max_deliveries_and_the_partition_goes_on(shared_fleet: Fleet) -> None:
    total = 200
    shared_fleet.env |= {"MW_TEST_FAIL_VALUE": "7", "MW_TEST_MAX_DELIVERIES": "3"}
    supervisors = [shared_fleet.start(name, "--processes", "2") for name in ("a", "b")]
    shared_fleet.produce(range(total))

    (dead,) = shared_fleet.dead_letters(1)
    headers = dict(dead.headers() or [])
    assert dead.value() == b"7"
    assert headers["deliveries"] == b"3" and headers["error_type"] == b"MaxDeliveriesExceeded"
    assert headers["original_offset"] == b"3"  # value 7 is the 4th message of partition 1
    poll_until(lambda: len(shared_fleet.counts()) == total - 1, timeout=60, what="every other message")
    poll_until(
        lambda: (
            (shared_state(shared_fleet).shared_partition(shared_fleet.topic, 1) or SharedPartition()).low
            == total // PARTITIONS
        ),
        timeout=60,
        what="the low-water mark past the poison message",
    )
    state = shared_state(shared_fleet).shared_partition(shared_fleet.topic, 1)
    assert state is not None and state.dead_letters == 1
    assert "7" not in shared_fleet.counts()
    for supervisor in supervisors:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == ExitCode.OK


def test_a_shared_worker_that_cannot_start_stops_the_supervisor_with_its_exit_code(shared_fleet: Fleet) -> None:
    shared_fleet.env["MW_TEST_BOOT_FAILS"] = "1"  # on_worker_start raises
    supervisor = shared_fleet.start("a", "--processes", "2")
    assert supervisor.wait(timeout=60) == ExitCode.WORKER_BOOT_ERROR
    assert "could not start" in shared_fleet.log_of("a")
