"""The replay and audit planner: offset ranges -> splits, each at most max_split offsets (pure, hypothesis)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.spark.planner import Split, plan_splits, total_size


@st.composite
def ranges(draw: st.DrawFn) -> list[Split]:
    """Whole-partition ranges of one or two topics, some empty, some far from offset 0."""
    out = []
    for topic in draw(st.sets(st.sampled_from(["orders", "payments"]), min_size=1)):
        for partition in draw(st.sets(st.integers(0, 7), min_size=1, max_size=5)):
            start = draw(st.integers(0, 10**12))
            out.append(Split(topic, partition, start, start + draw(st.integers(0, 5000))))
    return out


@given(ranges(), st.integers(1, 6000))
def test_splits_cover_each_range_exactly_once_within_the_cap(whole: list[Split], max_split: int) -> None:
    splits = plan_splits(whole, max_split)
    by_partition: dict[tuple[str, int], list[Split]] = defaultdict(list)
    for split in splits:
        assert 0 < split.size <= max_split
        by_partition[(split.topic, split.partition)].append(split)
    for original in whole:
        pieces = by_partition.pop((original.topic, original.partition), [])
        if original.size == 0:
            assert pieces == []  # an empty range makes no task
            continue
        # Contiguous, in order, no gap, no overlap: together exactly [start, end).
        assert pieces[0].start == original.start and pieces[-1].end == original.end
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        # The fewest pieces that fit, as even as can be (like Spark's Kafka source).
        assert len(pieces) == -(-original.size // max_split)
        assert max(p.size for p in pieces) - min(p.size for p in pieces) <= 1
    assert not by_partition, "no split outside the ranges"
    assert total_size(splits) == sum(r.size for r in whole)
    assert splits == sorted(splits)


def test_a_large_range_is_cut_into_even_pieces() -> None:
    assert plan_splits([Split("t", 0, 100, 350)], 100) == [
        Split("t", 0, 100, 184),
        Split("t", 0, 184, 267),
        Split("t", 0, 267, 350),
    ]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_split"):
        plan_splits([Split("t", 0, 0, 10)], 0)
    with pytest.raises(ValueError, match="start <= end"):
        Split("t", 0, 10, 5)
    assert str(Split("orders", 3, 5, 9)) == "orders[3] 5..9"
