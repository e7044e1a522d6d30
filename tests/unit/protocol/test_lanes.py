"""Concurrency inside a worker: the pure bookkeeping of one partition (marshal_workers.protocol.lanes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol import done_set
from marshal_workers.protocol.lanes import LaneError, Lanes, Ordering, Stage


def start_all(lanes: Lanes, now: float = 0) -> list[int]:
    """Start whatever may start, lowest first; return the offsets started."""
    started = []
    while (offset := lanes.next_runnable(now)) is not None:
        lanes.start(offset)
        started.append(offset)
    return started


def offer_all(lanes: Lanes, messages: list[tuple[int, bytes | None]]) -> None:
    for offset, key in messages:
        assert lanes.offer(offset, key)


# ----------------------------------------------------------------- ordering


def test_key_ordering_runs_one_message_per_key_and_keyless_ones_freely() -> None:
    lanes = Lanes(start=0, concurrency=10, window=100)
    offer_all(lanes, [(0, b"a"), (1, b"a"), (2, b"b"), (3, None), (4, None), (5, b"b")])
    assert start_all(lanes) == [0, 2, 3, 4]
    assert [lanes.stage(o) for o in (1, 5)] == [Stage.WAITING, Stage.WAITING]
    lanes.finish(2)
    assert start_all(lanes) == [5]  # b's next
    lanes.finish(0)
    assert start_all(lanes) == [1]


def test_none_ordering_ignores_keys() -> None:
    lanes = Lanes(start=0, concurrency=3, window=100, ordering="none")
    offer_all(lanes, [(0, b"a"), (1, b"a"), (2, b"a"), (3, b"a")])
    assert start_all(lanes) == [0, 1, 2]
    assert lanes.in_flight == 3 and lanes.next_runnable(0) is None  # all slots busy


def test_partition_ordering_is_one_at_a_time_in_offset_order() -> None:
    lanes = Lanes(start=0, concurrency=8, window=100, ordering=Ordering.PARTITION)
    offer_all(lanes, [(0, b"a"), (1, None), (2, b"b")])
    for offset in (0, 1, 2):
        assert start_all(lanes) == [offset]
        lanes.finish(offset)
    assert lanes.progress() == 3


def test_the_lowest_ready_offset_starts_first() -> None:
    lanes = Lanes(start=0, concurrency=1, window=100)
    offer_all(lanes, [(0, b"a"), (1, b"a"), (2, b"b")])
    assert start_all(lanes) == [0]
    lanes.finish(0)
    assert lanes.next_runnable(0) == 1  # a's next before b, though b was ready earlier


# ------------------------------------------------------------------ retries


def test_a_deferred_message_frees_its_slot_holds_its_key_and_comes_back_when_due() -> None:
    lanes = Lanes(start=0, concurrency=1, window=100)
    offer_all(lanes, [(0, b"a"), (1, b"a"), (2, b"b")])
    assert start_all(lanes, now=0) == [0]
    lanes.defer(0, until=50)
    assert lanes.next_due() == 50 and lanes.stage(0) is Stage.DEFERRED
    assert start_all(lanes, now=10) == [2]  # another key runs during the backoff; a's next waits
    lanes.finish(2)
    assert lanes.next_runnable(49) is None
    assert start_all(lanes, now=50) == [0]
    assert lanes.attempts(0) == 2
    lanes.finish(0)
    assert start_all(lanes, now=50) == [1]
    assert lanes.next_due() is None


# ------------------------------------------------------ progress and window


def test_progress_is_the_lowest_offset_not_done_and_the_rest_travels_as_done_runs() -> None:
    lanes = Lanes(start=10, concurrency=10, window=100, ordering="none")
    offer_all(lanes, [(o, None) for o in range(10, 16)])
    start_all(lanes)
    for offset in (11, 12, 14):
        lanes.finish(offset)
    assert lanes.progress() == 10
    assert lanes.done_above() == [2, 1, 1]  # 11-12 done, 13 not, 14 done; 15 runs
    assert done_set.decode(10, lanes.done_above()) == [(11, 13), (14, 15)]
    lanes.finish(10)
    assert (lanes.progress(), lanes.done_above()) == (13, [1])


def test_offsets_kafka_never_delivered_count_as_done() -> None:
    lanes = Lanes(start=0, concurrency=2, window=100)
    offer_all(lanes, [(3, b"a"), (7, b"b")])  # 0-2 and 4-6 compacted away
    assert lanes.progress() == 3
    start_all(lanes)
    lanes.finish(7)
    assert (lanes.progress(), lanes.done_above()) == (3, [4])  # 4-7 above 3
    lanes.finish(3)
    assert (lanes.progress(), lanes.done_above()) == (8, [])


def test_skipped_offsets_count_as_done_and_hold_nothing() -> None:
    lanes = Lanes(start=100, concurrency=2, window=10)
    assert lanes.offer(100, b"a") and lanes.skip(101) and lanes.skip(102) and lanes.offer(103, b"a")
    assert lanes.unfinished == 2 and lanes.done_above() == [2]
    assert not lanes.skip(110)  # outside the window, like an offer


def test_a_stuck_message_holds_the_window_and_then_lets_it_go() -> None:
    lanes = Lanes(start=0, concurrency=4, window=5, ordering="none")
    offer_all(lanes, [(o, None) for o in range(5)])
    start_all(lanes)
    for offset in (1, 2, 3):
        lanes.finish(offset)
    assert lanes.window_used == 5 and not lanes.offer(5, None)  # 0 is stuck
    assert lanes.progress() == 0
    lanes.finish(0)
    assert lanes.window_used == 1 and lanes.offer(5, None) and lanes.offer(8, None)


def test_with_nothing_unfinished_any_later_offset_is_taken() -> None:
    lanes = Lanes(start=0, concurrency=1, window=3)
    assert lanes.offer(1_000_000, None)  # a long compacted stretch cannot wedge the window
    assert lanes.progress() == 1_000_000 and lanes.window_used == 1


def test_a_full_window_of_the_worst_pattern_fits_a_heartbeat() -> None:
    window = done_set.MAX_RUNS
    lanes = Lanes(start=0, concurrency=window, window=window, ordering="none")
    offer_all(lanes, [(o, None) for o in range(window)])
    start_all(lanes)
    for offset in range(1, window, 2):
        lanes.finish(offset)
    runs = lanes.done_above()
    assert len(runs) == window - 1 and done_set.parse(0, runs) == tuple(runs)


def test_endless_retries_of_a_message_started_out_of_turn_do_not_grow_the_bookkeeping() -> None:
    """Starting any ready message, not only the lowest, leaves stale entries behind: they are compacted."""
    lanes = Lanes(start=0, concurrency=2, window=4, ordering="none")
    offer_all(lanes, [(0, None), (1, None)])  # 0 stays ready and is never started
    for attempt in range(1, 1001):
        assert lanes.next_runnable(attempt) == 0
        lanes.start(1)
        lanes.defer(1, until=attempt)
        assert lanes.footprint <= 7 * lanes.window + 16
    assert lanes.attempts(1) == 1000 and lanes.progress() == 0


# ------------------------------------------------------------------- guards


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start": -1},
        {"concurrency": 0},
        {"window": 0},
        {"window": done_set.MAX_RUNS + 1},
    ],
)
def test_settings_are_checked(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Lanes(**{"start": 0, "concurrency": 1, "window": 10, **kwargs})
    with pytest.raises(ValueError):
        Lanes(0, 1, 10, ordering="random")


def test_illegal_transitions_are_loud() -> None:
    lanes = Lanes(start=0, concurrency=1, window=10)
    offer_all(lanes, [(0, b"a"), (1, b"a"), (2, b"b")])
    with pytest.raises(LaneError, match="waiting"):
        lanes.start(1)  # behind 0, same key
    with pytest.raises(LaneError, match="not running"):
        lanes.finish(0)
    lanes.start(0)
    with pytest.raises(LaneError, match="slots are busy"):
        lanes.start(2)
    with pytest.raises(LaneError, match="not ready"):
        lanes.start(0)
    lanes.finish(0)
    with pytest.raises(LaneError, match="done or never offered"):
        lanes.finish(0)
    with pytest.raises(LaneError, match="out of order"):
        lanes.offer(2, b"c")


# --------------------------------------------------------------- properties

KEYS = [None, b"", b"a", b"b", b"c"]
PROPERTY = settings(
    max_examples=examples(200), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass
class Model:
    """What the rules say, written the plain way."""

    ordering: Ordering
    concurrency: int
    window: int
    next_fetch: int
    lanes: dict[int, object] = field(default_factory=dict)  # unfinished offset -> its lane (None: no lane)
    running: set[int] = field(default_factory=set)
    deferred: dict[int, float] = field(default_factory=dict)  # offset -> until
    first_starts: dict[object, list[int]] = field(default_factory=dict)  # lane -> offsets in first-start order

    def lane_of(self, key: bytes | None) -> object:
        if self.ordering is Ordering.KEY:
            return key
        return "partition" if self.ordering is Ordering.PARTITION else None

    def admits(self, offset: int) -> bool:
        return not self.lanes or offset - min(self.lanes) < self.window

    def eligible(self, now: float) -> list[int]:
        if len(self.running) >= self.concurrency:
            return []
        return sorted(
            o
            for o, lane in self.lanes.items()
            if o not in self.running
            and self.deferred.get(o, now) <= now
            and (lane is None or not any(p < o and q == lane for p, q in self.lanes.items()))
        )

    def progress(self) -> int:
        return min(self.lanes, default=self.next_fetch)

    def done_above(self) -> set[int]:
        return {x for x in range(self.progress() + 1, self.next_fetch) if x not in self.lanes}


@PROPERTY
@given(
    st.sampled_from(list(Ordering)),
    st.integers(1, 4),
    st.integers(1, 12),
    st.integers(0, 2**40),
    st.data(),
)
def test_any_schedule_keeps_the_rules(
    ordering: Ordering, concurrency: int, window: int, begin: int, data: st.DataObject
) -> None:
    lanes = Lanes(begin, concurrency, window, ordering)
    model = Model(ordering, concurrency, window, next_fetch=begin)
    now = 0.0
    held: tuple[int, bytes | None, bool] | None = None  # a fetched message the window refused
    ever_started: set[int] = set()

    def fetch() -> None:
        nonlocal held
        if held is None:
            gap = data.draw(st.sampled_from([0, 0, 0, 1, 4]))
            skip = data.draw(st.sampled_from([False] * 4 + [True]))  # a previous owner did it
            held = (model.next_fetch + gap, data.draw(st.sampled_from(KEYS)), skip)
        offset, key, skip = held
        admitted = model.admits(offset)
        assert (lanes.skip(offset) if skip else lanes.offer(offset, key)) == admitted
        if admitted:
            held = None
            model.next_fetch = offset + 1
            if not skip:
                model.lanes[offset] = model.lane_of(key)

    def start(offset: int) -> None:
        lanes.start(offset)
        model.running.add(offset)
        model.deferred.pop(offset, None)
        if offset not in ever_started:
            ever_started.add(offset)
            model.first_starts.setdefault(model.lanes[offset], []).append(offset)

    for _ in range(data.draw(st.integers(1, 150))):
        action = data.draw(st.sampled_from(["fetch"] * 3 + ["next"] * 2 + ["any", "finish", "finish", "defer", "tick"]))
        if action == "fetch":
            fetch()
        elif action == "next":
            offset = lanes.next_runnable(now)
            eligible = model.eligible(now)
            assert offset == (eligible[0] if eligible else None)
            if offset is not None:
                start(offset)
        elif action == "any" and model.eligible(now):
            # Wake the deferred that are due, then start any eligible message, not only the lowest.
            lanes.next_runnable(now)
            start(data.draw(st.sampled_from(model.eligible(now))))
        elif action in ("finish", "defer") and model.running:
            offset = data.draw(st.sampled_from(sorted(model.running)))
            model.running.discard(offset)
            if action == "finish":
                lanes.finish(offset)
                del model.lanes[offset]
            else:
                until = now + data.draw(st.integers(0, 5))
                lanes.defer(offset, until)
                model.deferred[offset] = until
        elif action == "tick":
            now += data.draw(st.integers(1, 5))
        check(lanes, model)

    # Every message can still finish: nothing is wedged, and then nothing is held.
    while model.lanes:
        now = max([now, *model.deferred.values()])
        while (offset := lanes.next_runnable(now)) is not None:
            start(offset)
        assert model.running, "unfinished messages but none may start"
        for offset in sorted(model.running, reverse=True):
            lanes.finish(offset)
            del model.lanes[offset]
        model.running.clear()
        check(lanes, model)
    assert lanes.next_runnable(now) is None and lanes.footprint == 0
    assert lanes.progress() == model.next_fetch


def check(lanes: Lanes, model: Model) -> None:
    # Progress never passes an unfinished offset, and the done set is exactly what is done above it.
    assert lanes.progress() == model.progress()
    assert all(lanes.progress() <= o for o in model.lanes)
    assert (
        done_set.Skipper.from_runs(lanes.progress(), lanes.done_above()).ranges()
        == done_set.Skipper((x, x + 1) for x in model.done_above()).ranges()
    )
    # Slots, keys, order.
    assert lanes.in_flight == len(model.running) <= model.concurrency
    running_lanes = [model.lanes[o] for o in model.running if model.lanes[o] is not None]
    assert len(running_lanes) == len(set(running_lanes))  # never two of one key ("key") or two at all ("partition")
    for lane, offsets in model.first_starts.items():
        assert lane is None or offsets == sorted(offsets)  # keyless messages are not ordered
    # The window and memory.
    assert lanes.window_used == (model.next_fetch - min(model.lanes) if model.lanes else 0) <= model.window
    assert lanes.unfinished == len(model.lanes)
    assert lanes.footprint <= 7 * model.window + 16
    for offset in model.lanes:
        if offset in model.running:
            assert lanes.stage(offset) is Stage.RUNNING
        elif offset in model.deferred:
            assert lanes.stage(offset) in (Stage.DEFERRED, Stage.READY)  # READY once woken at its time
        else:
            assert lanes.stage(offset) in (Stage.WAITING, Stage.READY)


@settings(max_examples=examples(50), deadline=None, database=None)
@given(st.lists(st.sampled_from([b"hot"] * 8 + [b"x", b"y", None]), min_size=500, max_size=2000))
def test_memory_stays_within_the_window_whatever_the_keys(keys: list[bytes | None]) -> None:
    """One stuck message and a flood of keys, hot or not: offers stop at the window, memory with them."""
    window = 64
    lanes = Lanes(start=0, concurrency=8, window=window)
    offset = 0
    stuck: int | None = None
    for key in keys:
        if lanes.offer(offset, key):
            offset += 1
        for started in start_all(lanes):
            if stuck is None:
                stuck = started  # never finishes
            else:
                lanes.finish(started)
        assert lanes.footprint <= 7 * window + 16 and lanes.window_used <= window
    assert stuck == 0 and lanes.progress() == 0 and offset <= window
