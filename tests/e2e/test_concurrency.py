"""Concurrency inside a worker (docs/concurrency.md), end to end: real broker, real supervisors.

The application (tests/apps/lanes_app.py) logs the start ("S") and the end
("E") of every handler call, so each test can say exactly which messages
ran, overlapped, were in flight at a fault, and ran twice.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from fleet import Fleet
from polling import poll_until
from processes import group_gone


@dataclass(frozen=True)
class Call:
    kind: str  # "S": the call began, "E": it returned
    client: str
    pid: int
    partition: int
    offset: int
    key: str
    value: str
    at: float


def calls(fleet: Fleet) -> list[Call]:
    if not fleet.sink.exists():
        return []
    out = []
    for raw in fleet.sink.read_text().splitlines():
        parts = raw.split()
        if len(parts) == 8:
            kind, client, pid, partition, offset, key, value, at = parts
            out.append(Call(kind, client, int(pid), int(partition), int(offset), key, value, float(at)))
    return out


def ends(fleet: Fleet) -> collections.Counter[int]:
    """offset -> times its handler call returned."""
    return collections.Counter(c.offset for c in calls(fleet) if c.kind == "E")


NewFleet = Callable[..., Fleet]


@pytest.fixture
def keyed_fleets(fleets: NewFleet) -> NewFleet:
    """``keyed_fleets(name, count, keys)``: a fresh 1-partition topic holding ``count`` messages of ``keys`` keys,
    run by lanes_app (the fleets fixture stops it)."""

    def new(name: str, count: int, keys: int) -> Fleet:
        fleet = fleets(f"lanes-{name}", 1, app="lanes_app:app")
        produce_keyed(fleet, count, keys)
        return fleet

    return new


def produce_keyed(fleet: Fleet, count: int, keys: int) -> None:
    """Values 0..count-1 on partition 0, key ``k<value % keys>``."""
    producer = Producer({"bootstrap.servers": fleet.brokers, "linger.ms": 5})
    for n in range(count):
        producer.produce(fleet.topic, value=str(n).encode(), key=f"k{n % keys}".encode(), partition=0)
    assert producer.flush(30) == 0


def stop(fleet: Fleet, client: str, signum: int = signal.SIGTERM) -> None:
    process = fleet.processes[client]
    os.kill(process.pid, signum)
    process.wait(timeout=60)


def handle_all(fleet: Fleet, count: int, **env: str) -> list[Call]:
    """Run supervisor "a" until it has handled messages 0..count-1, stop it, check each ran to its end once."""
    fleet.start("a", **env)
    poll_until(lambda: len(ends(fleet)) >= count, timeout=120, what=f"{count} messages handled")
    stop(fleet, "a")
    assert ends(fleet) == collections.Counter(range(count))  # every message once, none twice
    return calls(fleet)


# ---------------------------------------------------------------- throughput


def test_concurrency_32_runs_many_calls_at_once_and_handles_every_message_once(keyed_fleets: NewFleet) -> None:
    count = 200
    fleet = keyed_fleets("c32", count, keys=1000)
    seen = handle_all(fleet, count, MW_TEST_CONCURRENCY="32", MW_TEST_DELAY="0.02")
    # 20 ms calls, 1,000 keys: the lanes fill up. Never more than the 32 asked; how much faster that makes a
    # partition is a benchmark's (bench_concurrency.py).
    assert 16 <= max_overlap(seen) <= 32


# ------------------------------------------------------------------ ordering


def test_key_ordering_never_overlaps_a_key_and_keeps_its_offset_order(keyed_fleets: NewFleet) -> None:
    count = 400
    fleet = keyed_fleets("keys", count, keys=10)
    seen = handle_all(fleet, count, MW_TEST_ASYNC="1", MW_TEST_CONCURRENCY="16", MW_TEST_MAX_DELAY="0.01")
    by_key: dict[str, list[tuple[int, float, float]]] = collections.defaultdict(list)
    started = {c.offset: c.at for c in seen if c.kind == "S"}
    for c in seen:
        if c.kind == "E":
            by_key[c.key].append((c.offset, started[c.offset], c.at))
    for key, runs in by_key.items():
        runs.sort(key=lambda run: run[1])  # by start time
        assert [offset for offset, _, _ in runs] == sorted(offset for offset, _, _ in runs), f"{key} out of order"
        for (_, _, previous_end), (offset, start, _) in itertools.pairwise(runs):
            assert start >= previous_end, f"{key}: offset {offset} began before the previous one of its key ended"
    # Different keys did overlap: the lanes ran side by side.
    assert max_overlap(seen) > 1


def max_overlap(seen: list[Call]) -> int:
    events = sorted((c.at, 1 if c.kind == "S" else -1) for c in seen)
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


# --------------------------------------------------------------------- faults


def in_flight(seen: list[Call], client: str) -> set[int]:
    """Offsets whose call began under ``client`` and never returned there."""
    began = {c.offset for c in seen if c.client == client and c.kind == "S"}
    return began - {c.offset for c in seen if c.client == client and c.kind == "E"}


def all_gated_calls_block(fleet: Fleet, client: str, lanes: int, every: int = 20) -> bool:
    """At least ``lanes`` calls of ``client`` are in flight, and only gated ones (values divisible by ``every``):
    every other call it began has returned."""
    seen = calls(fleet)
    stuck = in_flight(seen, client)
    values = {c.offset: c.value for c in seen if c.client == client and c.kind == "S"}
    return len(stuck) >= lanes and all(int(values[offset]) % every == 0 for offset in stuck)


def blocked_and_settled(fleet: Fleet, client: str, lanes: int) -> Callable[[], bool]:
    """A poll condition: the gated calls block, and no call returned since the last poll (a batch's other messages
    still being handed to free lanes finish before it holds)."""
    last = [-1]

    def settled() -> bool:
        if not all_gated_calls_block(fleet, client, lanes):
            last[0] = -1
            return False
        done = len(ends(fleet))
        same, last[0] = done == last[0], done
        return same

    return settled


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_kill_9_with_32_in_flight_reruns_exactly_those_under_alo_and_none_under_amo(
    keyed_fleets: NewFleet, tmp_path: Path, mode: str
) -> None:
    count, gate = 2000, tmp_path / "gate"
    fleet = keyed_fleets(f"kill-{mode}", count, keys=1000)
    # Every 20th message blocks until the gate opens: under ALO all 32 lanes end up on blocked ones.
    # Under AMO a claim is a batch of 100, so its 5 blocked messages are what is in flight at the kill.
    env = {
        "MW_TEST_MODE": mode,
        "MW_TEST_CONCURRENCY": "32",
        "MW_TEST_GATE_VALUES": "20",
        "MW_TEST_GATE_FILE": str(gate),
        "MW_TEST_BATCH_SIZE": "100",
    }
    fleet.start("a", **env)
    blocked = 32 if mode == "alo" else 5
    poll_until(blocked_and_settled(fleet, "a", blocked), timeout=60, interval=0.5, what=f"{blocked} blocked calls")
    # Nothing can finish now: wait until a heartbeat (every 1 s) has carried the last done set, then kill.
    done_before = len(ends(fleet))
    poll_until(lambda: heartbeat_seen_after(fleet), timeout=30, what="a heartbeat after the lanes blocked")
    assert len(ends(fleet)) == done_before
    os.kill(fleet.processes["a"].pid, signal.SIGKILL)
    fleet.processes["a"].wait(timeout=30)
    # Its worker dies with its fork server: only then may the gate open (a live worker would finish them).
    poll_until(lambda: group_gone(fleet.processes["a"].pid), timeout=30, what="a's workers gone")
    killed_in_flight = in_flight(calls(fleet), "a")
    assert len(killed_in_flight) == blocked
    gate.touch()
    fleet.start("b", **env)
    done_by_a = {c.offset for c in calls(fleet) if c.client == "a" and c.kind == "E"}
    if mode == "alo":
        poll_until(lambda: set(ends(fleet)) >= set(range(count)), timeout=120, what="every message handled")
        seen = calls(fleet)
        rerun = {c.offset for c in seen if c.client == "b" and c.kind == "S"} & {
            c.offset for c in seen if c.client == "a"
        }
        assert rerun == killed_in_flight  # exactly what was in flight ran again: no done message did
        assert not done_by_a & {c.offset for c in seen if c.client == "b"}
        assert max(ends(fleet).values()) == 1  # and so nothing returned twice
    else:
        expected = set(range(count)) - killed_in_flight
        poll_until(lambda: set(ends(fleet)) >= expected, timeout=120, what="every message not lost handled")
        seen = calls(fleet)
        started_twice = collections.Counter(c.offset for c in seen if c.kind == "S")
        assert max(started_twice.values()) == 1  # at most once: nothing ran twice
        assert set(ends(fleet)) == expected  # lost: only the blocked calls of the claimed batch
        assert max(killed_in_flight) < 100


def heartbeat_seen_after(fleet: Fleet) -> bool:
    """True once the log shows the partition's heartbeat with a done set (a heartbeat after the lanes blocked)."""
    row = fleet.status_rows()[0]
    return row["in_flight"] is not None and row["in_flight"] >= 5


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_sigterm_mid_flight_loses_nothing_and_repeats_nothing(keyed_fleets: NewFleet, mode: str) -> None:
    count = 1500
    fleet = keyed_fleets(f"term-{mode}", count, keys=1000)
    env = {"MW_TEST_MODE": mode, "MW_TEST_CONCURRENCY": "32", "MW_TEST_MAX_DELAY": "0.05", "MW_TEST_BATCH_SIZE": "100"}
    fleet.start("a", **env)
    poll_until(lambda: len(ends(fleet)) >= 300, timeout=60, what="300 messages handled")
    stop(fleet, "a")
    assert fleet.processes["a"].returncode == 0
    assert in_flight(calls(fleet), "a") == set()  # every call that began also returned
    fleet.start("b", **env)
    poll_until(lambda: len(ends(fleet)) >= count, timeout=120, what="every message handled")
    stop(fleet, "b")
    assert ends(fleet) == collections.Counter(range(count))  # zero lost, zero duplicates


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_a_supervisor_frozen_past_its_lease_loses_nothing_under_alo_and_repeats_nothing_under_amo(
    keyed_fleets: NewFleet, mode: str
) -> None:
    count = 3000
    fleet = keyed_fleets(f"stop-{mode}", count, keys=1000)
    env = {"MW_TEST_MODE": mode, "MW_TEST_CONCURRENCY": "8", "MW_TEST_MAX_DELAY": "0.02", "MW_TEST_BATCH_SIZE": "100"}
    fleet.start("a", **env)
    poll_until(lambda: len(ends(fleet)) >= 500, timeout=60, what="500 messages handled")
    frozen = fleet.processes["a"]
    os.kill(frozen.pid, signal.SIGSTOP)  # the supervisor only: its worker runs on until its lease lapses
    frozen_at = time.time()
    try:
        fleet.start("b", **env)
        poll_until(lambda: any(c.client == "b" for c in calls(fleet)), timeout=60, what="b to take over")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    poll_until(lambda: fleet.status_rows()[0]["offset"] == count, timeout=120, what="b to reach the end")
    stop(fleet, "b")
    stop(fleet, "a")
    seen = calls(fleet)
    # The lease: a's worker started nothing later than 1.5 HB after a's last write (slack for a loaded machine).
    assert max(c.at for c in seen if c.client == "a" and c.kind == "S") < frozen_at + 1.5 + 1.0
    handled = ends(fleet)
    if mode == "alo":
        assert set(handled) == set(range(count))  # nothing lost
        repeated = {offset for offset, times in handled.items() if times > 1}
        # Only what a finished after its last heartbeat (every HB/2) can be repeated: nothing older.
        recent = {c.offset for c in seen if c.client == "a" and c.kind == "E" and c.at >= frozen_at - 1.5}
        assert repeated <= recent
    else:
        assert max(collections.Counter(c.offset for c in seen if c.kind == "S").values()) == 1  # nothing twice
        lost = set(range(count)) - set(handled)
        assert not lost or max(lost) - min(lost) < 100  # at most the one batch a had claimed


def test_retries_of_one_key_do_not_delay_the_other_keys(keyed_fleets: NewFleet) -> None:
    count = 100
    fleet = keyed_fleets("retry", count, keys=20)
    # Every call on key k0 fails twice before it succeeds, 0.2 s then 0.4 s later (no jitter): 0.6 s per k0 message.
    seen = handle_all(
        fleet,
        count,
        MW_TEST_CONCURRENCY="8",
        MW_TEST_DELAY="0.01",
        MW_TEST_FAIL_KEY="k0",
        MW_TEST_RETRY_BACKOFF="0.2s",
        MW_TEST_RETRY_JITTER="0",
    )
    k0 = [c for c in seen if c.key == "k0"]
    assert collections.Counter(c.offset for c in k0 if c.kind == "S") == {o: 3 for o in range(0, count, 20)}
    first_k0_done = min(c.at for c in k0 if c.kind == "E")
    others_done = max(c.at for c in seen if c.kind == "E" and c.key != "k0")
    assert others_done < first_k0_done  # the other 95 messages were done while k0's first one still waited
    k0_ends = sorted((c.at, c.offset) for c in k0 if c.kind == "E")
    assert [offset for _, offset in k0_ends] == list(range(0, count, 20))  # k0 kept its order through retries


def test_a_call_past_the_hard_time_limit_kills_the_worker_and_after_its_retries_is_dead_lettered(
    keyed_fleets: NewFleet, tmp_path: Path
) -> None:
    count = 200
    fleet = keyed_fleets("limit", count, keys=1000)
    # Message 0 blocks for ever (its gate never opens); the time limit kills its worker each time.
    fleet.start(
        "a",
        MW_TEST_CONCURRENCY="8",
        MW_TEST_GATE_VALUES="1000",
        MW_TEST_GATE_FILE=str(tmp_path / "never"),
        MARSHAL_WORKERS_TIME_LIMIT="1s",
    )
    [dead] = fleet.dead_letters(1)
    headers = dict(dead.headers())
    assert (headers["error_type"], headers["original_offset"], dead.value()) == (b"TimeLimitExceeded", b"0", b"0")
    poll_until(lambda: set(ends(fleet)) >= set(range(1, count)), timeout=60, what="every other message handled")
    stop(fleet, "a")
    starts = collections.Counter(c.offset for c in calls(fleet) if c.kind == "S")
    assert starts[0] == 4  # the first call and its 3 retries, each killed; then dead-lettered without a call
    assert 0 not in ends(fleet)
    assert "ran past time_limit" in fleet.log_of("a")


def test_a_stuck_message_holds_the_window_visibly_and_lets_go_when_done(keyed_fleets: NewFleet, tmp_path: Path) -> None:
    count, gate = 300, tmp_path / "gate"
    fleet = keyed_fleets("window", count, keys=1000)
    # Message 0 blocks until the gate opens; the window of 50 lets the worker read only up to offset 49.
    fleet.start(
        "a", MW_TEST_CONCURRENCY="4", MW_TEST_WINDOW="50", MW_TEST_GATE_VALUES="100000", MW_TEST_GATE_FILE=str(gate)
    )
    poll_until(lambda: set(ends(fleet)) == set(range(1, 50)), timeout=60, what="offsets 1-49 done around the stuck 0")
    row = poll_until(
        lambda: (r := fleet.status_rows()[0])["window_used"] == 50 and r,
        timeout=30,
        what="status to show a full window",
    )
    assert (row["offset"], row["in_flight"]) == (0, 1)  # resumes at the stuck message; one call running
    poll_until(lambda: "the window (50 offsets) has been full" in fleet.log_of("a"), timeout=30, what="the warning")
    assert "offset 0 is not done (running" in fleet.log_of("a")
    assert set(ends(fleet)) == set(range(1, 50))  # nothing past the window was read meanwhile
    gate.touch()
    poll_until(lambda: len(ends(fleet)) >= count, timeout=60, what="every message handled")
    stop(fleet, "a")
    assert ends(fleet) == collections.Counter(range(count))


def test_a_batch_handler_runs_batches_side_by_side_each_message_once(keyed_fleets: NewFleet) -> None:
    count = 400
    fleet = keyed_fleets("batches", count, keys=1000)
    seen = handle_all(
        fleet, count, MW_TEST_BATCH="1", MW_TEST_BATCH_SIZE="10", MW_TEST_CONCURRENCY="4", MW_TEST_DELAY="0.05"
    )
    assert max_overlap(seen) > 10  # more than one batch of 10 in flight at once
    assert max_overlap(seen) <= 40  # never more than 4 batches
