"""Hypothesis strategies for the fold's dataclasses, with every field drawn: values as the fold keeps them.

Each strategy makes its class with :func:`built`, which needs a value for every field: a new field is drawn
(and so round-tripped and copied by the tests that use these) or fails them, by name.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from hypothesis import strategies as st

from marshal_workers.protocol import done_set
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import Lease, SharedPartition, Tries
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import Controls, PartitionState, Pause

T = TypeVar("T")
GROUP = "g"
HB = 1000
INT64 = 2**63 - 1

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
times = st.integers(0, INT64)
offsets = st.integers(0, 10**12)
# A heartbeat's optional report as the fold keeps it (codec.reported_number): a number >= 0 within int64, or none.
reports = st.none() | st.integers(0, INT64) | st.floats(0, 1e15, allow_nan=False, allow_infinity=False)


def built(cls: type[T], drawn: dict[str, Any]) -> T:
    """A ``cls`` of the ``drawn`` fields, which must be all of them."""
    missing = sorted({found.name for found in fields(cls)} - set(drawn))  # type: ignore[arg-type]
    assert not missing, f"fold_values.py draws no value for {cls.__name__}.{', '.join(missing)}"
    return cls(**drawn)


@st.composite
def done_runs(draw: st.DrawFn, offset: int) -> tuple[int, ...] | None:
    """A done set above ``offset`` as the fold keeps it (canonical runs, none if empty)."""
    above = draw(st.lists(st.integers(offset + 1, offset + 200), max_size=12))
    return tuple(done_set.encode(offset, above)) or None


@st.composite
def partition_states(draw: st.DrawFn) -> PartitionState:
    owner = draw(st.none() | st.builds(MemberId, names, names))
    offset = draw(st.none() | offsets)
    drawn: dict[str, Any] = {
        "owner": owner,
        "last_ts": draw(times),
        "offset": offset,
        "amo_offset": draw(st.none() | offsets),
        "done": None if offset is None else draw(done_runs(offset)),  # a done set lies above the offset
        "lag": draw(reports),
        "rate": draw(reports),
        "in_flight": draw(reports),
        "window_used": draw(reports),
        "call_age_s": draw(reports),
        "release_requested": owner is not None and draw(st.booleans()),  # a request is to an owner
    }
    return built(PartitionState, drawn)


@st.composite
def runs_apart(draw: st.DrawFn, low: int, count: int) -> list[tuple[int, int]]:
    """``count`` sorted runs of offsets above ``low``, with a gap before each."""
    runs, at = [], low
    for _ in range(count):
        start = at + draw(st.integers(1, 20))
        at = start + draw(st.integers(1, 30))
        runs.append((start, at))
    return runs


@st.composite
def leases(draw: st.DrawFn, start: int, end: int) -> Lease:
    offsets_in = st.integers(start, end - 1)
    progress = draw(runs_apart(start - 1, draw(st.integers(0, 3))))
    progress = [(a, b) for a, b in progress if b <= end]  # inside the lease
    progress_offsets = [offset for a, b in progress for offset in range(a, b)]
    drawn: dict[str, Any] = {
        "start": start,
        "end": end,
        "holder": draw(st.builds(MemberId, names, names)),
        "expires": draw(times),
        "amo": draw(st.booleans()),
        "claimed_at": draw(times),
        "handed": draw(st.dictionaries(offsets_in, st.tuples(times, st.integers(0, 100)), max_size=4)),
        "acked": draw(st.sets(offsets_in, max_size=4)),
        "progress": progress,
        "dead": draw(st.sets(st.sampled_from(progress_offsets), max_size=3)) if progress_offsets else set(),
    }
    return built(Lease, drawn)


@st.composite
def shared_partitions(draw: st.DrawFn) -> SharedPartition:
    low = draw(st.none() | st.integers(0, 10**9))
    done: list[tuple[int, int]] = []
    held: dict[int, Lease] = {}
    if low is not None:  # done ranges and leases above low, apart; which run is which is drawn
        for start, end in draw(runs_apart(low, draw(st.integers(0, 6)))):
            if draw(st.booleans()):
                done.append((start, end))
            else:
                held[start] = draw(leases(start, end))
    tried = draw(runs_apart(draw(st.integers(0, 10**9)), draw(st.integers(0, 3))))
    drawn: dict[str, Any] = {
        "low": low,
        "done": done,
        "leases": held,
        "tries": [Tries(start, end, draw(st.integers(1, 50))) for start, end in tried],
        "acked": draw(times),
        "dead_letters": draw(times),
        "lost": draw(times),
        "lapsed": draw(times),
        "high": draw(times),
    }
    return built(SharedPartition, drawn)


pauses = st.builds(lambda until, client: built(Pause, {"until": until, "client": client}), times, names)
# A Controls with no order is no order: the fold and a checkpoint keep none (checkpoints.seed).
orders = st.dictionaries(names, times, max_size=3)
controls = st.builds(
    lambda drained, shutdowns: built(Controls, {"drained": drained, "shutdowns": shutdowns}), orders, orders
).filter(lambda found: bool(found.drained or found.shutdowns))
keys = st.tuples(st.sampled_from(["orders", "payments", "audit"]), st.integers(0, 5))


@st.composite
def world_states(draw: st.DrawFn) -> WorldState:
    """What a checkpoint of coordination partition 0 carries, drawn: positions, shared partitions, the pause, the
    orders, the topic pauses and the directory."""
    state = WorldState(GROUP, HB)
    state.partitions.update(draw(st.dictionaries(keys, partition_states(), max_size=6)))
    state.shared.update(draw(st.dictionaries(keys, shared_partitions(), max_size=3)))
    pause = draw(st.none() | pauses)
    if pause is not None:
        state.pauses[0] = pause
    given_orders = draw(st.none() | controls)
    if given_orders is not None:
        state.controls[0] = given_orders
    state.topic_pauses.update(draw(st.dictionaries(names, times, max_size=3)))
    directory = draw(st.none() | st.frozensets(names, max_size=4))
    if directory is not None:
        state.set_directory(0, directory)
    return state
