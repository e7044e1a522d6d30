"""Remote control without a broker: the fold's rules for operators' orders, what a supervisor reads from them,
how ``status`` and ``log`` show them."""

from __future__ import annotations

import pytest

from marshal_workers.errors import DecodeError
from marshal_workers.observe.status import render_table, status_document
from marshal_workers.ops.admin import format_record
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.orders import Orders, orders_for
from marshal_workers.protocol.world_state import WorldState

HB = 1000
A1, B1 = MemberId("a", "a1"), MemberId("b", "b1")


def common(who: MemberId | str, ts: int) -> dict[str, object]:
    client, instance = (who.client, who.instance) if isinstance(who, MemberId) else (who, who + "-1")
    return {"v": 1, "ts": ts, "group": "g", "client": client, "instance": instance}


def fold(*records: codec.Record) -> WorldState:
    state = WorldState("g", HB)
    for record in records:
        state.apply(record, record.ts)
    return state


def claim(who: MemberId, ts: int, topic: str = "orders", partition: int = 0) -> codec.Claim:
    return codec.Claim(**common(who, ts), topic=topic, partition=partition)


def control(action: str, target: str, ts: int) -> codec.Control:
    return codec.Control(**common("admin@ops", ts), target=target, action=action)  # type: ignore[arg-type]


def test_a_drained_client_cannot_claim_until_resumed_but_keeps_what_it_holds() -> None:
    state = fold(claim(A1, 1), control("drain", "a", 2))
    assert state.owner("orders", 0) == A1, "the fold drops no owner: the drained member releases it itself"
    assert not state.apply(claim(A1, 3, partition=1), 3), "no new claim while drained"
    assert not state.apply(
        codec.ClaimRanges(
            **common(A1, 4), topic="thumbs", lease_ms=HB, ranges=(codec.RangeEntry(partition=0, offset=0, end=10),)
        ),
        4,
    )
    assert state.apply(claim(B1, 5, partition=1), 5), "other clients claim as usual"
    assert not state.is_free("orders", 2, 6, "a", "a1") and state.is_free("orders", 2, 6, "b", "b1")
    assert state.apply(control("resume", "a", 7), 7)
    assert not state.apply(control("resume", "a", 8), 8), "resuming a client that is not drained changes nothing"
    assert state.apply(claim(A1, 9, partition=2), 9)


def test_a_paused_topic_refuses_claims_and_batch_claims_until_its_pause_ends() -> None:
    pause = codec.PauseTopic(**common("admin@ops", 2), topic="orders", expires=2**63 - 1)
    state = fold(claim(A1, 1), pause)
    assert not state.apply(codec.ClaimMessages(**common(A1, 3), topic="orders", partition=0, offset=10), 3)
    assert not state.apply(claim(B1, 4, partition=1), 4)
    assert state.apply(claim(B1, 5, topic="payments"), 5), "other topics are not paused"
    assert state.paused_topics(6) == {"orders": 2**63 - 1}
    state.apply(codec.PauseTopic(**common("admin@ops", 7), topic="orders", expires=0), 7)
    assert state.paused_topics(8) == {} and state.apply(claim(B1, 8, partition=1), 8)
    timed = fold(codec.PauseTopic(**common("admin@ops", 1), topic="orders", expires=100))
    assert not timed.apply(claim(A1, 99), 99) and timed.apply(claim(A1, 100), 100), "a pause ends at its expiry"


def test_a_release_request_lasts_as_long_as_the_owner_it_was_made_to() -> None:
    request = codec.ReleasePartition(**common("admin@ops", 2), topic="orders", partition=0)
    assert not fold(request).get("orders", 0), "nobody to ask: refused, nothing noted"
    state = fold(claim(A1, 1), request)
    assert state.get("orders", 0).release_requested  # type: ignore[union-attr]
    state.apply(codec.Release(**common(A1, 3), topic="orders", partition=0, offset=7), 3)
    assert not state.get("orders", 0).release_requested  # type: ignore[union-attr]
    stolen = fold(claim(A1, 1), request, claim(B1, 1 + 3 * HB))  # a went stale; b took over
    assert stolen.owner("orders", 0) == B1 and not stolen.get("orders", 0).release_requested  # type: ignore[union-attr]


def test_a_supervisor_reads_its_orders() -> None:
    state = fold(
        claim(A1, 1),
        claim(A1, 1, partition=1),
        claim(B1, 1, partition=2),
        codec.ReleasePartition(**common("admin@ops", 2), topic="orders", partition=1),
        codec.PauseTopic(**common("admin@ops", 2), topic="payments", expires=50),
    )
    assert orders_for(state, A1, started_ms=0, now_ms=10) == Orders(
        paused_topics=frozenset({"payments"}), release=frozenset({("orders", 1)})
    )
    assert orders_for(state, B1, started_ms=0, now_ms=60) == Orders(), "the request was for a; the pause is over"
    state.apply(control("shutdown", "a", 20), 20)
    assert orders_for(state, A1, started_ms=10, now_ms=30).shutdown
    assert not orders_for(state, MemberId("a", "a2"), started_ms=25, now_ms=30).shutdown, "started after the order"
    state.apply(control("drain", "b", 30), 30)
    orders = orders_for(state, B1, started_ms=0, now_ms=31)
    assert orders.drained and orders.give_up(("orders", 2)) == "drain"
    assert Orders(paused_topics=frozenset({"t"})).give_up(("t", 0)) == "pause"
    assert Orders().give_up(("t", 0)) is None


@pytest.mark.parametrize(
    "value",
    [
        b'{"v":1,"type":"control","ts":1,"group":"g","client":"x","instance":"x1","target":"a","action":"steal"}',
        b'{"v":1,"type":"control","ts":1,"group":"g","client":"x","instance":"x1","action":"drain"}',
        b'{"v":1,"type":"control","ts":1,"group":"g","client":"x","instance":"x1","target":"","action":"drain"}',
        b'{"v":1,"type":"pause_topic","ts":1,"group":"g","client":"x","instance":"x1","topic":"t","expires":-1}',
        b'{"v":1,"type":"release_partition","ts":1,"group":"g","client":"x","instance":"x1","topic":"t"}',
    ],
)
def test_malformed_orders_are_garbage_and_change_nothing(value: bytes) -> None:
    state = fold(claim(A1, 1))
    before = state.snapshot()
    with pytest.raises(DecodeError):
        state.apply_value(value)
    assert state.partitions == before.partitions and state.controls == {} and state.topic_pauses == {}


def test_status_and_log_show_the_orders() -> None:
    state = fold(
        claim(A1, 1),
        control("drain", "b", 2),
        codec.PauseTopic(**common("admin@ops", 3), topic="orders", expires=2**63 - 1),
    )
    document = status_document(state, 10)
    assert document["drained"] == [{"client": "b", "since": 2}]
    assert document["paused_topics"] == [{"topic": "orders", "until": 2**63 - 1}]
    table = render_table(document, 10)
    assert "topic orders PAUSED until `admin resume --topic`" in table and "client b DRAINED" in table
    assert "drained" not in status_document(fold(claim(A1, 1)), 10), "no orders, no extra keys"

    line = format_record(codec.encode(control("drain", "b", 2)), 0, 5, "g")
    assert line is not None and line.endswith("control admin@ops/admin@ops-1 drain b")
    ended = codec.PauseTopic(**common("admin@ops", 3), topic="orders", expires=0)
    assert str(format_record(codec.encode(ended), 0, 6, "g")).endswith("orders (ends its pause)")
    request = codec.ReleasePartition(**common("admin@ops", 4), topic="orders", partition=3)
    assert str(format_record(codec.encode(request), 0, 7, "g")).endswith(
        "release_partition admin@ops/admin@ops-1 orders[3]"
    )
