"""The done set: offsets done above a partition's progress, as run lengths (marshal_workers.protocol.done_set)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol import done_set
from marshal_workers.protocol.done_set import INT64_MAX, MAX_RUNS, DoneSetTooLarge, Skipper

PROPERTY = settings(
    max_examples=examples(300), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def gaps_in(offset: int, done: set[int]) -> int:
    """Maximal not-done stretches strictly between ``offset`` and the highest done offset."""
    if not done:
        return 0
    top = max(done)
    return sum(1 for x in range(offset + 1, top) if x not in done and (x - 1 == offset or x - 1 in done))


def as_offsets(ranges: list[tuple[int, int]]) -> set[int]:
    return {x for start, stop in ranges for x in range(start, stop)}


# ------------------------------------------------------------------ layout


def test_the_layout_starts_with_a_done_run_just_above_the_offset() -> None:
    assert done_set.encode(10, [11, 12, 13, 16, 20, 21]) == [3, 2, 1, 3, 2]
    assert done_set.decode(10, [3, 2, 1, 3, 2]) == [(11, 14), (16, 17), (20, 22)]


def test_an_offset_just_above_progress_not_done_costs_a_leading_zero() -> None:
    assert done_set.encode(10, [15]) == [0, 4, 1]
    assert done_set.decode(10, [0, 4, 1]) == [(15, 16)]


def test_nothing_done_is_an_empty_list() -> None:
    assert done_set.encode(10, []) == []
    assert done_set.decode(10, []) == []
    assert done_set.parse(10, []) == ()


def test_ranges_and_offsets_mix_and_merge_in_any_order() -> None:
    assert done_set.encode(0, [(5, 8), 3, (7, 10), 4, (20, 20), 10]) == [0, 2, 8]


def test_size_grows_with_the_gaps_not_with_the_done_offsets() -> None:
    assert done_set.encode(0, [(1, 1_000_001)]) == [1_000_000]
    assert orjson.dumps(done_set.encode(0, [(1, 1_000_001), (1_000_002, 2_000_000)])) == b"[1000000,1,999998]"


@pytest.mark.parametrize("done", [[10], [3], [(9, 12)], [INT64_MAX + 1], [(20, INT64_MAX + 2)]])
def test_encode_refuses_offsets_at_or_below_progress_or_beyond_int64(done: list[Any]) -> None:
    with pytest.raises(ValueError):
        done_set.encode(10, done)


def test_encode_raises_rather_than_truncate_a_set_beyond_the_bound() -> None:
    alternating = range(1, 2 * MAX_RUNS + 4, 2)  # every other offset: a gap between each
    with pytest.raises(DoneSetTooLarge, match="window"):
        done_set.encode(0, alternating)
    # The worst a full window of MAX_RUNS offsets (0 stuck, every other one done) can need: it fits.
    fits = done_set.encode(0, range(1, MAX_RUNS, 2))
    assert fits == [1] * (MAX_RUNS - 1) and done_set.parse(0, fits) == tuple(fits)


def test_the_highest_offset_is_int64_max() -> None:
    top = INT64_MAX
    assert done_set.encode(top - 3, [top]) == [0, 2, 1]
    assert done_set.parse(top - 3, [0, 2, 1]) == (0, 2, 1)
    assert done_set.parse(top - 3, [0, 2, 2]) is None


# ------------------------------------------------------------------ lookups


def test_skipper_answers_membership_and_where_to_seek() -> None:
    skipper = Skipper.from_runs(10, [3, 2, 1, 3, 2])
    assert [x for x in range(8, 25) if x in skipper] == [11, 12, 13, 16, 20, 21]
    assert [skipper.next_not_done(x) for x in (10, 11, 13, 14, 16, 20, 22)] == [10, 14, 14, 14, 17, 22, 22]
    assert done_set.is_done(10, [3, 2, 1, 3, 2], 16) and not done_set.is_done(10, [3, 2, 1, 3, 2], 10)
    assert not Skipper([]) and Skipper([(5, 5)]).ranges() == []


# --------------------------------------------------------------- untrusted


MALFORMED: list[Any] = [
    None,
    0,
    1.5,
    "3,2,1",
    b"\x03",
    {"runs": [1]},
    [True],
    [1, False, 1],
    [1.0],
    [-1],
    [1, -2, 1],
    [[1]],
    [1, None, 1],
    ["1"],
    [0],  # a done run of nothing at the end
    [1, 2],  # ends with a gap
    [1, 0, 1],  # a zero after the first run
    [2**63],
    [INT64_MAX, 1, 1],  # beyond int64 once added up
    [1] * (MAX_RUNS + 1),
    [10**30],
]


@pytest.mark.parametrize("value", MALFORMED, ids=repr)
def test_malformed_values_are_no_done_set(value: Any) -> None:
    assert done_set.parse(5, value) is None


@pytest.mark.parametrize("offset", [-1, True, 1.0, "5", None, 2**63])
def test_a_malformed_offset_has_no_done_set(offset: Any) -> None:
    assert done_set.parse(offset, [1]) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=40,
)


@PROPERTY
@given(st.integers(-(2**64), 2**64), json_values)
def test_parse_never_raises_and_accepts_only_canonical_runs(offset: int, value: Any) -> None:
    runs = done_set.parse(offset, value)
    if runs is not None:
        assert done_set.encode(offset, done_set.decode(offset, runs)) == list(runs)


# --------------------------------------------------------------- properties


@st.composite
def done_sets(draw: st.DrawFn) -> tuple[int, set[int]]:
    offset = draw(st.integers(0, 2**40) | st.just(INT64_MAX - 300))
    span = draw(st.integers(0, 300))
    done = draw(st.sets(st.integers(offset + 1, offset + 1 + span), max_size=span))
    return offset, {x for x in done if x <= INT64_MAX}


@PROPERTY
@given(done_sets())
def test_decode_of_encode_is_the_set_and_the_size_is_bounded_by_the_gaps(case: tuple[int, set[int]]) -> None:
    offset, done = case
    runs = done_set.encode(offset, done)
    assert as_offsets(done_set.decode(offset, runs)) == done
    assert len(runs) <= 2 * gaps_in(offset, done) + 1
    assert done_set.parse(offset, orjson.loads(orjson.dumps(runs))) == tuple(runs)  # what a reader gets back
    skipper = Skipper.from_runs(offset, runs)
    for x in range(offset, offset + 310):
        assert (x in skipper) == (x in done)
        following = skipper.next_not_done(x)
        assert following >= x and following not in done and all(y in done for y in range(x, following))


@PROPERTY
@given(
    start=st.integers(0, 60),
    done=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])), max_size=8),
)
def test_resume_past_starts_at_the_first_offset_not_done_and_skips_exactly_the_rest(
    start: int, done: list[tuple[int, int]]
) -> None:
    resume, skip = done_set.resume_past(start, done)
    is_done = {o for a, b in done for o in range(a, b)}
    assert resume >= start and resume not in is_done
    assert all(o in is_done for o in range(start, resume))  # everything skipped at the front was done
    assert {o for a, b in skip for o in range(a, b)} == {o for o in is_done if o > resume}
    assert skip == sorted(skip) and all(a < b for a, b in skip)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(skip))  # merged: no touching ranges
