"""The offsets done above a partition's progress, as a compact list of run lengths.

With concurrency inside a worker (docs/concurrency.md) messages finish out
of order.  The progress ``offset`` of a heartbeat or release is the lowest
offset NOT done; the offsets done above it travel beside it in an extra field
``done``, so after an unclean failure the next owner re-delivers what was in
flight and nothing that was done.

Layout: a JSON list of ints >= 0, alternating run lengths that start just
above ``offset`` (``offset`` itself is, by definition, not done)::

    [done, gap, done, gap, ..., done]

For offset 10 and done offsets {11, 12, 13, 16, 20, 21} it is ``[3, 2, 1, 3, 2]``.
Canonical form, which is all :func:`parse` accepts:

* ``[]``: nothing is done above ``offset``;
* otherwise an odd length, ending with a done run (nothing above the last
  done offset is done, so a trailing gap would say nothing);
* only the first run may be 0: ``[0, gap, done, ...]`` when ``offset + 1``
  is not done.  Every later run is >= 1, so one set has one encoding.

Why done-first: the usual reason progress stalls is one slow message at
``offset`` with later ones finishing around it, so ``offset + 1`` is usually
done and the list starts without a wasted 0.  The size grows with the number
of gaps (not-done stretches between ``offset`` and the highest done offset),
never with the number of done offsets: ``len(runs) <= 2 * gaps + 1``.
A bitset (the Confluent Parallel Consumer's other encoding) is smaller only
for dense alternation, which the window already bounds; one layout keeps
every reader simple.

Bound: at most :data:`MAX_RUNS` entries.  :func:`encode` raises
:class:`DoneSetTooLarge` rather than drop anything (a truncated set would
silently re-deliver done work, or worse, if cut wrongly, skip undone work).
What keeps a real set small is the worker's window: every done offset lies
within ``window`` of the lowest unfinished one, so a list never has more than
``window - 1`` entries, and a window of at most :data:`MAX_RUNS` can never
overflow (``lanes.Lanes`` refuses a larger one).

Everything read from the coordination topic is untrusted: :func:`parse`
returns the canonical runs or None for any other value, and never raises.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Final

import msgspec

# A worst-case list (runs of 1) is ~16 KB of JSON: small enough for a heartbeat that every reader folds.
MAX_RUNS: Final = 8192
INT64_MAX: Final = 2**63 - 1  # Kafka offsets are int64

Runs = tuple[int, ...]
Range = tuple[int, int]  # half-open [start, stop)

# Types and bounds of every entry are checked in C (msgspec), so a reader pays little even for a full list.
_RunsOnTheWire = Annotated[
    tuple[Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)], ...], msgspec.Meta(max_length=MAX_RUNS)
]


class DoneSetTooLarge(ValueError):
    """The done set needs more than MAX_RUNS entries: the window setting is larger than it may be."""


def encode(offset: int, done: Iterable[int | Range]) -> list[int]:
    """The runs of a done set above ``offset``: done offsets, half-open ranges, or a mix, in any order.

    Overlapping and adjacent ranges merge.  Raises ValueError for a done offset
    at or below ``offset`` (``offset`` is the lowest offset not done) or beyond
    int64, and DoneSetTooLarge if the result would exceed MAX_RUNS entries.
    """
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
        raise ValueError(f"offset must be an int in [0, 2**63 - 1], got {offset!r}")
    runs: list[int] = []
    end = offset + 1  # the first offset not yet covered by the runs
    for start, stop in _merged(_as_ranges(done)):
        if start <= offset or stop > INT64_MAX + 1:
            raise ValueError(f"done offsets must lie in ({offset}, 2**63 - 1], got [{start}, {stop})")
        if runs:
            runs.append(start - end)  # the gap since the previous done run
        elif start > end:
            runs += (0, start - end)  # offset + 1 is not done: an empty first done run, then the gap
        runs.append(stop - start)
        end = stop
        if len(runs) > MAX_RUNS:
            raise DoneSetTooLarge(
                f"the done set above offset {offset} needs more than {MAX_RUNS} entries; "
                f"keep the window at most {MAX_RUNS} offsets"
            )
    return runs


def decode(offset: int, runs: Sequence[int]) -> list[Range]:
    """The done offsets above ``offset`` as sorted, disjoint half-open ranges.

    ``runs`` must be valid (from :func:`encode` or :func:`parse`); an empty first run yields no range.
    """
    ranges: list[Range] = []
    position = offset + 1
    for index, length in enumerate(runs):
        if index % 2 == 0 and length:
            ranges.append((position, position + length))
        position += length
    return ranges


def parse(offset: Any, value: Any) -> Runs | None:
    """``value`` as canonical runs above ``offset`` if it is one, else None.  Never raises.

    None for: anything but a list (or tuple) of ints, bools, negatives, more than
    MAX_RUNS entries, an even length, a 0 after the first entry or as the last, a done offset
    beyond int64, or an ``offset`` that is not an int in [0, 2**63 - 1].
    """
    if type(offset) is not int or not 0 <= offset <= INT64_MAX:
        return None
    try:
        runs = msgspec.convert(value, _RunsOnTheWire)
    except (msgspec.MsgspecError, TypeError, ValueError, RecursionError):
        return None
    if not runs:
        return runs
    if len(runs) % 2 == 0 or runs[-1] == 0 or 0 in runs[1:] or offset + sum(runs) > INT64_MAX:
        return None
    return runs


def is_done(offset: int, runs: Sequence[int], x: int) -> bool:
    """Whether ``x`` is done by these runs (a single question; build a Skipper to ask many)."""
    return x in Skipper(decode(offset, runs))


class Skipper:
    """The done ranges a new owner skips, for lookups in O(log n).

    A new owner resumes at ``resume_offset`` and asks, for each fetched offset,
    whether it was done already (``x in skipper``), or where the next offset to
    process is (:meth:`next_not_done`, to seek past a long done run).
    """

    __slots__ = ("_starts", "_stops")

    def __init__(self, ranges: Iterable[Range]) -> None:
        merged = list(_merged((start, stop) for start, stop in ranges if stop > start))
        self._starts = [start for start, _ in merged]
        self._stops = [stop for _, stop in merged]

    @classmethod
    def from_runs(cls, offset: int, runs: Sequence[int]) -> Skipper:
        return cls(decode(offset, runs))

    def __contains__(self, x: int) -> bool:
        index = bisect_right(self._starts, x) - 1
        return index >= 0 and x < self._stops[index]

    def next_not_done(self, x: int) -> int:
        """The lowest offset >= ``x`` that is not done."""
        index = bisect_right(self._starts, x) - 1
        return self._stops[index] if index >= 0 and x < self._stops[index] else x

    def ranges(self) -> list[Range]:
        return list(zip(self._starts, self._stops))

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __repr__(self) -> str:
        return f"Skipper({self.ranges()!r})"


def above(ranges: list[Range], offset: int) -> list[Range]:
    """The parts of ``ranges`` strictly above ``offset``."""
    return [(max(start, offset + 1), stop) for start, stop in ranges if stop > offset + 1]


def resume_past(start: int, done: Iterable[Range]) -> tuple[int, list[Range]]:
    """Where to resume and what to skip, given a start offset and done ranges (any order, any overlap):
    the first offset at or after ``start`` not done, and the done ranges above it, merged and sorted
    (a done set is only ever above its offset)."""
    ranges = [(max(a, start), b) for a, b in _merged(r for r in done if r[1] > r[0]) if b > start]
    while ranges and ranges[0][0] <= start:
        start = max(start, ranges.pop(0)[1])
    return start, ranges


def _as_ranges(done: Iterable[int | Range]) -> list[Range]:
    ranges: list[Range] = []
    for item in done:
        if isinstance(item, tuple):
            start, stop = item
            if stop > start:  # an empty range says nothing
                ranges.append((start, stop))
        else:
            ranges.append((item, item + 1))
    return ranges


def _merged(ranges: Iterable[Range]) -> Iterable[Range]:
    """Sorted, with overlapping and adjacent ranges joined."""
    current: list[int] | None = None
    for start, stop in sorted(ranges):
        if current is not None and start <= current[1]:
            current[1] = max(current[1], stop)
            continue
        if current is not None:
            yield current[0], current[1]
        current = [start, stop]
    if current is not None:
        yield current[0], current[1]
