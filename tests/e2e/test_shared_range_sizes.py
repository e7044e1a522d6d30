"""Shared handlers' ranges sized by the handler (docs/shared-partitions.md, "Range sizes"): a fast handler's leases
grow far past ``range_size``, a slow one's stay small, and either way every message is handled once."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker

PARTITIONS = 2


def claimed_sizes(fleet: Fleet) -> list[tuple[int, list[int]]]:
    """The group's range claims in the coordination log, in log order per log partition: (position among the
    topic's range records, the sizes the claim asked for); with the position of every ack before it."""
    found = fleet.coordination_records()
    acks_before, claims = 0, []
    for record in sorted(found, key=lambda r: r.ts):
        if isinstance(record, codec.AckRanges) and record.topic == fleet.topic:
            acks_before += 1
        elif isinstance(record, codec.ClaimRanges) and record.topic == fleet.topic:
            claims.append((acks_before, [entry.end - entry.offset for entry in record.ranges]))
    return claims


def run_to_the_end(fleet: Fleet, total: int, *args: str) -> None:
    supervisor = fleet.start("a", "--processes", "2", *args)
    try:
        fleet.produce(range(total))
        poll_until(lambda: len(fleet.counts()) == total, timeout=180, what="every message")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == ExitCode.OK
    counts = fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)], "at least once loses nothing"
    assert [value for value, n in counts.items() if n > 1] == [], "no fault: each message handled once"


def test_a_fast_handlers_ranges_grow_far_past_range_size(fleets: Callable[..., Fleet]) -> None:
    fleet = fleets("shared", PARTITIONS, env={"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20"})
    run_to_the_end(fleet, 20_000)
    claims = claimed_sizes(fleet)
    first = [size for acks, sizes in claims if acks == 0 for size in sizes]
    assert first and max(first) <= 20, "before any range is settled, range_size is the size"
    assert max(size for _, sizes in claims for size in sizes) >= 400, (
        f"a handler of a fraction of a millisecond gets ranges of seconds of its work, not 20 offsets: {claims}"
    )


def test_a_slow_handlers_ranges_stay_small_whatever_range_size_says(fleets: Callable[..., Fleet]) -> None:
    # 20 ms a message, a 3 s pending timeout: a lease should cover half a second of work, about 25 messages.
    env = {
        "MW_TEST_SHARED": "1",
        "MW_TEST_RANGE_SIZE": "2000",
        "MW_TEST_PENDING_TIMEOUT": "3s",
        "MW_TEST_DELAY": "0.02",
    }
    fleet = fleets("shared", PARTITIONS, env=env)
    run_to_the_end(fleet, 600)
    claims = claimed_sizes(fleet)
    # The first claims, before anything was measured, are bounded by a share of the backlog (600 between two
    # workers: 300), not range_size's 2000; once two ranges are settled, by the handler's pace.
    assert all(size <= 300 for _, sizes in claims for size in sizes), claims
    later = [size for acks, sizes in claims if acks >= 2 for size in sizes]
    assert later and max(later) <= 50, f"about half a second of a 20 ms handler's work: {claims}"


def test_a_range_longer_than_its_lease_is_renewed_and_handled_once(fleets: Callable[..., Fleet]) -> None:
    """Ranges of 300 offsets of a 20 ms handler (6 s of work) under a 3 s pending timeout: the supervisor renews
    them, and the workers take the renewals in the middle of a fetch's messages.  (They read their pipe only between
    fetches and gave each range up 2.5 s after its claim: some 70 messages of 600 handled twice.  With adaptive ranges,
    the first ranges are that long when the partitions' ends are known before the handler's pace: on a loaded
    machine, the test's producer sends several batches, and the embedded broker lists the last batch's start.)"""
    env = {
        "MW_TEST_SHARED": "1",
        "MW_TEST_RANGE_SIZE": "300",
        "MW_TEST_ADAPTIVE_RANGES": "0",
        "MW_TEST_PENDING_TIMEOUT": "3s",
        "MW_TEST_DELAY": "0.02",
    }
    fleet = fleets("shared", PARTITIONS, env=env)
    run_to_the_end(fleet, 600)
    assert max(size for _, sizes in claimed_sizes(fleet) for size in sizes) > 125, "a range outlasts its first lease"
    assert "ran out" not in fleet.log_of("a"), "no range given up while its supervisor renewed it"
