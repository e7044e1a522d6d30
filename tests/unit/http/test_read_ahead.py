"""ReadAhead: messages read past the held ranges go to the next range claimed, and never to one that would miss
a message."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.http.read_ahead import ReadAhead


def test_the_next_range_takes_what_was_read_past_the_last_one_and_reading_goes_on_from_there() -> None:
    ahead = ReadAhead()
    ahead.note(0, 100, 180, {o: f"m{o}" for o in range(100, 180) if o != 150})  # 150: a marker, no message
    taken = ahead.take(0, 100, 200)
    assert taken is not None
    records, fetched_to = taken
    assert fetched_to == 180  # the rest of the range is read from Kafka, from where the consumer is
    assert sorted(records) == [o for o in range(100, 180) if o != 150]
    assert ahead.take(0, 100, 200) is None  # given back and claimed again: read again, not taken empty


def test_a_range_below_or_past_the_run_is_read_from_kafka() -> None:
    ahead = ReadAhead()
    ahead.note(1, 300, 400, {o: o for o in range(300, 400)})
    assert ahead.take(1, 200, 300) is None
    assert ahead.take(1, 400, 500) is None
    assert ahead.take(0, 300, 400) is None


def test_a_read_that_does_not_continue_the_run_starts_a_new_one() -> None:
    ahead = ReadAhead()
    ahead.note(0, 0, 50, {o: o for o in range(50)})
    ahead.note(0, 70, 90, {o: o for o in range(70, 90)})  # 50..69 were not read past a range: a gap
    assert ahead.take(0, 10, 20) is None
    taken = ahead.take(0, 70, 100)
    assert taken is not None and sorted(taken[0]) == list(range(70, 90)) and taken[1] == 90


def test_a_run_past_its_bound_is_dropped() -> None:
    ahead = ReadAhead(most_kept=10)
    ahead.note(0, 0, 20, {o: o for o in range(20)})
    assert ahead.kept(0) == 0 and ahead.take(0, 0, 5) is None


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=12),  # each read's length step, in tens
    st.sets(st.integers(0, 200)),  # offsets with no message
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 60)), max_size=10),  # ranges claimed: (start, size)
)
def test_whatever_is_taken_is_exactly_the_messages_of_the_range_up_to_where_reading_goes_on(
    steps: list[int], holes: set[int], claims: list[tuple[int, int]]
) -> None:
    """The invariant the promises rest on: a range that takes from the read-ahead gets every message of
    [start, fetched_to) and nothing else; and an offset is never taken twice."""
    ahead = ReadAhead()
    position = 0
    for step in steps:
        reached = position + 10 * step
        ahead.note(0, position, reached, {o: o for o in range(position, reached) if o not in holes})
        position = reached
    taken_before: set[int] = set()
    for start, size in claims:
        found = ahead.take(0, start, start + size)
        if found is None:
            continue
        records, fetched_to = found
        assert start < fetched_to <= min(start + size, position)
        assert set(records) == {o for o in range(start, fetched_to) if o not in holes}
        assert not set(records) & taken_before
        taken_before |= set(range(start, fetched_to))
