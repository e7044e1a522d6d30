"""What a checkpoint search keeps for the catch-up after it (reader_start.SearchedRecords): the records from a start
on, up to the first one it did not read, and nothing once it read more than it may keep."""

from __future__ import annotations

from typing import Any

from fake_record import FakeRecord
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.kafka.reader_start import SearchedRecords


def kept(offsets: list[int], most: int = 1_000, partition: int = 0) -> SearchedRecords:
    searched = SearchedRecords(2, most=most)
    for offset in offsets:
        searched.add(partition, offset, FakeRecord(partition=partition, offset=offset))
    return searched


def offsets_of(run: list[Any]) -> list[int]:
    return [record.offset() for record in run]


def test_the_run_from_a_start_goes_up_to_the_first_record_not_read() -> None:
    # Two looks, the later one further back: 10..14 first, then 5..9; a gap after 16.
    searched = kept([10, 11, 12, 13, 14, 5, 6, 7, 8, 9, 16])
    assert offsets_of(searched.run_from(0, 7)) == [7, 8, 9, 10, 11, 12, 13, 14]
    assert offsets_of(searched.run_from(0, 16)) == [16]
    assert searched.run_from(0, 4) == []  # not read: the catch-up reads from there
    assert searched.run_from(1, 10) == []  # another partition


def test_a_search_that_read_more_than_it_may_keep_keeps_nothing() -> None:
    searched = kept(list(range(100)), most=50)
    assert searched.full
    assert searched.run_from(0, 0) == [] and searched.run_from(0, 99) == []


@given(st.lists(st.integers(0, 60)), st.integers(0, 60))
def test_a_run_is_contiguous_from_its_start_and_only_of_records_read(offsets: list[int], start: int) -> None:
    run = offsets_of(kept(offsets).run_from(0, start))
    assert run == list(range(start, start + len(run)))
    assert set(run) <= set(offsets)
    assert start + len(run) not in offsets  # it stops only at a record not read
