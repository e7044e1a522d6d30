"""The pure parts of the readers' guards: when to look, who is behind, how the wait grows; records in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.kafka.guarded_consumer import (
    CATCH_UP_WAIT_MS,
    MAX_WAIT_MS,
    REREAD_FOR_S,
    REREADS,
    SHORT_CATCH_UP_WAIT_MS,
    Contiguity,
    Gap,
    GuardedConsumer,
    StallWatch,
    behind,
    catch_up_wait_ms,
    raised_wait,
    stall_after,
)


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


def test_the_watch_says_how_long_a_reader_got_nothing() -> None:
    watch = StallWatch(stall_after_s=0.5)
    watch.empty(now=3.0)
    assert watch.idle_for(now=4.25) == 1.25  # what the stall's log line reports, not the threshold
    watch.reads += 1
    watch.empty(now=5.0)
    assert watch.idle_for(now=5.5) == 0.5


# A consumer is made without a broker (it connects on first use): nothing here fetches.
OFFLINE = {"bootstrap.servers": "127.0.0.1:9", "group.id": "offline", "fetch.wait.max.ms": 5}


def test_a_reader_that_catches_up_waits_long_until_it_tails_then_short() -> None:
    reader = GuardedConsumer(OFFLINE, "catching up", heartbeat_s=1.0, catch_up=True)
    try:
        assert (reader.catching_up, reader.wait_ms) == (True, SHORT_CATCH_UP_WAIT_MS)
        reader.begin_tail()
        assert (reader.catching_up, reader.wait_ms) == (False, 5)
        reader.begin_tail()  # once only
        assert reader.wait_ms == 5
    finally:
        reader.close()


def test_a_reader_that_lists_a_long_partition_catches_up_with_the_long_wait_then_tails_short() -> None:
    reader = GuardedConsumer(OFFLINE, "catching up", heartbeat_s=1.0, catch_up=True)
    try:
        reader.fit_catch_up_wait([(0, 1_000), (0, 30_000)])
        assert reader.wait_ms == SHORT_CATCH_UP_WAIT_MS, "30,000 batches are listed well within the short wait"
        reader.fit_catch_up_wait([(0, 1_000), (5_000, 200_000)])
        assert reader.wait_ms == CATCH_UP_WAIT_MS, "a partition too long to list within 80 ms on a loaded machine"
        reader.fit_catch_up_wait([(0, 10)])
        assert reader.wait_ms == CATCH_UP_WAIT_MS, "never shortened while catching up"
        reader.begin_tail()
        assert (reader.catching_up, reader.wait_ms) == (False, 5)
        reader.fit_catch_up_wait([(0, 500_000)])
        assert reader.wait_ms == 5, "a tail's wait is the guard's to lengthen, on a stall it sees"
    finally:
        reader.close()


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**9))
def test_the_catch_up_wait_is_one_of_two_rungs_and_longer_for_a_longer_partition(a: int, b: int) -> None:
    shorter, longer = sorted((a, b))
    assert catch_up_wait_ms(shorter) in (SHORT_CATCH_UP_WAIT_MS, CATCH_UP_WAIT_MS)
    assert catch_up_wait_ms(shorter) <= catch_up_wait_ms(longer)
    assert catch_up_wait_ms(0) == SHORT_CATCH_UP_WAIT_MS and catch_up_wait_ms(10**9) == CATCH_UP_WAIT_MS


def test_a_reader_that_does_not_catch_up_keeps_its_wait() -> None:
    reader = GuardedConsumer(OFFLINE, "tail", heartbeat_s=1.0)
    try:
        assert (reader.catching_up, reader.wait_ms) == (False, 5)
        reader.begin_tail()
        assert reader.wait_ms == 5
    finally:
        reader.close()
    longer = GuardedConsumer(OFFLINE | {"fetch.wait.max.ms": 1000}, "patient", heartbeat_s=1.0, catch_up=True)
    try:
        assert longer.wait_ms == 1000  # a configured wait longer than the catch-up's is kept throughout
        longer.begin_tail()
        assert longer.wait_ms == 1000
    finally:
        longer.close()


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


KEY = ("log", 0)


def test_a_contiguous_reader_takes_each_offset_once_and_in_order() -> None:
    seen = Contiguity()
    seen.place(KEY, 10)
    assert [seen.check(KEY, offset, 0.0) for offset in (10, 11, 12)] == [Gap.NEXT] * 3
    assert seen.check(KEY, 11, 0.0) is Gap.OLD  # returned already (it comes again after a re-read)
    assert seen.expected[KEY] == 13


def test_a_missing_record_is_read_again_until_it_comes() -> None:
    seen = Contiguity()
    seen.place(KEY, 0)
    assert seen.check(KEY, 0, 0.0) is Gap.NEXT
    assert seen.check(KEY, 2, 0.0) is Gap.REREAD  # 1 is missing: read again from 1
    assert seen.check(KEY, 2, 0.0) is Gap.REREAD
    assert seen.check(KEY, 1, 0.0) is Gap.NEXT  # it came: no gap after all
    assert seen.check(KEY, 2, 0.0) is Gap.NEXT


def test_a_gap_still_there_after_every_re_read_and_the_whole_window_is_a_real_one() -> None:
    seen = Contiguity()
    seen.place(KEY, 0)
    assert [seen.check(KEY, 5, 0.0) for _ in range(REREADS)] == [Gap.REREAD] * REREADS
    assert seen.check(KEY, 5, REREAD_FOR_S) is Gap.ACCEPTED
    assert seen.check(KEY, 6, REREAD_FOR_S) is Gap.NEXT


def test_a_record_a_loaded_broker_stores_after_the_re_reads_are_spent_is_still_waited_for() -> None:
    """A CI run skipped 4 records: 3 re-reads, each at once, passed them by before the broker stored them."""
    seen = Contiguity()
    seen.place(KEY, 0)
    assert [seen.check(KEY, 5, 0.01 * n) for n in range(REREADS + 20)] == [Gap.REREAD] * (REREADS + 20)
    assert seen.check(KEY, 0, 0.5) is Gap.NEXT  # stored half a second later: taken, in order
    assert seen.check(KEY, 1, 0.5) is Gap.NEXT


def test_a_gap_re_read_for_the_whole_window_is_still_re_read_until_the_count_is_spent() -> None:
    seen = Contiguity()
    seen.place(KEY, 0)
    assert seen.check(KEY, 5, 0.0) is Gap.REREAD
    assert [seen.check(KEY, 5, 10.0) for _ in range(REREADS - 1)] == [Gap.REREAD] * (REREADS - 1)
    assert seen.check(KEY, 5, 10.0) is Gap.ACCEPTED


def test_a_reader_placed_at_a_logical_offset_takes_the_first_record_as_it_comes() -> None:
    seen = Contiguity()
    seen.place(KEY, -2)  # OFFSET_BEGINNING: the log may start anywhere
    assert seen.check(KEY, 500, 0.0) is Gap.NEXT
    assert seen.check(KEY, 502, 0.0) is Gap.REREAD


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=30), st.floats(0.0, 0.6)), max_size=60))
def test_whatever_comes_a_contiguous_reader_takes_offsets_strictly_in_order_without_holes_it_did_not_wait_for(
    arrivals: list[tuple[int, float]],
) -> None:
    seen = Contiguity()
    seen.place(KEY, 0)
    taken: list[tuple[int, Gap]] = []
    now = 0.0
    for offset, later in arrivals:  # each record some time after the one before
        now += later
        verdict = seen.check(KEY, offset, now)
        if verdict in (Gap.NEXT, Gap.ACCEPTED):
            taken.append((offset, verdict))
    offsets = [offset for offset, _ in taken]
    assert offsets == sorted(set(offsets))  # in order, each once
    previous = -1
    for offset, verdict in taken:  # a hole only where the reader gave up waiting
        assert offset == previous + 1 or verdict is Gap.ACCEPTED
        previous = offset
