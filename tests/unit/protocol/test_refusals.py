"""protocol/refusals.py: why the fold refused a record, as ``marshal-workers log`` shows it."""

from __future__ import annotations

from marshal_workers.protocol import codec
from marshal_workers.protocol.refusals import refusals
from marshal_workers.protocol.world_state import WorldState

HB = 1000
COMMON = {"v": 1, "group": "g"}


def rec(kind: type, ts: int, client: str, instance: str, **fields: object) -> codec.Record:
    return kind(**COMMON, ts=ts, client=client, instance=instance, **fields)  # type: ignore[no-any-return]


def apply(state: WorldState, record: codec.Record) -> list[str]:
    verdict = state.apply(record, record.ts, 0)
    return refusals(state, record, record.ts, 0, verdict)


def test_accepted_records_have_no_refusal_and_refused_ones_say_why() -> None:
    state = WorldState("g", HB)
    assert apply(state, rec(codec.Claim, 1000, "a", "a1", topic="t", partition=0)) == []
    assert apply(state, rec(codec.Heartbeat, 1500, "a", "a1", topic="t", partition=0, offset=5)) == []
    assert apply(state, rec(codec.Claim, 1600, "b", "b1", topic="t", partition=0)) == [
        "refused: owned by a/a1, heard from 100 ms before"
    ]
    assert apply(state, rec(codec.Heartbeat, 1700, "b", "b1", topic="t", partition=0, offset=9)) == [
        "(ignored: not the owner; the owner is a/a1)"
    ]
    assert apply(state, rec(codec.Release, 1800, "b", "b1", topic="t", partition=0, offset=9)) == [
        "(ignored: not the owner; the owner is a/a1)"
    ]
    assert apply(state, rec(codec.Heartbeat, 1900, "b", "b1", topic="t", partition=3, offset=9)) == [
        "(ignored: not the owner; it has none)"
    ]
    lapsed = rec(codec.ClaimMessages, 1500 + 2 * HB + 1, "a", "a1", topic="t", partition=0, offset=20)
    assert apply(state, lapsed) == ["refused: the claim had lapsed (the owner was silent for 2001 ms, over 2 HB)"]


def test_a_record_about_several_partitions_names_its_refused_entries() -> None:
    state = WorldState("g", HB)
    apply(state, rec(codec.Claim, 1000, "a", "a1", topic="t", partition=0))
    beats = rec(
        codec.Heartbeats,
        1100,
        "a",
        "a1",
        topic="t",
        beats=(codec.Beat(partition=0, offset=3), codec.Beat(partition=1, offset=4)),
    )
    assert apply(state, beats) == ["[1] (ignored: not the owner; it has none)"]


def test_claims_during_a_pause_are_refused_as_paused() -> None:
    state = WorldState("g", HB)
    assert apply(state, rec(codec.ReleaseGroup, 1000, "admin@x", "x1", expires=6000)) == []
    assert apply(state, rec(codec.Claim, 2000, "a", "a1", topic="t", partition=0)) == [
        "refused: the group is paused for 4000 ms more (by admin@x)"
    ]


def test_records_on_the_wrong_coordination_partition_are_ignored_as_misrouted() -> None:
    state = WorldState("g", HB, coordination_partitions=8)
    home = codec.coordination_partition("t", 8)
    claim = rec(codec.Claim, 1000, "a", "a1", topic="t", partition=0)
    wrong = (home + 1) % 8
    assert refusals(state, claim, 1000, wrong, state.apply(claim, 1000, wrong)) == [
        "ignored: not on its topic's coordination partition"
    ]


def test_the_log_command_shows_the_folds_verdict_at_the_end_of_refused_records() -> None:
    from marshal_workers.ops.admin import fold_record

    state = WorldState("g", HB)
    records = [
        rec(codec.Claim, 1_764_000_000_000, "a", "a1", topic="t", partition=0),
        rec(codec.Claim, 1_764_000_000_500, "b", "b1", topic="t", partition=0),
        rec(codec.Heartbeat, 1_764_000_000_600, "b", "b1", topic="t", partition=0, offset=7),
        rec(codec.Claim, 1_764_000_000_700, "a", "a1", topic="other", partition=1),
    ]
    lines = [fold_record(state, codec.encode(r), 0, n) for n, r in enumerate(records)]
    assert lines[0] == "0@0 2025-11-24T16:00:00.000Z claim a/a1 t[0]", "an accepted record shows as before"
    assert lines[1] == "0@1 2025-11-24T16:00:00.500Z claim b/b1 t[0] refused: owned by a/a1, heard from 500 ms before"
    assert lines[2].endswith("heartbeat b/b1 t[0] offset=7 (ignored: not the owner; the owner is a/a1)")
    assert lines[3].endswith("claim a/a1 other[1]")
    assert fold_record(state, b"not json", 0, 9) is not None and "garbage" in str(fold_record(state, b"{", 0, 10))
    other_group = codec.Claim(v=1, ts=1, group="h", client="a", instance="a1", topic="t", partition=0)
    assert fold_record(state, codec.encode(other_group), 0, 11) is None


def test_operators_orders_and_the_claims_they_forbid_say_why() -> None:
    state = WorldState("g", HB)
    assert apply(state, rec(codec.Control, 1000, "admin@ops", "o1", target="a", action="resume")) == [
        "ignored: a was not drained"
    ]
    assert apply(state, rec(codec.ReleasePartition, 1000, "admin@ops", "o1", topic="t", partition=0)) == [
        "ignored: the partition has no owner to ask"
    ]
    assert apply(state, rec(codec.Control, 1100, "admin@ops", "o1", target="a", action="drain")) == []
    assert apply(state, rec(codec.Claim, 1200, "a", "a1", topic="t", partition=0)) == [
        "refused: client a is drained (admin drain)"
    ]
    assert apply(state, rec(codec.PauseTopic, 1300, "admin@ops", "o1", topic="t", expires=2**63 - 1)) == []
    assert apply(state, rec(codec.Claim, 1400, "b", "b1", topic="t", partition=0)) == [
        "refused: topic t is paused (admin pause --topic)"
    ]
    ranges = (codec.RangeEntry(partition=0, offset=0, end=5),)
    assert apply(state, rec(codec.ClaimRanges, 1500, "a", "a1", topic="u", lease_ms=HB, ranges=ranges)) == [
        "refused [0]0..4: client a is drained (admin drain)"
    ]
