"""A worker's slot: the done set behind its sequence lock, and the position a heartbeat takes from it."""

from __future__ import annotations

import multiprocessing

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol import done_set
from marshal_workers.runtime.channel import _DONE_SEQUENCE, Field, RangeSlot, Slot


def new_slot(next_offset: int = 0) -> Slot:
    return Slot.create(multiprocessing.get_context("fork"), next_offset)


def test_a_slot_never_published_gives_its_next_offset_and_nothing_done() -> None:
    assert new_slot(42).position() == (42, [])
    assert new_slot(42).read_done() is None


def test_the_published_done_set_comes_back() -> None:
    slot = new_slot()
    slot.publish_done(10, [3, 2, 1])
    assert slot.read_done() == (10, (3, 2, 1))
    assert slot.position() == (10, [3, 2, 1])


def test_a_later_next_offset_wins_and_the_done_set_is_cut_above_it() -> None:
    slot = new_slot()
    slot.publish_done(10, [3, 2, 1])  # done: 11-13 and 16; 10, 14, 15 not done
    slot.set(Field.NEXT_OFFSET, 14)  # since then 10 to 13 are done
    assert slot.position() == (14, [0, 1, 1])  # 15 not done, 16 done


def test_a_write_torn_by_a_kill_is_not_read() -> None:
    slot = new_slot(5)
    slot.publish_done(10, [1])
    slot.fields[_DONE_SEQUENCE] += 1  # the sequence left odd, as by a writer killed mid-write
    assert slot.read_done() is None
    assert slot.position() == (5, [])


def test_the_largest_done_set_fits() -> None:
    slot = new_slot()
    runs = [1] * (done_set.MAX_RUNS - 1)  # alternate done and not done: the worst case
    slot.publish_done(0, runs)
    assert slot.read_done() == (0, tuple(runs))


@settings(max_examples=examples(200), deadline=None)
@given(
    first=st.sets(st.integers(1, 300), max_size=60),
    more=st.sets(st.integers(1, 300), max_size=60),
)
def test_the_position_claims_done_only_what_was_done(first: set[int], more: set[int]) -> None:
    # A worker's life: it publishes a done set, then finishes more, moving NEXT_OFFSET to its new lowest
    # unfinished offset.  Whatever the supervisor reads must claim nothing that was not done.
    done_then = first
    done_now = first | more
    lowest_then = min(set(range(302)) - done_then)
    lowest_now = min(set(range(302)) - done_now)
    slot = new_slot()
    slot.publish_done(lowest_then, done_set.encode(lowest_then, [o for o in done_then if o > lowest_then]))
    slot.set(Field.NEXT_OFFSET, lowest_now)
    offset, runs = slot.position()
    claimed = set(range(offset)) | {o for a, b in done_set.decode(offset, runs) for o in range(a, b)}
    assert claimed <= done_now | set(range(lowest_now))
    assert offset == lowest_now


def test_a_range_slot_tells_the_range_in_hand_and_how_far_it_is_done() -> None:
    slot = RangeSlot.create(multiprocessing.get_context("fork"))
    assert slot.read() is None, "no range begun"
    slot.begin(1, 500)
    assert slot.read() == (1, 500, 500)
    slot.advance(742)
    assert slot.read() == (1, 500, 742)
    slot.begin(0, 9000)
    assert slot.read() == (0, 9000, 9000), "a new range starts from nothing done"
    slot.fields[0] += 1  # a kill in the middle of begin(): half of it is not to be trusted
    assert slot.read() is None
