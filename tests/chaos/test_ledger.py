"""The nemesis's own logic, without a broker: its plans and its verdicts on made-up ledgers."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from fleet import SinkLine
from ledger import (
    FaultWindow,
    broker_stalls,
    loss_runs,
    out_of_key_order,
    repeats,
    unavailable_s,
    unexplained_losses,
    unexplained_repeats,
)
from nemesis import Kind, plan_faults
from test_nemesis import HOLDING_FAULT_SECONDS, HOLDING_KINDS, HOLDING_SEED, SUITE_FAULT_SECONDS, SUITE_SEEDS


def line(offset: int, at: float, partition: int = 0, pid: int = 1) -> SinkLine:
    return SinkLine("s0", pid, partition, offset, str(offset), at)


def kill(at: float) -> FaultWindow:
    return FaultWindow("kill_supervisor", True, at, at)


def test_a_seed_fixes_the_plan() -> None:
    assert plan_faults(7, 90) == plan_faults(7, 90)
    assert plan_faults(7, 90) != plan_faults(8, 90)


def test_a_long_plan_has_every_kind_of_fault_every_2_to_6_seconds() -> None:
    plan = plan_faults(1, 600)
    assert {fault.kind for fault in plan} == set(Kind)
    gaps = [b.at - a.at for a, b in itertools.pairwise(plan)]
    assert all(2.0 - 1e-3 <= gap <= 6.0 + 1e-3 for gap in gaps)
    freezes = [f.length for f in plan if f.kind is Kind.FREEZE_BROKER_PAST_LEASE]
    assert all(f > 1.5 for f in freezes), "longer than a lease (1.5 HB)"


@pytest.mark.parametrize("mode", sorted(SUITE_SEEDS))
def test_the_suite_meets_every_kind_of_fault(mode: str) -> None:
    assert {fault.kind for fault in plan_faults(SUITE_SEEDS[mode], SUITE_FAULT_SECONDS)} == set(Kind)


def test_the_suite_runs_of_lanes_and_shared_workers_meet_every_fault_of_a_supervisor_or_a_worker() -> None:
    assert HOLDING_KINDS <= {fault.kind for fault in plan_faults(HOLDING_SEED, HOLDING_FAULT_SECONDS)}


def test_losses_come_as_runs_with_the_times_around_them() -> None:
    delivered = [(0, o) for o in range(10)] + [(1, o) for o in range(3)]
    handled = [line(o, 100.0 + o) for o in (0, 1, 2, 5, 6, 7, 9)] + [line(o, 50.0, partition=1) for o in range(3)]
    runs = loss_runs(delivered, handled)
    assert [(r.partition, r.first, r.last, r.after, r.before) for r in runs] == [
        (0, 3, 4, 102.0, 105.0),
        (0, 8, 8, 107.0, 109.0),
    ]


def test_a_run_needs_one_overlapping_unclean_fault_per_claimed_batch() -> None:
    delivered = [(0, o) for o in range(40)]
    handled = [line(o, 10.0) for o in range(5)] + [line(o, 20.0) for o in range(30, 40)]
    [run] = loss_runs(delivered, handled)  # 25 lost: needs 2 faults with batches of 20
    assert unexplained_losses([run], [kill(15.0), kill(16.0)], batch_size=20, slack=0.0) == []
    assert len(unexplained_losses([run], [kill(15.0)], batch_size=20, slack=0.0)) == 1
    assert len(unexplained_losses([run], [kill(15.0), kill(25.0)], batch_size=20, slack=0.0)) == 1, "out of time"
    clean = FaultWindow("sigterm", False, 15.0, 15.5)
    assert len(unexplained_losses([run], [kill(15.0), clean], batch_size=20, slack=0.0)) == 1, "a clean stop"


def test_one_fault_explains_one_run_per_partition() -> None:
    delivered = [(0, o) for o in range(10)]
    handled = [line(o, 10.0 + o) for o in (0, 3, 4, 9)]
    runs = loss_runs(delivered, handled)
    assert len(runs) == 2
    assert len(unexplained_losses(runs, [kill(12.0)], batch_size=20, slack=5.0)) == 1
    assert unexplained_losses(runs, [kill(12.0), kill(13.0)], batch_size=20, slack=5.0) == []


def test_with_calls_in_flight_together_one_claimed_batch_may_leave_several_runs() -> None:
    delivered = [(0, o) for o in range(50)]
    handled = [line(o, 10.0 + o / 100) for o in range(50) if o not in (3, 4, 7, 12, 30)]
    runs = loss_runs(delivered, handled)  # 3..4, 7, 12 within one batch of 20; 30 in the next
    assert len(runs) == 4
    assert len(unexplained_losses(runs, [kill(10.05)], batch_size=20, slack=1.0)) == 3  # one run per fault
    assert len(unexplained_losses(runs, [kill(10.05)], batch_size=20, slack=1.0, holes=True)) == 1, "30: a 2nd batch"
    assert unexplained_losses(runs, [kill(10.05), kill(10.2)], batch_size=20, slack=1.0, holes=True) == []


def test_a_fault_may_explain_as_many_batches_as_it_has_units() -> None:
    delivered = [(0, o) for o in range(100)]
    handled = [line(o, 10.0 + o / 100) for o in range(100) if not 20 <= o < 60]
    [run] = loss_runs(delivered, handled)  # 40 lost: two ranges of 20
    assert len(unexplained_losses([run], [kill(10.3)], batch_size=20, slack=1.0)) == 1
    assert unexplained_losses([run], [kill(10.3)], batch_size=20, slack=1.0, units=lambda fault: 4) == []


def test_a_worker_handles_each_key_in_offset_order() -> None:
    def keyed(offset: int, pid: int) -> SinkLine:
        return SinkLine("s0", pid, 0, offset, str(offset), 0.0)

    key_of = lambda value: str(int(value) % 2)  # noqa: E731
    in_order = [keyed(0, 1), keyed(2, 1), keyed(1, 1), keyed(4, 1), keyed(3, 1)]  # keys 0: 0 2 4; 1: 1 3
    assert out_of_key_order(in_order, key_of) == []
    assert len(out_of_key_order([keyed(2, 1), keyed(0, 1)], key_of)) == 1
    assert out_of_key_order([keyed(2, 1), keyed(0, 2)], key_of) == []  # a new worker after a fault may go back


def test_a_repeat_must_follow_an_unclean_fault() -> None:
    handled = [line(1, 10.0, pid=1), line(1, 20.0, pid=2), line(2, 10.5)]
    found = repeats(handled)
    assert [(r.offset, r.first_at, r.again_at) for r in found] == [(1, 10.0, 20.0)]
    assert unexplained_repeats(found, [kill(15.0)], slack=0.0) == []
    assert len(unexplained_repeats(found, [FaultWindow("sigterm", False, 15.0, 15.2)], slack=0.0)) == 1
    assert len(unexplained_repeats(found, [kill(25.0)], slack=0.0)) == 1


@pytest.mark.parametrize("script", ["run_nemesis.py", "tansu_stalled_fetches.py"])
def test_the_long_run_command_starts(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script)), "--help"], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0 and "usage" in result.stdout


def test_the_broker_is_unavailable_during_windows_and_their_recovery_counted_once() -> None:
    assert unavailable_s([], 10.0, 20.0, recovery=2.0) == 0.0
    assert unavailable_s([(12.0, 13.0)], 10.0, 20.0, recovery=2.0) == 3.0  # 12..15
    assert unavailable_s([(12.0, 13.0), (12.5, 14.0)], 10.0, 20.0, recovery=2.0) == 4.0  # overlapping: 12..16
    assert unavailable_s([(5.0, 9.0)], 10.0, 20.0, recovery=2.0) == 1.0  # recovering at the start: 10..11
    assert unavailable_s([(19.0, 25.0)], 10.0, 20.0, recovery=2.0) == 1.0  # cut at the end
    assert unavailable_s([(1.0, 2.0), (30.0, 31.0)], 10.0, 20.0, recovery=2.0) == 0.0


def test_the_brokers_own_stalls_past_a_lease_are_unclean_faults_less_the_freezes() -> None:
    canary = [(10.0, 10.8), (10.5, 11.9), (11.8, 12.2), (20.0, 21.0), (30.0, 32.4), (40.0, 45.0)]
    stalls = broker_stalls(canary, freezes=[(29.0, 30.5), (40.0, 41.0)], lease=1.5, grace=0.5)
    assert stalls == [
        FaultWindow("broker_stall", True, 10.0, 12.2, "broker"),  # three overlapping records, 2.2 s
        FaultWindow("broker_stall", True, 41.5, 45.0, "broker"),  # stalled 4 s past the freeze's end
    ]  # 20..21 is shorter than a lease; 31..32.4, past a freeze, too
