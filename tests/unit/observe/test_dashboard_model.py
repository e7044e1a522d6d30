"""The live dashboard's document (marshal_workers.observe.dashboard_model): pure, driven by records and hand-set times."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.observe.dashboard_model import Dashboard, HandOverTracker, advance, pauses, rate
from marshal_workers.observe.status import status_document
from marshal_workers.protocol import codec
from marshal_workers.protocol.codec import Claim, Heartbeat, Record, Release, ReleaseGroup
from marshal_workers.protocol.world_state import WorldState

GROUP = "billing"
HB = 1_000  # ms
T0 = 1_700_000_000_000


def claim(partition: int, at: int, client: str = "a", instance: str = "i-a", topic: str = "orders") -> Claim:
    return Claim(v=1, ts=at, group=GROUP, client=client, instance=instance, topic=topic, partition=partition)


def beat(partition: int, at: int, offset: int, client: str = "a", instance: str = "i-a") -> Heartbeat:
    return Heartbeat(
        v=1, ts=at, group=GROUP, client=client, instance=instance, topic="orders", partition=partition, offset=offset
    )


def release(partition: int, at: int, offset: int, client: str = "a", instance: str = "i-a") -> Release:
    return Release(
        v=1, ts=at, group=GROUP, client=client, instance=instance, topic="orders", partition=partition, offset=offset
    )


def fold(state: WorldState, *records: Record) -> WorldState:
    for record in records:
        state.apply(record, record.ts)
    return state


def by_partition(dashboard: Dashboard) -> dict[int, dict]:
    assert dashboard.document is not None
    return {row["partition"]: row for row in dashboard.document["partitions"]}


def test_the_document_lists_every_partition_with_owner_lag_and_is_json() -> None:
    state = fold(WorldState(GROUP, HB), claim(0, T0), beat(0, T0 + 100, offset=40))
    dash = advance(
        Dashboard(),
        state,
        T0 + 200,
        high_watermarks={("orders", 0): 100, ("orders", 1): 7},
        topic_partitions={"orders": 3},
    )
    rows = by_partition(dash)
    assert sorted(rows) == [0, 1, 2]
    assert rows[0] | {"heartbeat_age_s": None} == rows[0] | {
        "state": "fresh",
        "owner": "a/i-a",
        "offset": 40,
        "lag": 60,
        "high_watermark": 100,
        "rate": None,
        "heartbeat_age_s": None,
    }
    assert rows[1]["state"] == "unclaimed" and rows[1]["owner"] is None and rows[1]["lag"] is None
    assert dash.document["members"] == [
        {"client": "a", "instance": "i-a", "partitions": 1, "heartbeat_age_s": 0.1, "drained": False}
    ]
    assert dash.document["totals"]["states"]["unclaimed"] == 2
    assert orjson.loads(orjson.dumps(dash.document)) == dash.document


def test_lag_is_never_negative_when_the_end_was_polled_before_the_offset_moved() -> None:
    state = fold(WorldState(GROUP, HB), claim(0, T0), beat(0, T0 + 100, offset=50))
    assert by_partition(advance(Dashboard(), state, T0 + 200, {("orders", 0): 45}))[0]["lag"] == 0


def test_rate_comes_from_the_offsets_of_two_heartbeats_and_stands_between_them() -> None:
    state = fold(WorldState(GROUP, HB), claim(0, T0), beat(0, T0 + 500, offset=100))
    first = advance(Dashboard(), state, T0 + 600)
    fold(state, beat(0, T0 + 1000, offset=300))
    second = advance(first, state, T0 + 1100)
    assert by_partition(second)[0]["rate"] == 400.0  # 200 messages in 500 ms of record time
    third = advance(second, state, T0 + 1300)  # no new heartbeat: the rate stands
    assert by_partition(third)[0]["rate"] == 400.0
    stale = advance(third, state, T0 + 1000 + 2 * HB + 1)
    assert by_partition(stale)[0]["rate"] is None, "no live owner: no rate"


def test_a_hand_over_names_both_owners_and_the_gap_without_a_live_owner() -> None:
    state = fold(WorldState(GROUP, HB), claim(0, T0), claim(1, T0))
    dash = advance(Dashboard(), state, T0 + 100)
    fold(state, release(0, T0 + 200, offset=5))
    dash = advance(dash, state, T0 + 300)
    assert dash.document["hand_overs"] == []
    fold(state, claim(0, T0 + 1_500, client="b", instance="i-b"))
    dash = advance(dash, state, T0 + 1_600)
    assert dash.document["hand_overs"] == [
        {
            "topic": "orders",
            "partition": 0,
            "from_owner": "a/i-a",
            "to_owner": "b/i-b",
            "at_ms": T0 + 1_600,
            "gap_ms": 1_300,
        },
    ]
    assert {m["instance"]: m["partitions"] for m in dash.document["members"]} == {"i-a": 1, "i-b": 1}


def test_the_first_observation_is_a_baseline_not_a_hand_over() -> None:
    tracker = HandOverTracker().observe({("t", 0): "b/2"}, T0)
    assert tracker.recent == ()
    assert tracker.observe({("t", 0): "b/2"}, T0 + 1).recent == ()


owners = st.sampled_from([None, "a/1", "b/2", "c/3"])
observations = st.lists(st.dictionaries(st.sampled_from([("t", 0), ("t", 1)]), owners), min_size=1, max_size=30)


@given(observations)
def test_hand_overs_come_only_when_the_live_owner_changes(seen: list[dict]) -> None:
    tracker = HandOverTracker()
    last: dict = {}
    for step, owners_now in enumerate(seen):
        before = len(tracker.recent)
        tracker = tracker.observe(owners_now, T0 + step * 1000)
        emitted = tracker.recent[: len(tracker.recent) - before] if len(tracker.recent) < 50 else None
        changed = {
            key
            for key, owner in owners_now.items()
            if step > 0 and owner is not None and last.get(key) not in (None, owner)
        }
        if emitted is not None:
            assert {(h.topic, h.partition) for h in emitted} == changed
            for h in emitted:
                assert h.from_owner != h.to_owner and h.gap_ms >= 0 and h.at_ms == T0 + step * 1000
        last |= {key: owner for key, owner in owners_now.items() if owner is not None}


@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5_000)), min_size=1, max_size=20),
    st.sampled_from(["fresh", "unknown", "stale", "released"]),
)
def test_rates_are_never_negative(steps: list[tuple[int, int]], liveness: str) -> None:
    previous = None
    at = T0
    for offset, advance_ms in steps:
        at += advance_ms
        found = rate(offset, at, liveness, previous)
        assert found is None or found >= 0
        previous = {"offset": offset, "offset_at_ms": at, "rate": found}


def test_the_group_pause_topic_pauses_and_drained_clients() -> None:
    state = fold(
        WorldState(GROUP, HB), ReleaseGroup(v=1, ts=T0, group=GROUP, client="op", instance="o", expires=T0 + 60_000)
    )
    status = status_document(state, T0 + 1)
    assert pauses(state, status) == {"group_paused_until": T0 + 60_000, "topics": {}, "drained": []}
    orders = [
        codec.PauseTopic(v=1, ts=T0 + 1, group=GROUP, client="op", instance="o", topic="orders", expires=T0 + 90_000),
        codec.Control(v=1, ts=T0 + 1, group=GROUP, client="op", instance="o", target="host-b", action="drain"),
    ]
    later = fold(state, *orders)
    assert pauses(later, status_document(later, T0 + 2)) == {
        "group_paused_until": T0 + 60_000,
        "topics": {"orders": T0 + 90_000},
        "drained": ["host-b"],
    }


def test_dead_letters_and_shared_leases_are_carried_as_given() -> None:
    rows = [{"error_type": "ValueError", "count": 3, "oldest_ms": 1, "newest_ms": 2, "from_topics": ["orders"]}]
    dash = advance(Dashboard(), WorldState(GROUP, HB), T0, dead_letters={"orders.dlq": rows}, dead_letters_at_ms=T0)
    assert dash.document["dead_letters"] == {"as_of_ms": T0, "topics": {"orders.dlq": rows}}
    assert dash.document["shared"] == [] and dash.document["partitions"] == []
