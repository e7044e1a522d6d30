"""The rules of the world state (docs/protocol.md), one scenario per rule."""

from __future__ import annotations

import pytest

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import Entry, WorldState, fold

HB = 1000
GROUP = "billing"


def rec(kind: type, client: str = "a", instance: str = "a1", ts: int = 0, **fields: object) -> codec.Record:
    fields.setdefault("topic", "orders") if kind is not codec.ReleaseGroup else None
    fields.setdefault("partition", 0) if kind is not codec.ReleaseGroup else None
    return kind(v=1, ts=ts, group=fields.pop("group", GROUP), client=client, instance=instance, **fields)


def claim(client: str, instance: str, ts: int, **kw: object) -> codec.Record:
    return rec(codec.Claim, client, instance, ts, **kw)


def heartbeat(client: str, instance: str, ts: int, offset: int, **kw: object) -> codec.Record:
    return rec(codec.Heartbeat, client, instance, ts, offset=offset, **kw)


def release(client: str, instance: str, ts: int, offset: int, **kw: object) -> codec.Record:
    return rec(codec.Release, client, instance, ts, offset=offset, **kw)


def claim_messages(client: str, instance: str, ts: int, offset: int, **kw: object) -> codec.Record:
    return rec(codec.ClaimMessages, client, instance, ts, offset=offset, **kw)


def release_group(client: str, ts: int, expires: int) -> codec.Record:
    return rec(codec.ReleaseGroup, client, "op1", ts, expires=expires)


def world(*records: codec.Record) -> tuple[WorldState, list[bool]]:
    state = WorldState(GROUP, HB)
    verdicts = [state.apply(r, r.ts) for r in records]
    return state, verdicts


# ---------------------------------------------------------------- claims


def test_first_claim_on_a_free_partition_wins_and_later_racers_lose() -> None:
    state, verdicts = world(claim("a", "a1", 10), claim("b", "b1", 11), claim("c", "c1", 12))
    assert verdicts == [True, False, False]
    assert state.owner("orders", 0) == MemberId("a", "a1")


def test_a_claim_is_refused_until_the_owner_is_more_than_two_heartbeats_silent() -> None:
    _, verdicts = world(claim("a", "a1", 0), claim("b", "b1", 2 * HB))
    assert verdicts == [True, False]  # exactly 2*HB is not yet stale
    state, verdicts = world(claim("a", "a1", 0), claim("b", "b1", 2 * HB + 1))
    assert verdicts == [True, True]
    assert state.owner("orders", 0) == MemberId("b", "b1")


def test_heartbeats_keep_a_claim_alive_past_two_intervals() -> None:
    _, verdicts = world(
        claim("a", "a1", 0), heartbeat("a", "a1", 1500, 5), heartbeat("a", "a1", 3000, 9), claim("b", "b1", 4500)
    )
    assert verdicts == [True, True, True, False]


def test_a_restarted_client_reclaims_its_partition_at_once() -> None:
    state, verdicts = world(claim("a", "a1", 0), heartbeat("a", "a1", 10, 7), claim("a", "a2", 20))
    assert verdicts == [True, True, True]
    assert state.owner("orders", 0) == MemberId("a", "a2")
    assert state.get("orders", 0).resume_offset == 7  # type: ignore[union-attr]


def test_the_owner_claiming_again_changes_nothing() -> None:
    _, verdicts = world(claim("a", "a1", 0), claim("a", "a1", 10))
    assert verdicts == [True, False]


# ------------------------------------------------------------ heartbeats


def test_a_heartbeat_from_the_owner_moves_its_offset_and_time() -> None:
    state, _ = world(claim("a", "a1", 0), heartbeat("a", "a1", 500, 42))
    found = state.get("orders", 0)
    assert found is not None and (found.last_ts, found.offset) == (500, 42)


def test_a_heartbeat_from_anyone_but_the_owner_is_ignored() -> None:
    """The Go library accepted these, which let a late zombie steal a partition back."""
    state, verdicts = world(
        claim("a", "a1", 0),
        heartbeat("b", "b1", 10, 99),  # another client
        heartbeat("a", "a0", 20, 98),  # an older instance of the owner's client
    )
    assert verdicts == [True, False, False]
    found = state.get("orders", 0)
    assert found is not None and found.offset is None and found.last_ts == 0


def test_a_zombie_cannot_take_back_a_partition_taken_over_after_it_went_stale() -> None:
    state, verdicts = world(
        claim("a", "a1", 0),
        heartbeat("a", "a1", 100, 10),
        claim("b", "b1", 100 + 2 * HB + 1),
        heartbeat("a", "a1", 100 + 2 * HB + 2, 11),  # a wakes up and heartbeats
        claim("a", "a1", 100 + 2 * HB + 3),
    )
    assert verdicts == [True, True, True, False, False]
    assert state.owner("orders", 0) == MemberId("b", "b1")


# --------------------------------------------------------------- releases


def test_a_release_frees_the_partition_at_once_and_carries_the_offset() -> None:
    state, verdicts = world(claim("a", "a1", 0), release("a", "a1", 10, 77), claim("b", "b1", 11))
    assert verdicts == [True, True, True]
    assert state.owner("orders", 0) == MemberId("b", "b1")
    assert state.get("orders", 0).resume_offset == 77  # type: ignore[union-attr]


def test_a_release_from_a_non_owner_is_ignored() -> None:
    state, verdicts = world(claim("a", "a1", 0), release("b", "b1", 10, 5), release("a", "a0", 11, 6))
    assert verdicts == [True, False, False]
    assert state.owner("orders", 0) == MemberId("a", "a1")


# ------------------------------------------------------- message claims


def test_claim_messages_moves_the_amo_offset_forward_only() -> None:
    state, verdicts = world(claim("a", "a1", 0), claim_messages("a", "a1", 10, 100), claim_messages("a", "a1", 20, 50))
    assert verdicts == [True, True, True]
    found = state.get("orders", 0)
    assert found is not None and found.amo_offset == 100 and found.last_ts == 20


def test_claim_messages_is_refused_from_a_non_owner_or_on_a_stale_lease() -> None:
    _, verdicts = world(
        claim("a", "a1", 0),
        claim_messages("b", "b1", 10, 100),
        claim_messages("a", "a1", 2 * HB + 1, 100),
    )
    assert verdicts == [True, False, False]


def test_a_new_owner_resumes_after_the_messages_claimed_even_if_progress_lagged() -> None:
    """AMO: a batch claimed but never reported is never processed again."""
    state, _ = world(
        claim("a", "a1", 0),
        heartbeat("a", "a1", 10, 40),
        claim_messages("a", "a1", 20, 60),
        claim("b", "b1", 20 + 2 * HB + 1),
    )
    assert state.get("orders", 0).resume_offset == 60  # type: ignore[union-attr]


# ------------------------------------------------------------------ pause


def test_release_group_drops_every_owner_and_refuses_claims_until_it_expires() -> None:
    state, verdicts = world(
        claim("a", "a1", 0, partition=0),
        heartbeat("a", "a1", 5, 10, partition=0),
        claim("b", "b1", 1, partition=1),
        release_group("op", 100, expires=5000),
        heartbeat("a", "a1", 200, 11, partition=0),
        claim("a", "a1", 4999, partition=0),
        claim("a", "a1", 5000, partition=0),
    )
    assert verdicts == [True, True, True, True, False, False, True]
    assert state.owner("orders", 1) is None
    assert state.get("orders", 0).resume_offset == 10  # type: ignore[union-attr]  # offsets are kept


def test_the_pausing_client_sets_a_groups_position_with_releases() -> None:
    state, verdicts = world(
        claim("a", "a1", 0),
        heartbeat("a", "a1", 5, 500),
        claim_messages("a", "a1", 6, 600),
        release_group("op", 100, expires=5000),
        release("op", "op1", 110, 7),  # operator: rewind partition 0
        release("op", "op1", 111, 3, partition=5),  # a partition nobody ever claimed
        release("b", "b1", 112, 9),  # not the operator
    )
    assert verdicts[-3:] == [True, True, False]
    assert state.get("orders", 0).resume_offset == 7  # type: ignore[union-attr]
    assert state.get("orders", 5).resume_offset == 3  # type: ignore[union-attr]


def test_the_operators_releases_are_ignored_once_the_pause_is_over() -> None:
    _, verdicts = world(release_group("op", 100, expires=200), release("op", "op1", 200, 7))
    assert verdicts == [True, False]


def test_a_pause_applies_only_to_the_coordination_partition_that_carries_it() -> None:
    """Each coordination partition has its own copy of release_group, ordered with its own topics."""
    count = 8
    topics = {codec.coordination_partition(f"t{i}", count): f"t{i}" for i in range(64)}
    (p_one, t_one), (p_two, t_two) = list(topics.items())[:2]
    state = WorldState(GROUP, HB, count)
    state.apply(release_group("op", 0, expires=1000), 0, p_one)
    assert not state.apply(claim("a", "a1", 10, topic=t_one), 10, p_one)
    assert state.apply(claim("a", "a1", 10, topic=t_two), 10, p_two)  # its copy is not folded yet
    assert state.paused_until() == 1000


# ------------------------------------------------------ routing and groups


def test_records_of_other_groups_are_skipped_and_counted() -> None:
    state, verdicts = world(claim("a", "a1", 0, group="other"))
    assert verdicts == [False] and state.partitions == {} and state.stats.other_groups == 1


def test_a_record_on_the_wrong_coordination_partition_is_skipped() -> None:
    count = 8
    home = codec.coordination_partition("orders", count)
    state = WorldState(GROUP, HB, count)
    assert not state.apply(claim("a", "a1", 0), 0, (home + 1) % count)
    assert state.stats.misrouted == 1 and state.owner("orders", 0) is None
    assert state.apply(claim("a", "a1", 0), 0, home)


def test_fold_leaves_its_input_alone() -> None:
    base = WorldState(GROUP, HB)
    after = fold([Entry(claim("a", "a1", 0), 0)], base)
    assert base.partitions == {} and after.owner("orders", 0) == MemberId("a", "a1")


def test_heartbeat_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        WorldState(GROUP, 0)


def test_heartbeat_extras_are_kept_only_as_numbers() -> None:
    deep = "[" * 900 + "]" * 900
    raw = (
        b'{"v":1,"type":"heartbeat","ts":5,"group":"%s","client":"a","instance":"a1","topic":"orders",'
        b'"partition":0,"offset":3,"lag":%s,"rate":"%s"}' % (GROUP.encode(), deep.encode(), b"x" * 100_000)
    )
    state, _ = world(claim("a", "a1", 0))
    _, accepted = state.apply_value(raw)
    assert accepted
    found = state.get("orders", 0)
    assert found is not None and (found.offset, found.lag, found.rate) == (3, None, None)
    state.snapshot()  # nothing deep or large is kept: a copy of the state works


# ------------------------------------------- done above the offset (section 10)


def test_the_owners_done_set_travels_with_its_offset_and_survives_a_takeover() -> None:
    state, verdicts = world(
        claim("a", "a1", 0), heartbeat("a", "a1", 10, 40, done=[2, 1, 3]), claim("b", "b1", 10 + 2 * HB + 1)
    )
    assert verdicts == [True, True, True]
    found = state.get("orders", 0)
    assert found is not None and (found.resume_offset, found.done) == (40, (2, 1, 3))
    assert found.skip_ranges() == [(41, 43), (44, 47)]  # b processes 40, 43, then 47 on


def test_a_release_carries_its_done_set_and_one_without_clears_it() -> None:
    state, _ = world(
        claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[3]), release("a", "a1", 10, 41, done=[0, 1, 1])
    )
    assert state.get("orders", 0).skip_ranges() == [(43, 44)]  # type: ignore[union-attr]
    state, _ = world(claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[3]), release("a", "a1", 10, 41))
    assert state.get("orders", 0).done is None  # type: ignore[union-attr]


def test_a_heartbeat_without_a_done_set_clears_the_previous_one() -> None:
    state, _ = world(claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[3]), heartbeat("a", "a1", 6, 44))
    found = state.get("orders", 0)
    assert found is not None and (found.offset, found.done, found.skip_ranges()) == (44, None, [])


@pytest.mark.parametrize("done", [[1, 2], [-1], [True], "3", {"x": 1}, [1.5], [0], [2**63], [1] * 8193])
def test_a_malformed_done_set_is_absent_and_the_heartbeat_still_counts(done: object) -> None:
    state, verdicts = world(
        claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[3]), heartbeat("a", "a1", 6, 41, done=done)
    )
    assert verdicts == [True, True, True]
    found = state.get("orders", 0)
    assert found is not None and (found.offset, found.last_ts, found.done) == (41, 6, None)


def test_an_empty_done_set_is_none() -> None:
    state, _ = world(claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[]))
    assert state.get("orders", 0).done is None  # type: ignore[union-attr]


def test_a_done_set_from_anyone_but_the_owner_is_ignored() -> None:
    state, verdicts = world(
        claim("a", "a1", 0),
        heartbeat("a", "a1", 5, 40, done=[3]),
        heartbeat("b", "b1", 6, 40, done=[9]),
        release("a", "a0", 7, 40, done=[9]),
    )
    assert verdicts == [True, True, False, False]
    assert state.get("orders", 0).done == (3,)  # type: ignore[union-attr]


def test_messages_claimed_at_most_once_make_the_done_set_moot_where_they_overlap() -> None:
    state, _ = world(
        claim("a", "a1", 0), heartbeat("a", "a1", 5, 40, done=[2, 1, 3, 2, 1]), claim_messages("a", "a1", 6, 45)
    )
    found = state.get("orders", 0)
    assert found is not None and found.resume_offset == 45
    assert found.skip_ranges() == [(45, 47), (49, 50)]  # 41-42 lie below 45; 44-46 is clipped to 45-46


def test_an_operators_position_drops_the_done_set() -> None:
    state, _ = world(
        claim("a", "a1", 0),
        heartbeat("a", "a1", 5, 40, done=[3]),
        release_group("op", 100, expires=5000),
        release("op", "op1", 110, 7, done=[1]),
    )
    found = state.get("orders", 0)
    assert found is not None and (found.resume_offset, found.done) == (7, None)


def test_a_done_set_on_the_wire_is_folded_and_garbage_in_it_is_not_garbage() -> None:
    head = (
        b'{"v":1,"type":"heartbeat","ts":5,"group":"%s","client":"a","instance":"a1","topic":"orders",'
        b'"partition":0,"offset":3' % GROUP.encode()
    )
    state, _ = world(claim("a", "a1", 0))
    assert state.apply_value(head + b',"done":[1,2,1]}')[1]
    assert state.get("orders", 0).done == (1, 2, 1)  # type: ignore[union-attr]
    deep = b"[" * 900 + b"]" * 900
    for junk in (deep, b'"' + b"x" * 100_000 + b'"', b"[1e300]", b"[99999999999999999999999]", b"null"):
        assert state.apply_value(head + b',"done":' + junk + b"}")[1]
        assert state.get("orders", 0).done is None  # type: ignore[union-attr]
    assert state.stats.garbage == 0
    state.snapshot()


def test_heartbeats_of_several_partitions_in_one_record_have_a_verdict_each() -> None:
    state = WorldState("g", 1000)
    common = {"v": 1, "group": "g", "client": "a", "instance": "a1"}
    state.apply(codec.Claim(**common, ts=0, topic="orders", partition=0), 0)
    state.apply(codec.Claim(**common, ts=0, topic="orders", partition=2), 0)
    state.apply(codec.Claim(**common | {"client": "b", "instance": "b1"}, ts=0, topic="orders", partition=1), 0)
    beats = tuple(codec.Beat(partition=p, offset=10 + p) for p in (0, 1, 2))
    verdict = state.apply(codec.Heartbeats(**common, ts=500, topic="orders", beats=beats), 500)
    assert list(verdict) == [True, False, True]  # partition 1 is b's: a's beat for it is ignored
    assert bool(verdict)
    assert [state.get("orders", p).offset for p in (0, 1, 2)] == [10, None, 12]  # type: ignore[union-attr]
    assert state.stats.applied == 3 + 1  # one record, however many entries
