"""Properties of the range-lease fold (DESIGN.md section 11) over generated logs of racing holders (hypothesis).

The logs are what three members of a group write about two shared topics, one at-least-once and one
at-most-once (a topic is one mode): claims (mostly of ranges the log shows free), renewals, acks with
failed and dead offsets, cancels (mostly of leases the writer holds, sometimes of someone else's or of
a range that is not a lease), and pauses, while time moves forward in random steps so leases lapse.
A per-offset reference model, kept apart from range_leases, checks every verdict and state.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_world_state_properties import garbage_values

from marshal_workers import checkpoints, codec
from marshal_workers.errors import DecodeError
from marshal_workers.range_leases import MAX_RANGE, MAX_WINDOW, Holder, SharedPartition
from marshal_workers.world_state import Entry, WorldState, fold

HB = 1000
GROUP = "g"
HOLDERS = [Holder("a", "a1"), Holder("b", "b1"), Holder("c", "c1")]
TOPICS = {"alo": False, "amo": True}  # topic -> amo: how its writers claim it
PARTITIONS = (0, 1)
END = 80  # the partitions' end: offsets the writers pick from
STEPS = [0, 0, 1, 5, 20, 50, 120]
LEASE_MS = [30, 100, 250]
WRITER = {"v": 1, "group": GROUP, "client": "w", "instance": "w1"}

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

RANGE_GARBAGE = st.sampled_from(
    [
        b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo","lease_ms":0,'
        b'"ranges":[{"partition":0,"offset":0,"end":10}]}',
        b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo","lease_ms":100,'
        b'"ranges":[]}',
        b'{"v":1,"type":"ack_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
        b'"ranges":[{"partition":0,"offset":0,"end":10,"failed":[-1]}]}',
        b'{"v":1,"type":"renew_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
        b'"ranges":[{"partition":0,"offset":0,"end":10}]}',
        b'{"v":1,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
        b'"ranges":[{"partition":0,"end":10}]}',
        b'{"v":2,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
        b'"ranges":[{"partition":0,"offset":0,"end":10}]}',
    ]
)


# ----------------------------------------------------------------------------------------- generation


def leases_of(guide: WorldState, topic: str) -> list[tuple[int, int, int, Holder]]:
    found = []
    for partition in PARTITIONS:
        shared = guide.shared_partition(topic, partition)
        if shared is not None:
            found += [(partition, lease.start, lease.end, lease.holder) for lease in shared.leases.values()]
    return sorted(found)


def range_entry(draw: st.DrawFn, guide: WorldState, topic: str, holder: Holder, now: int) -> tuple[int, int, int]:
    """(partition, offset, end): mostly a lease of the writer (renew, ack, cancel) or a free range (claim)."""
    choice = draw(st.integers(0, 9))
    if choice < 7:
        leases = leases_of(guide, topic)
        mine = [lease for lease in leases if lease[3] == holder]
        pool = mine if mine and choice < 6 else leases
        if pool:
            partition, start, end, _ = draw(st.sampled_from(pool))
            return partition, start, end
    partition = draw(st.sampled_from(PARTITIONS))
    start = draw(st.integers(0, END))
    return partition, start, max(start + draw(st.integers(-1, 12)), 0)


def claim_entry(draw: st.DrawFn, guide: WorldState, topic: str, now: int) -> tuple[int, int, int]:
    partition = draw(st.sampled_from(PARTITIONS))
    shared = guide.shared_partition(topic, partition)
    if shared is not None and draw(st.integers(0, 3)) > 0:
        free = list(shared.free_ranges(now, END, draw(st.sampled_from([1, 5, 10])), 4))
        if free:
            return (partition, *draw(st.sampled_from(free)))
    start = draw(st.integers(0, END))
    return partition, start, max(start + draw(st.integers(-1, 12)), 0)


def offsets_of(draw: st.DrawFn, start: int, end: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """failed and dead subsets of [start, end): strictly increasing and disjoint, now and then not."""
    span = list(range(start, end)) or [start]
    failed = sorted(draw(st.sets(st.sampled_from(span), max_size=3)))
    dead = sorted(draw(st.sets(st.sampled_from(span), max_size=2)) - set(failed))
    spoil = draw(st.integers(0, 15))
    if spoil == 0 and len(failed) >= 2:
        failed.reverse()
    elif spoil == 1 and failed:
        dead = sorted(set(dead) | {failed[0]})
    elif spoil == 2:
        failed.append(end)
    return tuple(failed), tuple(dead)


@st.composite
def range_logs(draw: st.DrawFn, max_size: int = 50) -> list[codec.Record]:
    """A log of three members racing for ranges; a guide state (the fold itself) shows them what is free."""
    guide = WorldState(GROUP, HB)
    now = draw(st.sampled_from([0, 1000]))
    records: list[codec.Record] = []
    for _ in range(draw(st.integers(1, max_size))):
        now += draw(st.sampled_from(STEPS))
        holder = draw(st.sampled_from(HOLDERS))
        common = {"v": 1, "ts": now, "group": GROUP, "client": holder.client, "instance": holder.instance}
        kind = draw(st.sampled_from(["claim"] * 5 + ["renew"] * 2 + ["ack"] * 4 + ["cancel", "pause"]))
        topic = draw(st.sampled_from(sorted(TOPICS)))
        count = draw(st.integers(1, 3))
        record: codec.Record
        if kind == "pause":
            record = codec.ReleaseGroup(**common, expires=now + draw(st.sampled_from([0, 40, 150])))
        elif kind == "claim":
            entries = [claim_entry(draw, guide, topic, now) for _ in range(count)]
            record = codec.ClaimRanges(
                **common, topic=topic, lease_ms=draw(st.sampled_from(LEASE_MS)), amo=TOPICS[topic],
                ranges=tuple(codec.RangeEntry(partition=p, offset=s, end=e) for p, s, e in entries),
            )  # fmt: skip
        else:
            entries = [range_entry(draw, guide, topic, holder, now) for _ in range(count)]
            plain = tuple(codec.RangeEntry(partition=p, offset=s, end=e) for p, s, e in entries)
            if kind == "renew":
                record = codec.RenewRanges(**common, topic=topic, lease_ms=draw(st.sampled_from(LEASE_MS)), ranges=plain)
            elif kind == "cancel":
                record = codec.CancelRanges(**common, topic=topic, ranges=plain)
            else:
                acks = []
                for p, s, e in entries:
                    failed, dead = offsets_of(draw, s, e)
                    acks.append(codec.AckEntry(partition=p, offset=s, end=e, failed=failed, dead=dead))
                record = codec.AckRanges(**common, topic=topic, ranges=tuple(acks))
        guide.apply(record, now)
        records.append(record)
    return records


# ------------------------------------------------------------------------------------- reference model


@dataclass
class Model:
    """One shared partition, offset by offset."""

    first: int | None = None  # where the first accepted claim started: the offsets below are not the group's
    low: int | None = None
    done: set[int] = field(default_factory=set)  # acked as done, or lost (AMO), at or above ``first``
    gone: set[int] = field(default_factory=set)  # acked by an AMO lease, or in one that lapsed or failed
    leases: dict[int, tuple[int, Holder, int, bool]] = field(default_factory=dict)  # start -> end, holder, expires, amo
    tries: dict[int, int] = field(default_factory=dict)
    acked: int = 0
    dead: int = 0
    lost: int = 0
    lapsed: int = 0

    def is_done(self, offset: int) -> bool:
        return self.first is not None and (offset < self.first or offset in self.done)

    def mark_done(self, offset: int) -> None:
        self.done.add(offset)
        self.tries.pop(offset, None)
        assert self.low is not None
        while self.low in self.done:
            self.low += 1

    def lapse(self, at: int) -> None:
        for start, (end, _, expires, amo) in sorted(self.leases.items()):
            if expires <= at:
                del self.leases[start]
                self.lapsed += 1
                for offset in range(start, end):
                    if amo:
                        self.lost += 1
                        self.gone.add(offset)
                        self.mark_done(offset)
                    else:
                        self.tries[offset] = self.tries.get(offset, 0) + 1

    def claim(self, start: int, end: int, holder: Holder, at: int, lease_ms: int, amo: bool) -> bool:
        if not (start < end and end - start <= MAX_RANGE):
            return False
        self.lapse(at)
        if self.low is None:
            self.first = self.low = start
        elif start < self.low or end > self.low + MAX_WINDOW or any(self.is_done(o) for o in range(start, end)):
            return False
        if any(s < end and start < e for s, (e, *_) in self.leases.items()):
            return False
        self.leases[start] = (end, holder, at + lease_ms, amo)
        return True

    def held(self, start: int, end: int, holder: Holder, at: int) -> bool:
        self.lapse(at)
        lease = self.leases.get(start)
        return lease is not None and lease[0] == end and lease[1] == holder

    def renew(self, start: int, end: int, holder: Holder, at: int, lease_ms: int) -> bool:
        if not self.held(start, end, holder, at):
            return False
        _, _, expires, amo = self.leases[start]
        self.leases[start] = (end, holder, max(expires, at + lease_ms), amo)
        return True

    def ack(self, start: int, end: int, holder: Holder, at: int, failed: tuple[int, ...], dead: tuple[int, ...]) -> bool:
        # The holder settles its lease from its start up to ``end`` (a prefix, or all of it); the rest goes back.
        self.lapse(at)
        lease = self.leases.get(start)
        if lease is None or lease[1] != holder or not start < end <= lease[0]:
            return False
        for offsets in (failed, dead):
            if list(offsets) != sorted(set(offsets)) or any(not start <= o < end for o in offsets):
                return False
        if set(failed) & set(dead):
            return False
        amo = self.leases.pop(start)[3]
        self.dead += len(dead)
        self.acked += end - start - len(failed)
        for offset in range(start, end):
            if amo:
                self.gone.add(offset)
                if offset in failed:
                    self.lost += 1
                self.mark_done(offset)
            elif offset in failed:
                self.tries[offset] = self.tries.get(offset, 0) + 1
            else:
                self.mark_done(offset)
        return True

    def cancel(self, start: int, end: int, holder: Holder, at: int) -> bool:
        if not self.held(start, end, holder, at):
            return False
        del self.leases[start]
        return True


def model_verdicts(models: dict[tuple[str, int], Model], record: codec.Record, paused: bool) -> list[bool]:
    holder = Holder(record.client, record.instance)
    at = record.ts
    verdicts = []
    for entry in record.ranges:  # type: ignore[union-attr]
        key = (record.topic, entry.partition)  # type: ignore[union-attr]
        if isinstance(record, codec.ClaimRanges):
            if paused:
                verdicts.append(False)
                continue
            model = models.setdefault(key, Model())
            verdicts.append(model.claim(entry.offset, entry.end, holder, at, record.lease_ms, record.amo))
            continue
        model = models.get(key)  # type: ignore[assignment]
        if model is None or (paused and isinstance(record, codec.RenewRanges)):
            verdicts.append(False)
        elif isinstance(record, codec.RenewRanges):
            verdicts.append(model.renew(entry.offset, entry.end, holder, at, record.lease_ms))
        elif isinstance(record, codec.AckRanges):
            verdicts.append(model.ack(entry.offset, entry.end, holder, at, entry.failed, entry.dead))  # type: ignore[attr-defined]
        else:
            verdicts.append(model.cancel(entry.offset, entry.end, holder, at))
    return verdicts


def check(state: WorldState, models: dict[tuple[str, int], Model], at: int) -> None:
    assert set(state.shared) == set(models)
    for key, model in models.items():
        shared = state.shared[key]
        # No offset has two live holders: the leases (live or lapsed but not yet folded) never overlap.
        spans = sorted((lease.start, lease.end) for lease in shared.leases.values())
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        # low never passes an offset that is not done (by the model's own account of acks and lapses).
        if model.first is not None:
            assert shared.low is not None and all(o in model.done for o in range(model.first, shared.low))
        # The state is the model's, offset by offset.
        assert shared.low == model.low
        assert {s: (lease.end, lease.holder, lease.expires, lease.amo) for s, lease in shared.leases.items()} == model.leases
        assert {o: t.count for t in shared.tries for o in range(t.start, t.end)} == model.tries
        assert (shared.acked, shared.dead_letters, shared.lost, shared.lapsed) == (
            model.acked, model.dead, model.lost, model.lapsed,
        )  # fmt: skip
        for offset in range(0, END + 15):
            assert shared.is_done(offset) == model.is_done(offset), offset
        assert model.gone <= {o for o in model.gone if model.is_done(o)}
        # Its shapes: done ranges sorted and apart, above low; tries sorted and disjoint.
        assert all(a[1] < b[0] for a, b in zip(shared.done, shared.done[1:]))
        assert not shared.done or shared.low is not None and shared.done[0][0] > shared.low
        assert all(t.start < t.end and t.count >= 1 for t in shared.tries)
        assert all(a.end <= b.start for a, b in zip(shared.tries, shared.tries[1:]))
        # What free_ranges offers at `at` is what a claim at `at` would get, one try count per range.
        for start, end in list(shared.free_ranges(at, END, 10, 3)):
            counts = {t.count for t in shared.tries_in(start, end, now=at)}
            assert len(counts) <= 1
            trial = copy.deepcopy(shared)
            assert trial.claim(start, end, HOLDERS[0], at, 100, False)
            assert {t.count for t in trial.tries_in(start, end)} == counts
            if counts:
                assert sum(t.end - t.start for t in trial.tries_in(start, end)) == end - start


def fold_all(records: list[codec.Record], state: WorldState | None = None) -> WorldState:
    state = state or WorldState(GROUP, HB)
    for record in records:
        state.apply(record, record.ts)
    return state


# ------------------------------------------------------------------------------------------ properties


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(range_logs())
def test_every_step_follows_the_rules_and_keeps_the_invariants(log: list[codec.Record]) -> None:
    """At every prefix: verdicts and state as the per-offset model says, no offset with two live holders,
    low never past an offset not done, and nothing done or gone (AMO) in an accepted claim."""
    state = WorldState(GROUP, HB)
    models: dict[tuple[str, int], Model] = {}
    pause_until: int | None = None
    for record in log:
        at = record.ts
        if isinstance(record, codec.ReleaseGroup):
            assert state.apply(record, at)
            pause_until = record.expires
            continue
        gone_before = {key: set(model.gone) for key, model in models.items()}
        done_before = {key: {o for o in range(END + 15) if model.is_done(o)} for key, model in models.items()}
        expected = model_verdicts(models, record, pause_until is not None and at < pause_until)
        verdicts = state.apply(codec.decode(codec.encode(record)), at)
        assert list(verdicts) == expected, record  # type: ignore[call-overload]
        if isinstance(record, codec.ClaimRanges):
            for entry, accepted in zip(record.ranges, verdicts):  # type: ignore[call-overload]
                key = (record.topic, entry.partition)
                if accepted:
                    offsets = set(range(entry.offset, entry.end))
                    assert not offsets & models[key].gone
                    assert not offsets & gone_before.get(key, set()) and not offsets & done_before.get(key, set())
        check(state, models, at)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(range_logs())
def test_folding_the_same_log_twice_gives_equal_states(log: list[codec.Record]) -> None:
    first, second = fold_all(log), fold_all(log)
    assert first == second and first.shared == second.shared
    assert fold([Entry(r, r.ts) for r in log], WorldState(GROUP, HB)) == first


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    range_logs(),
    st.lists(st.one_of(garbage_values, RANGE_GARBAGE), min_size=1, max_size=20),
    st.randoms(use_true_random=False),
)
def test_interleaved_garbage_changes_nothing(log: list[codec.Record], garbage: list[bytes], rnd: random.Random) -> None:
    values: list[bytes | None] = [codec.encode(r) for r in log]
    for value in garbage:
        values.insert(rnd.randint(0, len(values)), value)
    values.insert(rnd.randint(0, len(values)), None)
    state = WorldState(GROUP, HB)
    for value in values:
        before = copy.deepcopy(state)
        try:
            state.apply_value(value)
        except DecodeError:
            assert state.shared == before.shared and state.pauses == before.pauses
            assert state.stats.garbage == before.stats.garbage + 1
    clean = fold_all(log)
    assert state.shared == clean.shared and state.pauses == clean.pauses
    assert state.stats.garbage == len(garbage) + 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(range_logs(), st.data())
def test_a_reader_seeded_from_a_checkpoint_agrees_with_one_that_read_everything(
    log: list[codec.Record], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(log)))
    per_record = data.draw(st.sampled_from([1, 10, 1000]))
    ts = log[cut - 1].ts if cut else 0
    written = checkpoints.state_records(fold_all(log[:cut]), 0, cut, WRITER | {"ts": ts}, per_record)
    assembler = checkpoints.Assembler()
    for part in written:
        assembler.add(codec.decode(codec.encode(part)))  # type: ignore[arg-type]
    assert assembler.latest is not None
    started = WorldState(GROUP, HB)
    checkpoints.seed(started, assembler.latest, 0)
    assert started.shared == fold_all(log[:cut]).shared
    everything = fold_all(log)
    seeded = fold_all(log[cut:], started)
    assert seeded.shared == everything.shared
    assert seeded.pauses == everything.pauses


def test_the_reference_model_and_the_fold_agree_on_a_hand_written_log() -> None:
    """A sanity check of the model itself, so a property that passes is not two copies of one mistake."""
    model, shared = Model(), SharedPartition()
    a, b = HOLDERS[0], HOLDERS[1]
    steps = [
        ("claim", 0, 10, a, 0, 100, False),
        ("claim", 10, 20, b, 0, 100, False),
        ("ack", 0, 10, a, 50, (3,), (5,)),
        ("claim", 3, 4, b, 60, 100, False),
        ("renew", 10, 20, b, 90, 100),
        ("cancel", 3, 4, b, 100),
        ("claim", 3, 4, a, 110, 100, False),
    ]
    for name, *args in steps:
        assert getattr(model, name)(*args) == getattr(shared, name)(*args)
    assert model.low == shared.low == 3 and model.tries == {3: 1} and model.done == {0, 1, 2, *range(4, 10)}
    assert not model.claim(10, 12, a, 150, 100, False) and model.claim(10, 20, a, 190, 100, False)
    assert model.tries == {3: 1, **{o: 1 for o in range(10, 20)}}
