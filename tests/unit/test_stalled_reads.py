"""The pure parts of the stalled-read guard: when to look, who is behind, how the wait grows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.stalled_reads import MAX_WAIT_MS, StallWatch, behind, raised_wait, stall_after


def test_a_reader_that_keeps_returning_records_is_never_looked_at() -> None:
    watch = StallWatch(stall_after_s=0.5)
    for tick in range(100):
        watch.reads += 1  # a non-empty poll
        assert not watch.empty(now=tick * 0.1)  # and an empty one right after: the clock restarts at each read


def test_a_reader_is_looked_at_once_nothing_came_back_for_the_whole_time() -> None:
    watch = StallWatch(stall_after_s=0.5)
    assert not watch.empty(now=10.0)  # the first empty poll starts the clock
    assert not watch.empty(now=10.4)
    assert watch.empty(now=10.5)
    watch.restart(now=10.5)  # looked: a whole stall_after again before the next look
    assert not watch.empty(now=10.9)
    assert watch.empty(now=11.0)


def test_a_read_between_empty_polls_restarts_the_clock() -> None:
    watch = StallWatch(stall_after_s=0.5)
    watch.empty(now=0.0)
    watch.reads += 1
    assert not watch.empty(now=0.6)  # something came back since: idle from 0.6 on
    assert not watch.empty(now=1.0)
    assert watch.empty(now=1.1)


def test_behind_names_the_partitions_whose_end_is_past_the_reader() -> None:
    positions = {("log", 0): 100, ("log", 1): 50, ("log", 2): 7, ("log", 3): -2}
    ends = {("log", 0): 5000, ("log", 1): 50, ("log", 3): 10}  # 2: no fetch answered yet; 3: a logical offset
    assert behind(positions, ends) == {("log", 0): 4900}


@given(st.integers(min_value=0, max_value=10 * MAX_WAIT_MS))
def test_the_wait_grows_until_its_cap_and_never_shrinks(wait_ms: int) -> None:
    raised = raised_wait(wait_ms)
    assert raised <= MAX_WAIT_MS
    assert raised >= min(wait_ms, MAX_WAIT_MS)
    if wait_ms < MAX_WAIT_MS:
        assert raised > wait_ms


def test_a_stall_is_judged_within_half_a_heartbeat_but_never_quicker_than_three_fetch_waits() -> None:
    assert stall_after(heartbeat_s=1.0, wait_ms=5) == 0.5  # recovers within a heartbeat
    assert stall_after(heartbeat_s=1.0, wait_ms=320) == 0.96  # a fetch may take its whole wait
