"""A reader catching up stops at the ends it knows: everything written before it began, without an empty fetch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.kafka.catch_up import KnownEnds


def read_until_caught_up(ends: KnownEnds, start: int, high_at_first_fetch: int) -> list[int]:
    """What a reader reads from ``start``: one record at a time until ``ends`` says it is caught up; at the log's
    end (nothing more to fetch) the broker reports end-of-partition, after its whole fetch wait."""
    read: list[int] = []
    offset = start
    while not ends.at_end[0]:
        if offset >= high_at_first_fetch:
            ends.ended(0)  # the empty fetch a reader at its known end never has to wait for
            break
        if ends.wants_fetched_end(0):
            ends.fetched_end(0, high_at_first_fetch)
        ends.read(0, offset)
        read.append(offset)
        offset += 1
    return read


@given(
    batches=st.lists(st.integers(min_value=1, max_value=10), max_size=20),
    later=st.lists(st.integers(min_value=1, max_value=10), max_size=5),
    embedded=st.booleans(),
    start=st.integers(min_value=0, max_value=200),
)
def test_a_reader_catches_up_on_everything_written_before_it_began_and_no_further(
    batches: list[int], later: list[int], embedded: bool, start: int
) -> None:
    end = sum(batches)
    start = min(start, end)
    # ListOffsets: the end on Kafka; on the embedded broker the last batch's base offset plus one.
    listed = end - batches[-1] + 1 if embedded and batches else end
    high = end + sum(later)  # a busy log: more was written before the first fetch came back
    ends = KnownEnds([listed])
    read = read_until_caught_up(ends, start, high)
    assert ends.all_read()
    assert read[: end - start] == list(range(start, end))  # all of it, in order
    assert len(read) <= high - start  # and never past what the first fetch saw: a busy log cannot keep it reading


def test_an_empty_partition_is_read_without_a_fetch() -> None:
    assert KnownEnds([0, 0]).all_read()
    assert not KnownEnds([0, 5]).all_read()
    assert not KnownEnds([-1]).all_read()  # not listed: read until its end is seen


def test_the_embedded_brokers_short_listed_end_is_made_good_by_the_first_fetch() -> None:
    ends = KnownEnds([11])  # a last batch of offsets 10..14 is listed as ending at 11
    ends.fetched_end(0, 15)
    ends.read(0, 10)
    assert not ends.all_read()
    for offset in range(11, 15):
        ends.read(0, offset)
    assert ends.all_read()
    assert ends.targets == [15]
