"""The ``status`` report (docs/protocol.md, docs/operations.md), from world states built by folding records."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from marshal_workers.observe.status import render_table, status_document
from marshal_workers.protocol import codec
from marshal_workers.protocol.codec import Claim, ClaimMessages, Heartbeat, Record, Release, ReleaseGroup
from marshal_workers.protocol.world_state import WorldState

GROUP = "billing"
HB = 5_000  # ms
T0 = 1_700_000_000_000  # ms since epoch

DOCUMENT_KEYS = {"group", "paused_until", "partitions"}
ROW_KEYS = {
    "topic",
    "partition",
    "state",
    "client",
    "instance",
    "offset",
    "heartbeat_age_s",
    "lag",
    "rate",
    "in_flight",
    "call_age_s",
    "window_used",
}
STATES = {"fresh", "unknown", "stale", "released", "unclaimed"}


def claim(topic: str, partition: int, at: int, client: str = "host-a", instance: str = "i-1") -> Claim:
    return Claim(v=1, ts=at, group=GROUP, client=client, instance=instance, topic=topic, partition=partition)


def heartbeat(
    topic: str, partition: int, at: int, offset: int, client: str = "host-a", instance: str = "i-1"
) -> Heartbeat:
    return Heartbeat(
        v=1, ts=at, group=GROUP, client=client, instance=instance, topic=topic, partition=partition, offset=offset
    )


def release(topic: str, partition: int, at: int, offset: int, client: str = "host-a", instance: str = "i-1") -> Release:
    return Release(
        v=1, ts=at, group=GROUP, client=client, instance=instance, topic=topic, partition=partition, offset=offset
    )


def claim_messages(
    topic: str, partition: int, at: int, offset: int, client: str = "host-a", instance: str = "i-1"
) -> ClaimMessages:
    return ClaimMessages(
        v=1, ts=at, group=GROUP, client=client, instance=instance, topic=topic, partition=partition, offset=offset
    )


def release_group(at: int, expires: int, client: str = "operator") -> ReleaseGroup:
    return ReleaseGroup(v=1, ts=at, group=GROUP, client=client, instance="op-1", expires=expires)


def world(*records: Record) -> WorldState:
    state = WorldState(group=GROUP, heartbeat_ms=HB)
    for record in records:
        state.apply(record, record.ts)
    return state


def rows_by_key(document: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(row["topic"], row["partition"]): row for row in document["partitions"]}


def only_row(document: dict[str, Any]) -> dict[str, Any]:
    assert len(document["partitions"]) == 1
    return document["partitions"][0]


# ----------------------------------------------------------- document shape


def test_document_has_exactly_the_keys_of_design_section_9() -> None:
    state = world(
        claim("orders", 0, T0),
        heartbeat("orders", 0, T0 + 1000, offset=10),
        claim("orders", 1, T0),
        release("orders", 1, T0 + 500, offset=3),
    )
    document = status_document(state, T0 + 2000, "orders", topic_partitions=3)
    assert set(document) == DOCUMENT_KEYS
    assert document["group"] == GROUP
    assert len(document["partitions"]) == 3
    for row in document["partitions"]:
        assert set(row) == ROW_KEYS
        assert row["state"] in STATES
    # The CLI prints it with orjson: the document must serialize as plain JSON.
    assert orjson.loads(orjson.dumps(document)) == document


def test_empty_state() -> None:
    document = status_document(world(), T0)
    assert document == {"group": GROUP, "paused_until": None, "partitions": []}


def test_owned_partition_row() -> None:
    state = world(
        claim("orders", 2, T0, client="host-b", instance="i-9"),
        heartbeat("orders", 2, T0 + 1000, 77, client="host-b", instance="i-9"),
    )
    row = only_row(status_document(state, T0 + 2500))
    assert row == {
        "topic": "orders",
        "partition": 2,
        "state": "fresh",
        "client": "host-b",
        "instance": "i-9",
        "offset": 77,
        "heartbeat_age_s": 1.5,
        "lag": None,
        "rate": None,
        "in_flight": None,
        "call_age_s": None,
        "window_used": None,
    }


# -------------------------------------------------------------- liveness


@pytest.mark.parametrize(
    ("age_ms", "expected"),
    [
        (0, "fresh"),
        (HB - 1, "fresh"),
        (HB, "unknown"),
        (HB + 1, "unknown"),
        (2 * HB, "unknown"),
        (2 * HB + 1, "stale"),
        (10 * HB, "stale"),
    ],
)
def test_state_by_heartbeat_age(age_ms: int, expected: str) -> None:
    state = world(claim("orders", 0, T0), heartbeat("orders", 0, T0 + 3000, offset=5))
    row = only_row(status_document(state, T0 + 3000 + age_ms))
    assert row["state"] == expected
    assert row["client"] == "host-a"
    assert row["instance"] == "i-1"
    assert row["heartbeat_age_s"] == pytest.approx(age_ms / 1000)


def test_age_counts_from_the_last_heartbeat_not_the_claim() -> None:
    state = world(claim("orders", 0, T0), heartbeat("orders", 0, T0 + 4 * HB, offset=5))
    row = only_row(status_document(state, T0 + 4 * HB + 100))
    assert row["state"] == "fresh"
    assert row["heartbeat_age_s"] == pytest.approx(0.1)


def test_heartbeat_from_a_non_owner_does_not_refresh_the_partition() -> None:
    state = world(claim("orders", 0, T0), heartbeat("orders", 0, T0 + 3 * HB, offset=99, client="zombie", instance="z"))
    row = only_row(status_document(state, T0 + 3 * HB))
    assert row["state"] == "stale"
    assert row["client"] == "host-a"
    assert row["offset"] is None


@pytest.mark.parametrize(
    ("age_ms", "seconds"),
    [(0, 0.0), (1, 0.001), (1500, 1.5), (12_345, 12.345), (3_600_000, 3600.0)],
)
def test_heartbeat_age_is_in_seconds(age_ms: int, seconds: float) -> None:
    state = world(claim("orders", 0, T0))
    assert only_row(status_document(state, T0 + age_ms))["heartbeat_age_s"] == pytest.approx(seconds)


# -------------------------------------------------------------- released


def test_released_partition() -> None:
    state = world(claim("orders", 0, T0), heartbeat("orders", 0, T0 + 1000, 10), release("orders", 0, T0 + 2000, 12))
    row = only_row(status_document(state, T0 + 2500))
    assert row == {
        "topic": "orders",
        "partition": 0,
        "state": "released",
        "client": None,
        "instance": None,
        "offset": 12,
        "heartbeat_age_s": None,
        "lag": None,
        "rate": None,
        "in_flight": None,
        "call_age_s": None,
        "window_used": None,
    }


def test_release_group_drops_owners_but_keeps_offsets() -> None:
    state = world(
        claim("orders", 0, T0),
        heartbeat("orders", 0, T0 + 1000, 40),
        release_group(T0 + 2000, expires=T0 + 60_000),
    )
    row = only_row(status_document(state, T0 + 3000))
    assert row["state"] == "released"
    assert row["client"] is None
    assert row["offset"] == 40


# ------------------------------------------------------------ unclaimed


def test_unclaimed_partitions_are_listed_with_topic_and_partition_count() -> None:
    state = world(claim("orders", 1, T0), heartbeat("orders", 1, T0, 5))
    document = status_document(state, T0 + 100, "orders", topic_partitions=4)
    rows = rows_by_key(document)
    assert list(rows) == [("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3)]
    assert rows[("orders", 1)]["state"] == "fresh"
    for p in (0, 2, 3):
        assert rows[("orders", p)] == {
            "topic": "orders",
            "partition": p,
            "state": "unclaimed",
            "client": None,
            "instance": None,
            "offset": None,
            "heartbeat_age_s": None,
            "lag": None,
            "rate": None,
            "in_flight": None,
            "call_age_s": None,
            "window_used": None,
        }


def test_no_unclaimed_partitions_without_partition_count() -> None:
    state = world(claim("orders", 1, T0))
    document = status_document(state, T0, "orders")
    assert [row["partition"] for row in document["partitions"]] == [1]


def test_no_unclaimed_partitions_without_topic() -> None:
    state = world(claim("orders", 1, T0))
    document = status_document(state, T0, topic=None, topic_partitions=4)
    assert [(row["topic"], row["partition"]) for row in document["partitions"]] == [("orders", 1)]


def test_unclaimed_rows_for_a_topic_the_log_never_mentions() -> None:
    state = world(claim("orders", 0, T0))
    document = status_document(state, T0, "refunds", topic_partitions=2)
    assert [(r["topic"], r["partition"], r["state"]) for r in document["partitions"]] == [
        ("refunds", 0, "unclaimed"),
        ("refunds", 1, "unclaimed"),
    ]


# ------------------------------------------------------------- filtering


def test_filter_by_topic() -> None:
    state = world(claim("orders", 0, T0), claim("payments", 0, T0), claim("payments", 1, T0), claim("orders-eu", 0, T0))
    everything = status_document(state, T0)
    assert {(r["topic"], r["partition"]) for r in everything["partitions"]} == {
        ("orders", 0),
        ("payments", 0),
        ("payments", 1),
        ("orders-eu", 0),
    }
    only_payments = status_document(state, T0, "payments")
    assert [(r["topic"], r["partition"]) for r in only_payments["partitions"]] == [("payments", 0), ("payments", 1)]


def test_rows_are_ordered_by_topic_then_partition_number() -> None:
    state = world(*(claim(t, p, T0) for t, p in [("b", 10), ("a", 2), ("b", 2), ("a", 10), ("b", 1)]))
    document = status_document(state, T0)
    assert [(r["topic"], r["partition"]) for r in document["partitions"]] == [
        ("a", 2),
        ("a", 10),
        ("b", 1),
        ("b", 2),
        ("b", 10),
    ]


def test_other_groups_are_not_shown() -> None:
    state = world(claim("orders", 0, T0))
    state.apply(Claim(v=1, ts=T0, group="other", client="x", instance="y", topic="orders", partition=1), T0)
    assert [r["partition"] for r in status_document(state, T0)["partitions"]] == [0]


# ---------------------------------------------------------------- offset


def test_offset_is_none_before_any_heartbeat() -> None:
    assert only_row(status_document(world(claim("orders", 0, T0)), T0))["offset"] is None


def test_offset_is_amo_claim_when_ahead_of_heartbeat() -> None:
    state = world(
        claim("orders", 0, T0),
        heartbeat("orders", 0, T0 + 1000, offset=10),
        claim_messages("orders", 0, T0 + 2000, offset=25),
    )
    assert only_row(status_document(state, T0 + 2000))["offset"] == 25


def test_offset_is_heartbeat_when_ahead_of_amo_claim() -> None:
    state = world(
        claim("orders", 0, T0),
        claim_messages("orders", 0, T0 + 1000, offset=25),
        heartbeat("orders", 0, T0 + 2000, offset=30),
    )
    assert only_row(status_document(state, T0 + 2000))["offset"] == 30


def test_offset_is_amo_claim_without_heartbeat() -> None:
    state = world(claim("orders", 0, T0), claim_messages("orders", 0, T0 + 1000, offset=8))
    assert only_row(status_document(state, T0 + 1000))["offset"] == 8


def test_offset_after_release_with_earlier_amo_claim_is_the_resume_point() -> None:
    state = world(
        claim("orders", 0, T0),
        claim_messages("orders", 0, T0 + 1000, offset=50),
        release("orders", 0, T0 + 2000, offset=40),
    )
    row = only_row(status_document(state, T0 + 3000))
    assert row["state"] == "released"
    assert row["offset"] == 50  # messages below 50 were claimed at most once: never again


# ---------------------------------------------------------------- pauses


def test_paused_until_when_pause_is_in_the_future() -> None:
    state = world(release_group(T0, expires=T0 + 60_000))
    assert status_document(state, T0 + 1000)["paused_until"] == T0 + 60_000


@pytest.mark.parametrize("now", [T0 + 60_000, T0 + 60_001, T0 + 10**9])
def test_paused_until_is_null_once_the_pause_expired(now: int) -> None:
    state = world(release_group(T0, expires=T0 + 60_000))
    assert status_document(state, now)["paused_until"] is None


def test_paused_until_is_null_without_pause() -> None:
    assert status_document(world(claim("orders", 0, T0)), T0)["paused_until"] is None


# ----------------------------------------------------------------- table


def test_table_header_names_the_group() -> None:
    text = render_table(status_document(world(claim("orders", 0, T0)), T0), T0)
    assert GROUP in text.splitlines()[0]


def test_table_has_one_line_per_partition() -> None:
    state = world(
        claim("orders", 0, T0, client="host-a", instance="i-1"),
        heartbeat("orders", 0, T0 + 1000, 123456, client="host-a", instance="i-1"),
        claim("orders", 1, T0, client="host-b", instance="i-2"),
        release("orders", 1, T0 + 500, 99, client="host-b", instance="i-2"),
        claim("payments", 7, T0, client="host-c", instance="i-3"),
    )
    document = status_document(state, T0 + 2000, "orders", topic_partitions=3)
    lines = render_table(document, T0 + 2000).splitlines()
    orders_lines = [line for line in lines if line.split() and line.split()[0] == "orders"]
    assert len(orders_lines) == 3
    by_partition = {line.split()[1]: line for line in orders_lines}
    assert set(by_partition) == {"0", "1", "2"}
    assert "fresh" in by_partition["0"] and "host-a" in by_partition["0"] and "123456" in by_partition["0"]
    assert "released" in by_partition["1"] and "99" in by_partition["1"]
    assert "unclaimed" in by_partition["2"]
    assert not any("payments" in line for line in lines)


def test_table_for_every_partition_of_a_full_document() -> None:
    state = world(*(claim("orders", p, T0) for p in range(12)))
    document = status_document(state, T0)
    lines = render_table(document, T0).splitlines()
    for p in range(12):
        assert sum(1 for line in lines if line.split()[:2] == ["orders", str(p)]) == 1


def test_table_of_empty_state_says_so() -> None:
    text = render_table(status_document(world(), T0), T0)
    lines = text.splitlines()
    assert GROUP in lines[0]
    assert len(lines) == 2
    assert "no partitions" in lines[1]


def test_table_shows_a_pause() -> None:
    state = world(claim("orders", 0, T0), release_group(T0 + 1000, expires=T0 + 60_000))
    text = render_table(status_document(state, T0 + 2000), T0 + 2000)
    assert "PAUSED" in text.splitlines()[0]


def test_table_without_pause_does_not_say_paused() -> None:
    text = render_table(status_document(world(claim("orders", 0, T0)), T0), T0)
    assert "PAUSED" not in text


def test_table_of_a_group_paused_far_into_the_future() -> None:
    # expires is any int >= 0 on the wire; an operator may pause "forever" with the largest int64.
    state = world(claim("orders", 0, T0), release_group(T0 + 1000, expires=2**63 - 1))
    document = status_document(state, T0 + 2000)
    assert document["paused_until"] == 2**63 - 1
    text = render_table(document, T0 + 2000)
    assert GROUP in text.splitlines()[0]
    assert "PAUSED" in text.splitlines()[0]


# ------------------------------------------------- lag and rate (heartbeat extras)


def heartbeat_value(at: int, offset: int, **extras: Any) -> bytes:
    """A heartbeat as another writer might send it, extras and all."""
    record = {"v": 1, "type": "heartbeat", "ts": at, "group": GROUP, "client": "host-a", "instance": "i-1"}
    return orjson.dumps(record | {"topic": "orders", "partition": 0, "offset": offset} | extras)


def test_status_shows_the_lag_and_rate_of_the_owners_last_heartbeat() -> None:
    state = world(claim("orders", 0, T0))
    state.apply_value(heartbeat_value(T0 + 1000, 10, lag=500, rate=1234.5))
    state.apply_value(heartbeat_value(T0 + 2000, 20, lag=42, rate=99.0))
    row = only_row(status_document(state, T0 + 2500))
    assert (row["offset"], row["lag"], row["rate"]) == (20, 42, 99.0)
    table = render_table(status_document(state, T0 + 2500), T0 + 2500)
    assert "LAG" in table and "MSGS/S" in table
    assert table.splitlines()[2].split()[-5:] == ["42", "99", "-", "-", "-"]


def test_status_shows_calls_in_flight_and_window_use_and_forgets_them_on_release() -> None:
    state = world(claim("orders", 0, T0))
    state.apply_value(heartbeat_value(T0 + 1000, 20, in_flight=32, window_used=1024, done=[3, 1, 2]))
    row = only_row(status_document(state, T0 + 1500))
    assert (row["in_flight"], row["window_used"]) == (32, 1024)
    table = render_table(status_document(state, T0 + 1500), T0 + 1500)
    assert table.splitlines()[2].split()[-3:] == ["32", "-", "1024"]
    state.apply_value(heartbeat_value(T0 + 2000, 20, in_flight="lots", window_used=-1))
    row = only_row(status_document(state, T0 + 2500))
    assert (row["in_flight"], row["window_used"]) == (None, None)


def test_status_shows_the_age_of_the_call_in_flight_and_forgets_it_with_the_owner() -> None:
    state = world(claim("orders", 0, T0))
    state.apply_value(heartbeat_value(T0 + 1000, 20, lag=3, in_flight=1, call_age_s=12.5))
    row = only_row(status_document(state, T0 + 1500))
    assert (row["in_flight"], row["call_age_s"]) == (1, 12.5)
    table = render_table(status_document(state, T0 + 1500), T0 + 1500).splitlines()
    assert "CALL AGE" in table[1] and table[2].split()[-3:] == ["1", "12.5s", "-"]
    state.apply_value(heartbeat_value(T0 + 2000, 21, call_age_s="long"))
    assert only_row(status_document(state, T0 + 2500))["call_age_s"] is None, "not a number: not shown"
    state.apply_value(heartbeat_value(T0 + 3000, 21, in_flight=1, call_age_s=2.0))
    state.apply(release("orders", 0, T0 + 4000, 21), T0 + 4000)
    row = only_row(status_document(state, T0 + 4500))
    assert (row["in_flight"], row["call_age_s"]) == (None, None), "the previous owner's call"


@pytest.mark.parametrize(
    "extras",
    [
        b'"lag":"many","rate":[1,2]',
        b'"lag":-1,"rate":-0.5',
        b'"lag":true,"rate":false',
        b'"lag":{"nested":{"deep":1}},"rate":null',
        b'"lag":1000000000000000000000000000000,"rate":1e300',
    ],
)
def test_malformed_extras_are_not_shown_and_do_not_spoil_the_heartbeat(extras: bytes) -> None:
    state = world(claim("orders", 0, T0))
    value = heartbeat_value(T0 + 1000, 33)[:-1] + b"," + extras + b"}"
    _, accepted = state.apply_value(value)
    assert accepted  # still a valid heartbeat: the partition is fresh at offset 33
    row = only_row(status_document(state, T0 + 2000))
    assert (row["state"], row["offset"], row["lag"], row["rate"]) == ("fresh", 33, None, None)


def test_a_new_owner_does_not_inherit_the_previous_owners_numbers() -> None:
    state = world(claim("orders", 0, T0))
    state.apply_value(heartbeat_value(T0 + 1000, 10, lag=500, rate=80))
    state.apply(claim("orders", 0, T0 + 1000 + 2 * HB + 1, client="host-b", instance="i-2"), T0 + 1000 + 2 * HB + 1)
    row = only_row(status_document(state, T0 + 1000 + 2 * HB + 2))
    assert (row["client"], row["lag"], row["rate"]) == ("host-b", None, None)


def test_a_released_partition_shows_no_lag_or_rate() -> None:
    state = world(claim("orders", 0, T0))
    state.apply_value(heartbeat_value(T0 + 1000, 10, lag=500, rate=80))
    state.apply(release("orders", 0, T0 + 2000, 12), T0 + 2000)
    row = only_row(status_document(state, T0 + 2500))
    assert (row["state"], row["lag"], row["rate"]) == ("released", None, None)


def test_shared_partitions_are_listed_with_their_low_water_mark_leases_and_counts() -> None:
    state = WorldState(GROUP, heartbeat_ms=1000)
    common = {"v": 1, "group": GROUP, "client": "host-a", "instance": "i-1"}
    state.apply(
        codec.ClaimRanges(
            **common,
            ts=T0,
            topic="thumbs",
            lease_ms=30_000,
            ranges=(codec.RangeEntry(partition=0, offset=0, end=50), codec.RangeEntry(partition=0, offset=50, end=100)),
        ),
        T0,
    )
    state.apply(
        codec.AckRanges(
            **common,
            ts=T0 + 1000,
            topic="thumbs",
            ranges=(codec.AckEntry(partition=0, offset=0, end=50, failed=(7,), dead=(9,), high=400),),
        ),
        T0 + 1000,
    )

    document = status_document(state, T0 + 2000)
    (row,) = document["shared"]
    assert document["partitions"] == [], "a shared partition is not listed as owned whole"
    assert (row["low_water_mark"], row["end"], row["acked"], row["dead_letters"], row["to_retry"]) == (7, 400, 49, 1, 1)
    (lease,) = row["leases"]
    assert (lease["client"], lease["offset"], lease["end"], lease["age_s"], lease["deliveries"]) == (
        "host-a",
        50,
        100,
        2.0,
        1,
    )
    table = render_table(document, T0 + 2000)
    assert "shared partitions" in table and "host-a/i-1" in table and "50..99" in table
    assert orjson.loads(orjson.dumps(document)) == document
