"""Properties of the fold over generated logs of racing clients (hypothesis)."""

from __future__ import annotations

import copy
import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import PartitionState

HB = 1000
GROUP = "g"
CLIENTS = [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("c", "c1"), ("op", "op1")]
TOPICS = ["orders", "payments", "audit"]
STEPS = [0, 1, 10, HB // 2, HB, 2 * HB, 2 * HB + 1, 3 * HB]
# Done sets as writers send them: mostly none, some valid, some malformed (which the fold treats as none).
DONE = [None, None, None, [], [1], [0, 2, 1], [3, 1, 2], [True], [1, 2], "x", [-1]]

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


@st.composite
def logs(draw: st.DrawFn, max_size: int = 120) -> list[codec.Record]:
    """A log of racing clients: times never go backwards, every record type appears."""
    size = draw(st.integers(1, max_size))
    now = 0
    records: list[codec.Record] = []
    for _ in range(size):
        now += draw(st.sampled_from(STEPS))
        client, instance = draw(st.sampled_from(CLIENTS))
        common = {"v": 1, "ts": now, "group": GROUP, "client": client, "instance": instance}
        kind = draw(
            st.sampled_from(
                ["claim"] * 4
                + ["heartbeat"] * 4
                + ["release", "claim_messages", "release_group"]
                + ["control", "pause_topic", "release_partition"]
            )
        )
        if kind == "release_group":
            records.append(codec.ReleaseGroup(**common, expires=now + draw(st.sampled_from([0, HB, 3 * HB]))))
            continue
        if kind == "control":  # an operator's order about a client
            target = draw(st.sampled_from(["a", "b", "c"]))
            action = draw(st.sampled_from(["drain", "drain", "resume", "resume", "shutdown"]))
            records.append(codec.Control(**common, target=target, action=action))
            continue
        if kind == "pause_topic":
            expires = draw(st.sampled_from([0, now + HB, now + 3 * HB, 2**63 - 1]))
            records.append(codec.PauseTopic(**common, topic=draw(st.sampled_from(TOPICS)), expires=expires))
            continue
        where = {"topic": draw(st.sampled_from(TOPICS)), "partition": draw(st.integers(0, 2))}
        offset = draw(st.integers(0, 1000))
        if kind == "claim":
            records.append(codec.Claim(**common, **where))
        elif kind == "release_partition":
            records.append(codec.ReleasePartition(**common, **where))
        elif kind == "heartbeat":
            records.append(codec.Heartbeat(**common, **where, offset=offset, done=draw(st.sampled_from(DONE))))
        elif kind == "release":
            records.append(codec.Release(**common, **where, offset=offset, done=draw(st.sampled_from(DONE))))
        else:
            records.append(codec.ClaimMessages(**common, **where, offset=offset))
    return records


garbage_values = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b'{"v":1}',
            b'{"v":2,"type":"claim","ts":1,"group":"g","client":"x","instance":"x1","topic":"orders","partition":0}',
            b'{"v":1,"type":"claim","ts":1,"group":"g","client":"x","instance":"x1","topic":"orders","partition":-1}',
            b'{"v":1,"type":"heartbeat","ts":1,"group":"g","client":"a","instance":"a1","topic":"orders","partition":0}',
            b'{"v":1,"type":"steal","ts":1,"group":"g","client":"x","instance":"x1","topic":"orders","partition":0}',
        ]
    ),
)


def fold_all(records: list[codec.Record], state: WorldState | None = None) -> WorldState:
    state = state or WorldState(GROUP, HB)
    for record in records:
        state.apply(record, record.ts)
    return state


def is_paused(state: WorldState, at: int) -> bool:
    pause = state.pauses.get(0)
    return pause is not None and at < pause.until


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_every_step_follows_the_rules(log: list[codec.Record]) -> None:
    """Checked at every prefix: ownership moves only as the rules allow, so the
    leases of two different clients never overlap, and the earliest valid claim
    since the partition became free is the owner."""
    state = WorldState(GROUP, HB)
    drained: set[str] = set()  # the reference model of the operators' orders
    topic_pauses: dict[str, int] = {}
    for record in log:
        at = record.ts
        partition_record = isinstance(
            record, (codec.Claim, codec.Heartbeat, codec.Release, codec.ClaimMessages, codec.ReleasePartition)
        )
        key = (record.topic, record.partition) if partition_record else None  # type: ignore[union-attr]
        before = copy.copy(state.partitions.get(key)) if key else None
        owners_before = {k: s.owner for k, s in state.partitions.items()}
        paused = is_paused(state, at)
        accepted = state.apply(record, at)
        after = state.partitions.get(key) if key else None
        owner = before.owner if before else None
        me = MemberId(record.client, record.instance)

        if isinstance(record, codec.Claim):
            claimable = (
                owner is None
                or at - before.last_ts > 2 * HB  # type: ignore[union-attr]
                or (owner.client == record.client and owner.instance != record.instance)
            )
            held_back = record.client in drained or at < topic_pauses.get(record.topic, 0)
            assert accepted == (claimable and not paused and not held_back)
            assert after is not None or not accepted
            assert (after.owner if after else None) == (me if accepted else owner)
        elif isinstance(record, codec.Heartbeat):
            assert accepted == (owner == me)
            assert (after.offset if after else None) == (
                record.offset if accepted else (before.offset if before else None)
            )
            if accepted:
                assert after is not None and after.done == (done_set.parse(record.offset, record.done) or None)
            elif before is not None:
                assert after is not None and after.done == before.done
        elif isinstance(record, codec.Release):
            operator = paused and state.pauses[0].client == record.client
            assert accepted == (owner == me or operator)
            if owner == me:
                assert after is not None and after.owner is None and after.offset == record.offset
                assert after.done == (done_set.parse(record.offset, record.done) or None)
        elif isinstance(record, codec.ClaimMessages):
            fresh = before is not None and at - before.last_ts <= 2 * HB
            topic_paused = at < topic_pauses.get(record.topic, 0)
            assert accepted == (owner == me and fresh and not paused and not topic_paused)
            if accepted:
                assert after is not None and after.amo_offset is not None and after.amo_offset >= record.offset
        elif isinstance(record, codec.ReleasePartition):
            assert accepted == (owner is not None)
            assert (after.owner if after else None) == owner  # a request: the owner releases, the fold does not
            assert after is None or after.release_requested == (accepted or before.release_requested)  # type: ignore[union-attr]
        elif isinstance(record, codec.Control):
            if record.action == "drain":
                drained.add(record.target)
            elif record.action == "resume":
                assert accepted == (record.target in drained)
                drained.discard(record.target)
            assert state.is_drained(record.target) == (record.target in drained)
        elif isinstance(record, codec.PauseTopic):
            topic_pauses[record.topic] = record.expires
            assert accepted and state.topic_paused(record.topic, at) == (at < record.expires)
        else:
            assert accepted and all(s.owner is None for s in state.partitions.values())
        # A hand-over request lives only as long as the owner it was made to.
        assert all(s.owner is not None for s in state.partitions.values() if s.release_requested)

        if not isinstance(record, codec.ReleaseGroup):
            # No other partition is touched by a partition record.
            assert {k: s.owner for k, s in state.partitions.items() if k != key} == {
                k: o for k, o in owners_before.items() if k != key
            }


@settings(max_examples=examples(200), deadline=None)
@given(logs())
def test_folding_the_same_log_twice_gives_equal_states(log: list[codec.Record]) -> None:
    assert fold_all(log) == fold_all(log)


@settings(max_examples=examples(200), deadline=None)
@given(logs(), st.lists(garbage_values, min_size=1, max_size=30), st.randoms(use_true_random=False))
def test_interleaved_garbage_changes_nothing(log: list[codec.Record], garbage: list[bytes], rnd: random.Random) -> None:
    values: list[bytes | None] = [codec.encode(r) for r in log]
    for value in garbage:
        values.insert(rnd.randint(0, len(values)), value)
    values.insert(rnd.randint(0, len(values)), None)  # a tombstone
    state = WorldState(GROUP, HB)
    for value in values:
        try:
            state.apply_value(value)
        except DecodeError:
            pass
    clean = fold_all(log)
    assert state.partitions == clean.partitions and state.pauses == clean.pauses
    assert state.controls == clean.controls and state.topic_pauses == clean.topic_pauses
    assert state.stats.garbage == len(garbage) + 1


@settings(max_examples=examples(200), deadline=None)
@given(logs(), st.randoms(use_true_random=False))
def test_readers_agree_whatever_order_they_fetch_the_coordination_partitions(
    log: list[codec.Record], rnd: random.Random
) -> None:
    """Only the order within a coordination partition is shared by all readers."""
    count = 4
    per_partition: dict[int, list[codec.Record]] = {p: [] for p in range(count)}
    for record in log:
        if isinstance(record, codec.GROUP_RECORD_TYPES):
            for copies in per_partition.values():
                copies.append(record)
        else:
            per_partition[codec.coordination_partition(record.topic, count)].append(record)

    def read_in_random_interleaving() -> WorldState:
        cursors = {p: 0 for p in per_partition}
        state = WorldState(GROUP, HB, count)
        while True:
            open_partitions = [p for p, i in cursors.items() if i < len(per_partition[p])]
            if not open_partitions:
                return state
            p = rnd.choice(open_partitions)
            record = per_partition[p][cursors[p]]
            cursors[p] += 1
            state.apply(record, record.ts, p)

    first, second = read_in_random_interleaving(), read_in_random_interleaving()
    assert first.partitions == second.partitions
    assert first.pauses == second.pauses
    assert first.controls == second.controls and first.topic_pauses == second.topic_pauses


@settings(max_examples=examples(200), deadline=None)
@given(logs())
def test_records_of_other_groups_never_change_the_state(log: list[codec.Record]) -> None:
    noise = [
        codec.Claim(v=1, ts=r.ts, group="other", client="z", instance="z1", topic="orders", partition=0) for r in log
    ]
    mixed = [r for pair in zip(log, noise) for r in pair]
    assert fold_all(mixed).partitions == fold_all(log).partitions


def test_a_race_of_many_claimants_has_exactly_one_winner_the_earliest() -> None:
    for seed in range(50):
        rnd = random.Random(seed)
        claimants = [(f"c{i}", f"c{i}-1") for i in range(8)]
        rnd.shuffle(claimants)
        log = [
            codec.Claim(v=1, ts=10 + i, group=GROUP, client=c, instance=i_, topic="orders", partition=0)
            for i, (c, i_) in enumerate(claimants)
        ]
        state = fold_all(log)
        assert state.owner("orders", 0) == MemberId(*claimants[0])
        assert isinstance(state.get("orders", 0), PartitionState)


def _entry(record: codec.Record) -> codec.Beat | codec.MessageClaim | None:
    """A single-partition record as an entry of a multi-partition record, or None if it has no such form."""
    if isinstance(record, codec.Heartbeat):
        return codec.Beat(partition=record.partition, offset=record.offset, done=record.done)
    if isinstance(record, codec.ClaimMessages):
        return codec.MessageClaim(partition=record.partition, offset=record.offset)
    return None


def batched(records: list[codec.Record]) -> list[codec.Record]:
    """The same log with each run of heartbeats (claim_messages) of one writer, topic and time joined into one
    Heartbeats (MessageClaims) record, as a member writes them."""
    out: list[codec.Record] = []
    for record in records:
        entry = _entry(record)
        if entry is None:
            out.append(record)
            continue
        assert isinstance(record, (codec.Heartbeat, codec.ClaimMessages))
        joined_type = codec.Heartbeats if isinstance(record, codec.Heartbeat) else codec.MessageClaims
        entries_field = "beats" if joined_type is codec.Heartbeats else "claims"
        previous = out[-1] if out else None
        common = {
            "v": 1,
            "ts": record.ts,
            "group": record.group,
            "client": record.client,
            "instance": record.instance,
            "topic": record.topic,
        }
        if isinstance(previous, joined_type) and (previous.ts, previous.client, previous.instance, previous.topic) == (
            record.ts,
            record.client,
            record.instance,
            record.topic,
        ):
            out[-1] = joined_type(**common, **{entries_field: (*getattr(previous, entries_field), entry)})
        else:
            out.append(joined_type(**common, **{entries_field: (entry,)}))
    return out


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.lists(st.integers(0, 2), min_size=1, max_size=6))
def test_a_multi_partition_record_folds_exactly_as_its_entries_one_by_one(
    records: list[codec.Record], partitions: list[int]
) -> None:
    """heartbeats and message_claims: the same state and a verdict per entry as the single records."""
    # Make runs of same-time heartbeats (message claims) by one writer, as a member's round writes them.
    runs: list[codec.Record] = []
    for record in records:
        runs.append(record)
        if isinstance(record, (codec.Heartbeat, codec.ClaimMessages)):
            for p in partitions:
                runs.append(msgspec.structs.replace(record, partition=p, offset=record.offset + p))
    one_by_one, joined = WorldState(GROUP, HB), WorldState(GROUP, HB)
    singles = [one_by_one.apply(r, r.ts) for r in runs]
    verdicts = []
    multi = (codec.Heartbeats, codec.MessageClaims)
    for record in batched(runs):
        verdict = joined.apply(record, record.ts)
        verdicts.extend(verdict if isinstance(record, multi) else [verdict])
        if isinstance(record, multi):
            assert bool(verdict) == any(verdict)
    assert joined.partitions == one_by_one.partitions
    assert [bool(v) for v in verdicts] == singles
    # And a reader of the raw values agrees: the record survives the wire.
    from_wire = WorldState(GROUP, HB)
    for record in batched(runs):
        from_wire.apply_value(codec.encode(record))
    assert from_wire.partitions == one_by_one.partitions
