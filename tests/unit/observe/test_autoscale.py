"""The autoscaling signal (marshal_workers.observe.autoscale): pure, driven by folded records and hand-set times."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.observe.autoscale import (
    BadQuery,
    RateWindow,
    TopicLoad,
    answer,
    drain_target_of,
    positions,
    render_autoscale,
    wanted,
)
from marshal_workers.observe.dashboard_model import Dashboard, advance
from marshal_workers.protocol import codec
from marshal_workers.protocol.codec import Claim, Heartbeat
from marshal_workers.protocol.world_state import WorldState

GROUP = "billing"
HB = 1_000  # ms
T0 = 1_700_000_000_000


def claim(partition: int, at: int, client: str) -> Claim:
    return Claim(v=1, ts=at, group=GROUP, client=client, instance=f"i-{client}", topic="orders", partition=partition)


def beat(partition: int, at: int, offset: int, client: str) -> Heartbeat:
    return Heartbeat(
        v=1,
        ts=at,
        group=GROUP,
        client=client,
        instance=f"i-{client}",
        topic="orders",
        partition=partition,
        offset=offset,
    )


def document(state: WorldState, now: int, highs: dict[tuple[str, int], int], counts: dict[str, int]) -> dict:
    found = advance(Dashboard(), state, now, highs, counts).document
    assert found is not None
    return dict(found)


def test_whole_partitions_backlog_rate_and_members_come_from_the_log_and_the_ends() -> None:
    """Two members hold 4 partitions; over 10 s they handled 2,000 messages with 8,000 left: at 200/s, 100/s
    each, draining 8,000 within 20 s takes 4 members."""
    state = WorldState(GROUP, HB)
    for p in range(4):
        state.apply(claim(p, T0, "a" if p < 2 else "b"), T0)
        state.apply(beat(p, T0 + 100, 1_000, "a" if p < 2 else "b"), T0 + 100)
    ends = {("orders", p): 4_000 for p in range(4)}
    window = RateWindow(min_span_ms=HB).observe(T0 + 200, positions(document(state, T0 + 200, ends, {"orders": 4})))
    for p in range(4):
        state.apply(beat(p, T0 + 10_100, 1_500, "a" if p < 2 else "b"), T0 + 10_100)
    now = document(state, T0 + 10_200, ends, {"orders": 4})
    window = window.observe(T0 + 10_200, positions(now))

    found = answer(now, window, target_s=20.0, processes_per_member=3)

    entry = found["topics"]["orders"]
    assert (entry["mode"], entry["partitions"], entry["backlog"], entry["rate"]) == ("partitions", 4, 10_000, 200.0)
    assert (entry["members"], entry["processes"], entry["rate_per_process"]) == (2, 4, 50.0)
    assert entry["workers_wanted"] == 4  # 10,000 / (100/s a member * 20 s) = 5, capped by the 4 partitions
    assert "processes_wanted" not in entry, "a whole-partition topic's processes follow its partitions"
    assert (found["workers_wanted"], found["backlog"], found["drain_target_s"]) == (4, 10_000, 20.0)
    relaxed = answer(now, window, target_s=60.0, processes_per_member=3)["topics"]["orders"]
    assert relaxed["workers_wanted"] == 2  # 10,000 / (100/s * 60 s) = 1.7


def test_a_shared_topic_wants_processes_beyond_its_partitions() -> None:
    """One partition, one member with 4 processes: 400 handled in 2 s (50/s a process), 6,000 behind: within
    10 s that is 12 processes, 3 members of 4, more than the 1 partition."""
    state = WorldState(GROUP, HB)
    common = {"v": 1, "group": GROUP, "client": "host-a", "instance": "i-1"}
    state.apply(
        codec.ClaimRanges(
            **common,
            ts=T0,
            topic="thumbs",
            lease_ms=30_000,
            ranges=(
                codec.RangeEntry(partition=0, offset=0, end=400),
                codec.RangeEntry(partition=0, offset=400, end=800),
            ),
        ),
        T0,
    )
    first = document(state, T0 + 100, {("thumbs", 0): 6_400}, {"thumbs": 1})
    window = RateWindow(min_span_ms=HB).observe(T0 + 100, positions(first))
    state.apply(
        codec.AckRanges(
            **common, ts=T0 + 2000, topic="thumbs", ranges=(codec.AckEntry(partition=0, offset=0, end=400, high=6_400),)
        ),
        T0 + 2000,
    )
    now = document(state, T0 + 2100, {("thumbs", 0): 6_400}, {"thumbs": 1})
    window = window.observe(T0 + 2100, positions(now))

    entry = answer(now, window, target_s=10.0, processes_per_member=4)["topics"]["thumbs"]

    assert (entry["mode"], entry["partitions"], entry["backlog"], entry["rate"]) == ("shared", 1, 6_000, 200.0)
    assert (entry["members"], entry["processes"], entry["processes_per_member"]) == (1, 4, 4)
    assert (entry["processes_wanted"], entry["workers_wanted"]) == (12, 3)


def test_a_shared_partition_polled_ends_count_where_its_holders_have_not_looked() -> None:
    state = WorldState(GROUP, HB)
    common = {"v": 1, "group": GROUP, "client": "host-a", "instance": "i-1"}
    state.apply(
        codec.ClaimRanges(
            **common, ts=T0, topic="thumbs", lease_ms=30_000, ranges=(codec.RangeEntry(partition=0, offset=0, end=10),)
        ),
        T0,
    )
    state.apply(
        codec.AckRanges(
            **common, ts=T0 + 10, topic="thumbs", ranges=(codec.AckEntry(partition=0, offset=0, end=10, high=10),)
        ),
        T0 + 10,
    )
    polled = document(state, T0 + 20, {("thumbs", 0): 500}, {"thumbs": 1})
    unpolled = document(state, T0 + 20, {}, {})
    assert answer(polled, RateWindow(), 60.0, 1)["topics"]["thumbs"]["backlog"] == 490
    assert answer(unpolled, RateWindow(), 60.0, 1)["topics"]["thumbs"]["backlog"] == 0


def test_a_backlog_without_a_measured_rate_keeps_the_members_there_are_and_at_least_one() -> None:
    nobody = TopicLoad("orders", shared=False, partitions=8, backlog=1_000, members=0, processes=0)
    two = TopicLoad("orders", shared=False, partitions=8, backlog=1_000, members=2, processes=8)
    assert wanted(nobody, None, 60.0, 1).workers == 1, "somebody must start for a rate to be measured"
    assert wanted(two, None, 60.0, 1).workers == 2
    shared = TopicLoad("thumbs", shared=True, partitions=1, backlog=1_000, members=0, processes=0)
    assert (wanted(shared, None, 60.0, 4).workers, wanted(shared, None, 60.0, 4).processes) == (1, 4)


def test_a_rate_too_small_to_divide_by_counts_as_none() -> None:
    load = TopicLoad("thumbs", shared=True, partitions=1, backlog=10**9, members=2, processes=8)
    assert wanted(load, 5e-324, 0.001, 4) == wanted(load, None, 0.001, 4) == wanted(load, 0.0, 0.001, 4)


def test_a_position_that_went_back_counts_no_progress() -> None:
    window = RateWindow().observe(T0, {("t", 0): 500, ("t", 1): 0}).observe(T0 + 10_000, {("t", 0): 5, ("t", 1): 100})
    assert window.rates() == {"t": 10.0}, "partition 0 was set back: only partition 1's 100 messages count"


def test_a_partition_first_seen_later_is_measured_from_where_it_was_first_seen() -> None:
    window = RateWindow(min_span_ms=HB).observe(T0, {})  # the supervisor had claimed nothing yet
    window = window.observe(T0 + 2_000, {("t", 0): 100}).observe(T0 + 4_000, {("t", 0): 300, ("t", 1): 50})
    assert window.rates() == {"t": 100.0}, "partition 0 over 2 s; partition 1 seen once, not yet measured"
    assert window.observe(T0 + 6_000, {("t", 0): 500, ("t", 1): 250}).rates() == {"t": 200.0}


def test_the_rate_needs_a_span_of_a_heartbeat_and_the_window_keeps_its_length() -> None:
    window = RateWindow(window_ms=10_000, min_span_ms=HB).observe(T0, {("t", 0): 0})
    assert window.observe(T0 + 500, {("t", 0): 50}).rates() == {}, "closer than a sample gap: not even kept"
    window = window.observe(T0 + 1_000, {("t", 0): 100})
    assert window.rates() == {"t": 100.0}
    for second in range(2, 30):
        window = window.observe(T0 + second * 1_000, {("t", 0): 100 * second + (900 if second > 25 else 0)})
    assert window.samples[-1].at_ms - window.samples[0].at_ms == 10_000, "about a window long, no more"
    assert window.rates() == {"t": 190.0}, "a burst in the last seconds counts over the window"


@pytest.mark.parametrize(("query", "expected"), [("", 60.0), ("drain_target=30s", 30.0), ("drain_target=2m", 120.0)])
def test_the_drain_target_comes_from_the_query_or_the_setting(query: str, expected: float) -> None:
    assert drain_target_of(query, 60.0) == expected


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("drain_target=soon", "drain_target: expected a duration"),
        ("drain_target=0s", "at least 1ms"),
        ("topic=orders", "unknown query parameter 'topic'"),
        ("drain_target", "not a query string"),
    ],
)
def test_a_bad_query_is_refused_with_what_is_wrong(query: str, says: str) -> None:
    with pytest.raises(BadQuery, match=says):
        drain_target_of(query, 60.0)


def test_an_idle_group_wants_nobody_and_the_text_says_so() -> None:
    state = WorldState(GROUP, HB)
    state.apply(claim(0, T0, "a"), T0)
    state.apply(beat(0, T0 + 100, 70, "a"), T0 + 100)
    found = answer(document(state, T0 + 200, {("orders", 0): 70}, {"orders": 2}), RateWindow(), 60.0, 1)
    assert (found["backlog"], found["workers_wanted"]) == (0, 0)
    text = render_autoscale(found)
    assert text.splitlines()[0] == "group billing: 0 members wanted to drain 0 messages within 60s"
    assert text.splitlines()[2].split() == ["orders", "partitions", "2", "0", "-", "1", "1", "0", "-"]


# ----------------------------------------------------------------- properties

loads = st.builds(
    TopicLoad,
    topic=st.just("t"),
    shared=st.booleans(),
    partitions=st.integers(1, 64),
    backlog=st.integers(0, 10**9),
    members=st.integers(0, 50),
    processes=st.integers(0, 400),
)
rates = st.one_of(st.none(), st.floats(0.0, 1e6, allow_nan=False))
targets = st.floats(0.001, 86_400.0, allow_nan=False)
per_member = st.integers(1, 64)


@given(loads, rates, targets, per_member)
def test_a_backlog_with_a_rate_wants_at_least_one_and_none_without_a_backlog(load, rate, target, ppm) -> None:
    found = wanted(load, rate, target, ppm)
    if load.backlog == 0:
        assert found.workers == 0 and found.processes in (0, None)
    else:
        assert found.workers >= 1
        if load.shared:
            assert found.processes is not None and found.processes >= 1
            assert found.workers == -(-found.processes // ppm), "as many members as the processes need"


@given(loads, rates, targets, per_member)
def test_a_whole_partition_topic_never_wants_more_members_than_partitions(load, rate, target, ppm) -> None:
    if not load.shared:
        assert wanted(load, rate, target, ppm).workers <= load.partitions


@given(loads, rates, targets, per_member, st.integers(0, 10**9))
def test_more_backlog_never_wants_fewer(load, rate, target, ppm, more) -> None:
    bigger = TopicLoad(load.topic, load.shared, load.partitions, load.backlog + more, load.members, load.processes)
    assert wanted(bigger, rate, target, ppm).workers >= wanted(load, rate, target, ppm).workers


@given(st.integers(1, 64), st.integers(1, 8), st.floats(1.0, 1e4), targets)
def test_a_shared_topic_is_not_capped_by_its_partitions(partitions, ppm, per_process, target) -> None:
    """A backlog of more than the partitions' processes can drain in the target time wants more processes."""
    backlog = int(per_process * target * (partitions + 1) * 2) + 1
    big = TopicLoad("t", True, partitions, backlog, 1, ppm)
    found = wanted(big, per_process * ppm, target, ppm)
    assert found.processes is not None and found.processes > partitions
