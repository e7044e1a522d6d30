"""Properties of the range-lease fold (docs/shared-partitions.md) over generated logs of racing holders (hypothesis).

The logs are what three members of a group write about two shared topics, one at-least-once and one
at-most-once (a topic is one mode): claims (mostly of ranges the log shows free), renewals, acks with
failed and dead offsets (now and then of a prefix, or listing offsets a client acked as failed), cancels
(mostly by a holder of its lease, sometimes of someone else's or of a range that is not a lease), and
pauses, while time moves forward in random steps so leases lapse.
They also hold the Read / Ack / Cancel service's per-message records: hand-outs
(deliver_messages, mostly by a lease's holder of offsets it may hand out, sometimes by another writer
or of offsets outside any lease) and clients' acks and cancels (by any writer, mostly of pending
offsets, sometimes of offsets whose deadline passed, acked ones or random ones), with pending times
of the order of the time steps so deadlines pass.
They also hold the holders' progress inside their leases (progress_ranges, mostly by
the holder of a live lease up to somewhere in it, with failed and dead offsets, now and then by another
writer or of a range that is not a lease).
A per-offset reference model, kept apart from range_leases, checks every verdict and state.
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples
from test_world_state_properties import garbage_values

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import MAX_RANGE, MAX_WINDOW, Lease, SharedPartition
from marshal_workers.protocol.world_state import Entry, WorldState, fold

HB = 1000
GROUP = "g"
HOLDERS = [MemberId("a", "a1"), MemberId("b", "b1"), MemberId("c", "c1")]
TOPICS = {"alo": False, "amo": True}  # topic -> amo: how its writers claim it
PARTITIONS = (0, 1)
END = 80  # the partitions' end: offsets the writers pick from
STEPS = [0, 0, 1, 5, 20, 50, 120]
LEASE_MS = [30, 100, 250]
PENDING_MS = [1, 20, 60, 150, 400]  # against STEPS and LEASE_MS: deadlines pass, some before their lease lapses
OTHER_INSTANCE = MemberId("a", "a2")  # the client of a holder, another instance: never a holder itself
WRITER = {"v": 1, "group": GROUP, "client": "w", "instance": "w1"}

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

RANGE_GARBAGE = st.sampled_from(
    [
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo","lease_ms":0,'
            b'"ranges":[{"partition":0,"offset":0,"end":10}]}'
        ),
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo","lease_ms":100,'
            b'"ranges":[]}'
        ),
        (
            b'{"v":1,"type":"ack_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"offset":0,"end":10,"failed":[-1]}]}'
        ),
        (
            b'{"v":1,"type":"renew_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"offset":0,"end":10}]}'
        ),
        (
            b'{"v":1,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"end":10}]}'
        ),
        (
            b'{"v":2,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"offset":0,"end":10}]}'
        ),
        (
            b'{"v":1,"type":"deliver_messages","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"pending_ms":0,"messages":[[0,3]]}'
        ),
        (
            b'{"v":1,"type":"deliver_messages","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"messages":[[0,3]]}'
        ),
        (
            b'{"v":1,"type":"deliver_messages","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"pending_ms":100,"messages":[]}'
        ),
        (
            b'{"v":1,"type":"ack_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"alo",'
            b'"messages":[{"partition":0,"offset":3}]}'
        ),
        (
            b'{"v":1,"type":"ack_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"alo",'
            b'"messages":[[0]]}'
        ),
        (
            b'{"v":1,"type":"cancel_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"alo",'
            b'"messages":[[0,-1]]}'
        ),
        (
            b'{"v":1,"type":"cancel_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"alo",'
            b'"messages":[0,3]}'
        ),
        (
            b'{"v":1,"type":"progress_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"offset":0,"end":10,"failed":[-1]}]}'
        ),
        (b'{"v":1,"type":"progress_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo","ranges":[]}'),
        (
            b'{"v":1,"type":"progress_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"alo",'
            b'"ranges":[{"partition":0,"offset":0}]}'
        ),
    ]
)


# ----------------------------------------------------------------------------------------- generation


def leases_of(guide: WorldState, topic: str) -> list[tuple[int, int, int, MemberId]]:
    found = []
    for partition in PARTITIONS:
        shared = guide.shared_partition(topic, partition)
        if shared is not None:
            found += [(partition, lease.start, lease.end, lease.holder) for lease in shared.leases.values()]
    return sorted(found)


def range_entry(draw: st.DrawFn, guide: WorldState, topic: str, holder: MemberId, now: int) -> tuple[int, int, int]:
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


def leases_live(guide: WorldState, topic: str, now: int, every: bool = False) -> list[tuple[int, Lease]]:
    """(partition, lease) of the topic's leases live at ``now`` (or all those the fold holds, if ``every``)."""
    found = []
    for partition in PARTITIONS:
        shared = guide.shared_partition(topic, partition)
        if shared is not None:
            found += [(partition, lease) for lease in shared.leases.values() if every or lease.expires > now]
    return sorted(found, key=lambda found: (found[0], found[1].start))


def free_to_hand_out(lease: Lease, now: int) -> list[int]:
    """The offsets of a live lease its holder may hand out at ``now``: not acked or marked done, not pending."""
    return [
        o for o in range(lease.start, lease.end) if not lease.is_settled(o) and lease.handed.get(o, (0, 0))[0] <= now
    ]


def holder_writer(draw: st.DrawFn, guide: WorldState, topic: str, now: int, others: list[MemberId]) -> MemberId:
    """Mostly the holder of a live lease of the topic (renewals, acks, cancels and hand-outs are the holder's);
    else one of ``others``."""
    holders = sorted({lease.holder for _, lease in leases_live(guide, topic, now)})
    if holders and draw(st.integers(0, 9)) < 8:
        return draw(st.sampled_from(holders))
    return draw(st.sampled_from(others))


def pending_of(guide: WorldState, topic: str, now: int) -> list[tuple[int, int]]:
    """(partition, offset) pending with a client at ``now``, as the fold shows them."""
    return [
        (p, o)
        for p, lease in leases_live(guide, topic, now)
        for o, (deadline, _) in sorted(lease.handed.items())
        if deadline > now and o not in lease.acked
    ]


def deliver_entry(draw: st.DrawFn, guide: WorldState, topic: str, holder: MemberId, now: int) -> tuple[int, int]:
    """(partition, offset): mostly one the writer may hand out, sometimes one of its lease that it may not (acked,
    pending), one of another holder's lease, or one outside every lease."""
    live = leases_live(guide, topic, now)
    mine = [(p, lease) for p, lease in live if lease.holder == holder]
    choice = draw(st.integers(0, 9))
    if choice < 8 and mine:
        partition, lease = draw(st.sampled_from(mine))
        free = free_to_hand_out(lease, now)
        again = [o for o in free if o in lease.handed]  # handed out before: cancelled, or its deadline passed
        if again and choice < 3:
            return partition, draw(st.sampled_from(again))
        if free and choice < 6:
            return partition, draw(st.sampled_from(free))
        return partition, draw(st.integers(lease.start, lease.end - 1))
    if choice < 9 and live:
        partition, lease = draw(st.sampled_from(live))
        return partition, draw(st.integers(lease.start, lease.end - 1))
    return draw(st.sampled_from(PARTITIONS)), draw(st.integers(0, END))


def settle_entry(draw: st.DrawFn, guide: WorldState, topic: str, now: int) -> tuple[int, int]:
    """(partition, offset) a client acks or cancels: mostly a pending one, sometimes one handed out before (its
    deadline passed, acked already, its lease lapsed) or any offset."""
    choice = draw(st.integers(0, 9))
    if choice < 7:
        pending = pending_of(guide, topic, now)
        if pending:
            return draw(st.sampled_from(pending))
    if choice < 9:
        handed = [(p, o) for p, lease in leases_live(guide, topic, now, every=True) for o in sorted(lease.handed)]
        if handed:
            return draw(st.sampled_from(handed))
    return draw(st.sampled_from(PARTITIONS)), draw(st.integers(0, END))


KINDS = [
    *["claim"] * 5,
    *["renew"] * 2,
    *["ack"] * 3,
    "cancel",
    "pause",
    *["deliver"] * 4,
    *["client_ack"] * 3,
    *["client_cancel"] * 2,
    *["progress"] * 3,
]


@st.composite
def range_logs(draw: st.DrawFn, max_size: int = 50) -> list[codec.Record]:
    """A log of three members racing for ranges and handing their offsets to clients; a guide state (the fold
    itself) shows them what is free, what they may hand out and what is pending."""
    guide = WorldState(GROUP, HB)
    now = draw(st.sampled_from([0, 1000]))
    records: list[codec.Record] = []
    for _ in range(draw(st.integers(1, max_size))):
        now += draw(st.sampled_from(STEPS))
        kind = draw(st.sampled_from(KINDS))
        topics = sorted(TOPICS)
        if kind in ("client_ack", "client_cancel") and not any(pending_of(guide, t, now) for t in topics):
            kind = draw(st.sampled_from([kind, "deliver", "deliver"]))  # clients answer what was handed out
        if kind in ("client_ack", "client_cancel"):  # mostly a topic with something pending
            topics = [t for t in topics if pending_of(guide, t, now)] or topics
        elif kind != "claim":  # mostly a topic with a live lease
            topics = [t for t in topics if leases_live(guide, t, now)] or topics
        topic = draw(st.sampled_from(sorted(TOPICS) if draw(st.integers(0, 9)) == 0 else topics))
        if kind == "deliver":  # sometimes not the holder: another, or the other instance of its client
            holder = holder_writer(draw, guide, topic, now, [*HOLDERS, OTHER_INSTANCE])
        elif kind in ("renew", "ack", "cancel", "progress"):
            holder = holder_writer(draw, guide, topic, now, HOLDERS)
        else:
            holder = draw(st.sampled_from(HOLDERS))
        common = {"v": 1, "ts": now, "group": GROUP, "client": holder.client, "instance": holder.instance}
        count = draw(st.integers(1, 3))
        record: codec.Record
        if kind == "pause":
            record = codec.ReleaseGroup(**common, expires=now + draw(st.sampled_from([0, 40, 150])))
        elif kind == "claim":
            entries = [claim_entry(draw, guide, topic, now) for _ in range(count)]
            record = codec.ClaimRanges(
                **common,
                topic=topic,
                lease_ms=draw(st.sampled_from(LEASE_MS)),
                amo=TOPICS[topic],
                ranges=tuple(codec.RangeEntry(partition=p, offset=s, end=e) for p, s, e in entries),
            )
        elif kind == "deliver":
            messages = tuple(codec.MessageEntry(*deliver_entry(draw, guide, topic, holder, now)) for _ in range(count))
            record = codec.DeliverMessages(
                **common, topic=topic, pending_ms=draw(st.sampled_from(PENDING_MS)), messages=messages
            )
        elif kind in ("client_ack", "client_cancel"):
            messages = tuple(codec.MessageEntry(*settle_entry(draw, guide, topic, now)) for _ in range(count))
            kind_of = codec.AckMessages if kind == "client_ack" else codec.CancelMessages
            record = kind_of(**common, topic=topic, messages=messages)
        else:
            entries = [range_entry(draw, guide, topic, holder, now) for _ in range(count)]
            plain = tuple(codec.RangeEntry(partition=p, offset=s, end=e) for p, s, e in entries)
            if kind == "renew":
                record = codec.RenewRanges(
                    **common, topic=topic, lease_ms=draw(st.sampled_from(LEASE_MS)), ranges=plain
                )
            elif kind == "progress":
                marks = []
                for p, s, e in entries:
                    if e > s + 1 and draw(st.integers(0, 2)) > 0:
                        e = draw(st.integers(s + 1, e))  # somewhere inside the lease: the worker is not done
                    elif draw(st.integers(0, 9)) == 0:
                        e += draw(st.integers(1, 3))  # past the lease's end: refused
                    failed, dead = offsets_of(draw, s, e)
                    marks.append(codec.ProgressEntry(partition=p, offset=s, end=e, failed=failed, dead=dead))
                record = codec.ProgressRanges(**common, topic=topic, ranges=tuple(marks))
            elif kind == "cancel":
                record = codec.CancelRanges(**common, topic=topic, ranges=plain)
            else:
                acks = []
                for p, s, e in entries:
                    if e > s + 1 and draw(st.integers(0, 3)) == 0:
                        e = draw(st.integers(s + 1, e - 1))  # a prefix: the rest goes back untried
                    failed, dead = offsets_of(draw, s, e)
                    shared = guide.shared_partition(topic, p)
                    lease = shared.leases.get(s) if shared is not None else None
                    acked = sorted(o for o in lease.acked if s <= o < e and o not in dead) if lease is not None else []
                    if acked and failed == tuple(sorted(set(failed))) and draw(st.booleans()):
                        failed = tuple(sorted({*failed, draw(st.sampled_from(acked))}))  # a client acked it: done
                    acks.append(codec.AckEntry(partition=p, offset=s, end=e, failed=failed, dead=dead))
                record = codec.AckRanges(**common, topic=topic, ranges=tuple(acks))
        guide.apply(record, now)
        records.append(record)
    return records


# ------------------------------------------------------------------------------------- reference model


@dataclass
class ModelLease:
    end: int
    holder: MemberId
    expires: int
    amo: bool
    handouts: dict[int, list[int]] = field(default_factory=dict)  # offset -> the pending deadline of each hand-out
    acked: set[int] = field(default_factory=set)  # offsets a client acked
    marked: set[int] = field(default_factory=set)  # offsets the holder's progress marked done (0.8.0)
    marked_dead: set[int] = field(default_factory=set)  # of those, the ones it dead-lettered

    def settled(self, offset: int) -> bool:
        """Done however the lease ends: acked by a client or marked by the holder."""
        return offset in self.acked or offset in self.marked

    def pending(self, offset: int, at: int) -> bool:
        deadlines = self.handouts.get(offset)
        return bool(deadlines) and deadlines[-1] > at  # type: ignore[index]


@dataclass
class Model:
    """One shared partition, offset by offset."""

    first: int | None = None  # where the first accepted claim started: the offsets below are not the group's
    low: int | None = None
    done: set[int] = field(default_factory=set)  # acked as done, or lost (AMO), at or above ``first``
    gone: set[int] = field(default_factory=set)  # acked by an AMO lease, or in one that lapsed or failed
    leases: dict[int, ModelLease] = field(default_factory=dict)  # by start
    tries: dict[int, int] = field(default_factory=dict)
    acked: int = 0
    dead: int = 0
    lost: int = 0
    lapsed: int = 0
    client_acked: set[int] = field(default_factory=set)  # every offset a client's ack was accepted for
    ever_marked: set[int] = field(default_factory=set)  # every offset an accepted progress entry marked done

    def is_done(self, offset: int) -> bool:
        return self.first is not None and (offset < self.first or offset in self.done)

    def mark_done(self, offset: int) -> None:
        assert offset not in self.done, f"offset {offset} done twice"
        self.done.add(offset)
        self.tries.pop(offset, None)
        assert self.low is not None
        while self.low in self.done:
            self.low += 1

    def settled(self, offset: int, amo: bool) -> None:
        """Handled: done, counted acked."""
        self.acked += 1
        if amo:
            self.gone.add(offset)
        self.mark_done(offset)

    def given_back(self, offset: int, amo: bool) -> None:
        """Tried without being done: one try more, or (at most once) done and lost."""
        if amo:
            self.lost += 1
            self.gone.add(offset)
            self.mark_done(offset)
        else:
            self.tries[offset] = self.tries.get(offset, 0) + 1

    def end_lease(self, start: int) -> ModelLease:
        """However a lease ends, what clients acked and what its holder marked is done and counted acked (the
        marked dead letters counted too)."""
        lease = self.leases.pop(start)
        for offset in sorted(lease.acked | lease.marked):
            self.settled(offset, lease.amo)
        self.dead += len(lease.marked_dead)
        return lease

    def lapse(self, at: int) -> None:
        for start in sorted(self.leases):
            if self.leases[start].expires <= at:
                lease = self.end_lease(start)
                self.lapsed += 1
                for offset in range(start, lease.end):
                    if not lease.settled(offset):
                        self.given_back(offset, lease.amo)

    def claim(self, start: int, end: int, holder: MemberId, at: int, lease_ms: int, amo: bool) -> bool:
        if not (start < end and end - start <= MAX_RANGE):
            return False
        self.lapse(at)
        if self.low is None:
            self.first = self.low = start
        elif start < self.low or end > self.low + MAX_WINDOW or any(self.is_done(o) for o in range(start, end)):
            return False
        if any(s < end and start < lease.end for s, lease in self.leases.items()):
            return False
        self.leases[start] = ModelLease(end, holder, at + lease_ms, amo)
        return True

    def held(self, start: int, end: int, holder: MemberId, at: int) -> bool:
        self.lapse(at)
        lease = self.leases.get(start)
        return lease is not None and lease.end == end and lease.holder == holder

    def renew(self, start: int, end: int, holder: MemberId, at: int, lease_ms: int) -> bool:
        if not self.held(start, end, holder, at):
            return False
        lease = self.leases[start]
        lease.expires = max(lease.expires, at + lease_ms)
        return True

    def reported_on(
        self, start: int, end: int, holder: MemberId, at: int, failed: tuple[int, ...], dead: tuple[int, ...]
    ) -> ModelLease | None:
        # The holder's live lease at ``start``, if its report on [start, end) is well formed (offsets inside, sorted,
        # failed and dead apart); else None.
        self.lapse(at)
        lease = self.leases.get(start)
        if lease is None or lease.holder != holder or not start < end <= lease.end:
            return None
        for offsets in (failed, dead):
            if list(offsets) != sorted(set(offsets)) or any(not start <= o < end for o in offsets):
                return None
        if set(failed) & set(dead):
            return None
        return lease

    def ack(
        self, start: int, end: int, holder: MemberId, at: int, failed: tuple[int, ...], dead: tuple[int, ...]
    ) -> bool:
        # The holder settles its lease from its start up to ``end`` (a prefix, or all of it); the rest goes back
        # untried, except what clients acked (done whatever ``failed`` says, counted acked once) and what was handed
        # to a client and not acked (tried).
        lease = self.reported_on(start, end, holder, at, failed, dead)
        if lease is None:
            return False
        self.end_lease(start)
        self.dead += len(set(dead) - lease.marked_dead)
        for offset in range(start, end):
            if lease.settled(offset):
                continue
            if offset in failed:
                self.given_back(offset, lease.amo)
            else:
                self.settled(offset, lease.amo)
        for offset in sorted(lease.handouts):  # handed out past ``end``, not acked: tried, as by a cancel
            if offset >= end and not lease.settled(offset):
                self.given_back(offset, lease.amo)
        return True

    def progress(
        self, start: int, end: int, holder: MemberId, at: int, failed: tuple[int, ...], dead: tuple[int, ...]
    ) -> bool:
        # The holder marks [start, end) but failed as done inside its live lease; nothing is settled until it ends.
        lease = self.reported_on(start, end, holder, at, failed, dead)
        if lease is None:
            return False
        marked = set(range(start, end)) - set(failed)
        lease.marked |= marked
        lease.marked_dead |= set(dead)
        self.ever_marked |= marked
        return True

    def cancel(self, start: int, end: int, holder: MemberId, at: int) -> bool:
        # Back untried, except what clients acked (done) and what was handed to a client and not acked (tried).
        if not self.held(start, end, holder, at):
            return False
        lease = self.end_lease(start)
        for offset in sorted(lease.handouts):
            if not lease.settled(offset):
                self.given_back(offset, lease.amo)
        return True

    def covering(self, offset: int, at: int) -> ModelLease | None:
        self.lapse(at)
        found = [lease for start, lease in self.leases.items() if start <= offset < lease.end]
        assert len(found) <= 1 and all(lease.expires > at for lease in found)
        return found[0] if found else None

    def deliver(self, offset: int, holder: MemberId, at: int, pending_ms: int) -> bool:
        lease = self.covering(offset, at)
        if lease is None or lease.holder != holder or lease.settled(offset) or lease.pending(offset, at):
            return False
        if lease.amo and offset in lease.handouts:
            return False  # at most once: one hand-out only
        lease.handouts.setdefault(offset, []).append(at + pending_ms)
        return True

    def ack_offset(self, offset: int, at: int) -> bool:
        lease = self.covering(offset, at)
        if lease is None or lease.settled(offset) or not lease.pending(offset, at):
            return False
        lease.acked.add(offset)
        self.client_acked.add(offset)
        return True

    def cancel_offset(self, offset: int, at: int) -> bool:
        lease = self.covering(offset, at)
        if lease is None or lease.settled(offset) or not lease.pending(offset, at):
            return False
        lease.handouts[offset][-1] = at
        return True


MESSAGE_RECORDS = (codec.DeliverMessages, codec.AckMessages, codec.CancelMessages)


def model_verdicts(models: dict[tuple[str, int], Model], record: codec.Record, paused: bool) -> list[bool]:
    holder = MemberId(record.client, record.instance)
    at = record.ts
    verdicts = []
    if isinstance(record, MESSAGE_RECORDS):  # one verdict per message; a pause does not stop them
        for message in record.messages:
            model = models.get((record.topic, message.partition))  # type: ignore[assignment]
            if model is None:
                verdicts.append(False)
            elif isinstance(record, codec.DeliverMessages):
                verdicts.append(model.deliver(message.offset, holder, at, record.pending_ms))
            elif isinstance(record, codec.AckMessages):
                verdicts.append(model.ack_offset(message.offset, at))
            else:
                verdicts.append(model.cancel_offset(message.offset, at))
        return verdicts
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
        elif isinstance(record, codec.ProgressRanges):
            verdicts.append(model.progress(entry.offset, entry.end, holder, at, entry.failed, entry.dead))  # type: ignore[attr-defined]
        else:
            verdicts.append(model.cancel(entry.offset, entry.end, holder, at))
    return verdicts


def pending_in(state: WorldState, at: int) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) the fold shows pending with a client at ``at``: handed out under a live lease,
    the deadline not passed, not acked."""
    return {
        (*key, offset)
        for key, shared in state.shared.items()
        for lease in shared.leases.values()
        if lease.expires > at
        for offset, (deadline, _) in lease.handed.items()
        if deadline > at and offset not in lease.acked
    }


def check(state: WorldState, models: dict[tuple[str, int], Model], at: int) -> None:
    assert set(state.shared) == set(models)
    for key, model in models.items():
        shared = state.shared[key]
        # No offset has two live holders: the leases (live or lapsed but not yet folded) never overlap.
        spans = sorted((lease.start, lease.end) for lease in shared.leases.values())
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
        # low never passes an offset that is not done (by the model's own account of acks and lapses).
        if model.first is not None:
            assert shared.low is not None and all(o in model.done for o in range(model.first, shared.low))
        # The state is the model's, offset by offset.
        assert shared.low == model.low
        assert {s: (lease.end, lease.holder, lease.expires, lease.amo) for s, lease in shared.leases.items()} == {
            s: (lease.end, lease.holder, lease.expires, lease.amo) for s, lease in model.leases.items()
        }
        # ... and so are the clients' messages of each lease: (pending deadline, hand-outs) and acks.
        assert {s: (lease.handed, lease.acked) for s, lease in shared.leases.items()} == {
            s: ({o: (times[-1], len(times)) for o, times in lease.handouts.items()}, lease.acked)
            for s, lease in model.leases.items()
        }
        # ... and the holder's progress: the offsets marked done and their dead letters.
        assert {
            s: ({o for r in lease.progress for o in range(*r)}, lease.dead) for s, lease in shared.leases.items()
        } == {s: (lease.marked, lease.marked_dead) for s, lease in model.leases.items()}
        assert all(a[1] < b[0] for lease in shared.leases.values() for a, b in zip(lease.progress, lease.progress[1:]))
        # An offset a progress entry marked is done, or marked in the live lease that still holds it: never
        # claimable, handed out or tried again.
        for offset in model.ever_marked:
            assert shared.is_done(offset) or any(lease.is_settled(offset) for lease in shared.leases.values()), offset
        assert {o: t.count for t in shared.tries for o in range(t.start, t.end)} == model.tries
        assert (shared.acked, shared.dead_letters, shared.lost, shared.lapsed) == (
            model.acked,
            model.dead,
            model.lost,
            model.lapsed,
        )
        for offset in range(END + 15):
            assert shared.is_done(offset) == model.is_done(offset), offset
        assert model.gone <= {o for o in model.gone if model.is_done(o)}
        # An offset is never pending with two hand-outs at once (the model keeps every hand-out's deadline).
        for lease in model.leases.values():
            if lease.expires > at:
                assert all(sum(d > at for d in times) <= 1 for times in lease.handouts.values()), lease
        # An offset a client acked is done, or acked in the live lease that still holds it, so never claimable.
        for offset in model.client_acked:
            assert shared.is_done(offset) or any(offset in lease.acked for lease in shared.leases.values()), offset
        # Its shapes: done ranges sorted and apart, above low; tries sorted and disjoint.
        assert all(a[1] < b[0] for a, b in zip(shared.done, shared.done[1:]))
        assert not shared.done or shared.low is not None and shared.done[0][0] > shared.low
        assert all(t.start < t.end and t.count >= 1 for t in shared.tries)
        assert all(a.end <= b.start for a, b in zip(shared.tries, shared.tries[1:]))
        # Queries at a later time see the leases lapsed by then as the next record will (settling what clients
        # acked): what free_ranges offers and tries_in counts are the model's once it lapsed them too.
        for when in (at, max([at, *(lease.expires for lease in model.leases.values())])):
            view = copy.deepcopy(model)
            view.lapse(when)
            if view.low is not None:
                leased = {o for start, lease in view.leases.items() for o in range(start, lease.end)}
                expected = {o for o in range(view.low, END) if not view.is_done(o) and o not in leased}
                offered = {o for start, end in shared.free_ranges(when, END, END, END) for o in range(start, end)}
                assert offered == expected, when
            tries = {o: t.count for t in shared.tries_in(0, END + 15, now=when) for o in range(t.start, t.end)}
            assert tries == view.tries, when
        # What free_ranges offers at `at` is what a claim at `at` would get, one try count per range.
        for start, end in list(shared.free_ranges(at, END, 10, 3)):
            assert not model.client_acked & set(range(start, end)), (start, end)
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


@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(range_logs())
def test_every_step_follows_the_rules_and_keeps_the_invariants(log: list[codec.Record]) -> None:
    """At every prefix: verdicts and state as the per-offset model says, no offset with two live holders,
    low never past an offset not done, nothing done or gone (AMO) in an accepted claim, and no offset a client
    acked claimed or handed out again, nor handed out while it is pending."""
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
        client_acked_before = {key: set(model.client_acked) | model.ever_marked for key, model in models.items()}
        pending_before = pending_in(state, at)
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
                    assert not offsets & client_acked_before.get(key, set())
        elif isinstance(record, codec.DeliverMessages):
            accepted = zip(record.messages, verdicts)  # type: ignore[call-overload]
            handed = [(message.partition, message.offset) for message, ok in accepted if ok]
            assert len(handed) == len(set(handed))  # one record never hands one offset out twice
            for partition, offset in handed:
                assert (record.topic, partition, offset) not in pending_before
                assert offset not in client_acked_before.get((record.topic, partition), set())
        check(state, models, at)


@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(range_logs())
def test_folding_the_same_log_twice_gives_equal_states(log: list[codec.Record]) -> None:
    first, second = fold_all(log), fold_all(log)
    assert first == second and first.shared == second.shared
    assert fold([Entry(r, r.ts) for r in log], WorldState(GROUP, HB)) == first


@settings(
    max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
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


@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(range_logs(), st.data())
def test_a_reader_seeded_from_a_checkpoint_agrees_with_one_that_read_everything(
    log: list[codec.Record], data: st.DataObject
) -> None:
    # Half the time the cut is where a lease holds clients' messages or its holder's progress, so the checkpoint
    # carries them: client acks, progress or repeated hand-outs if the log has such a prefix, else hand-outs.
    state, handed, rich = WorldState(GROUP, HB), [], []
    for index, record in enumerate(log, 1):
        state.apply(record, record.ts)
        leases = [lease for shared in state.shared.values() for lease in shared.leases.values()]
        if any(lease.handed for lease in leases):
            handed.append(index)
        if any(
            lease.acked or lease.progress or any(count > 1 for _, count in lease.handed.values()) for lease in leases
        ):
            rich.append(index)
    if handed and data.draw(st.booleans()):
        cut = data.draw(st.sampled_from(rich or handed))
    else:
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


def test_the_reference_model_and_the_fold_agree_on_a_hand_written_log_of_messages() -> None:
    model, shared = Model(), SharedPartition()
    a, b = HOLDERS[0], HOLDERS[1]
    steps = [
        ("claim", 0, 10, a, 0, 100, False, True),
        ("deliver", 2, a, 10, 30, True),
        ("deliver", 3, a, 10, 30, True),
        ("deliver", 4, b, 10, 30, False),  # not b's lease
        ("deliver", 2, a, 20, 30, False),  # pending
        ("ack_offset", 2, 20, True),
        ("ack_offset", 2, 21, False),  # acked already
        ("cancel_offset", 3, 25, True),
        ("ack_offset", 3, 25, False),  # no longer pending
        ("deliver", 3, a, 25, 10, True),  # a second hand-out
        ("ack_offset", 3, 35, False),  # its deadline passed
        ("deliver", 2, a, 40, 10, False),  # acked: never handed out again
        ("deliver", 5, a, 40, 10, True),
        ("ack", 0, 6, a, 50, (2, 3), (), True),  # 2: a client acked it, done whatever failed says; 3 failed
        ("claim", 0, 10, b, 60, 100, False, False),  # 0, 1, 2, 4, 5 are done
    ]
    for name, *args, expected in steps:
        assert getattr(model, name)(*args) == getattr(shared, name)(*args) == expected, (name, args)
    assert model.acked == shared.acked == 5 and model.tries == {3: 1} and model.low == shared.low == 3
    assert model.is_done(2) and not model.is_done(6) and model.client_acked == {2}


@settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(range_logs(), st.data())
def test_progress_from_anyone_but_the_holder_changes_nothing(log: list[codec.Record], data: st.DataObject) -> None:
    """Another member, or another instance of the holder's client, cannot mark a lease's offsets done."""
    state = fold_all(log)
    at = log[-1].ts
    for shared in state.shared.values():
        shared.lapse(at)  # what the record's own time lapses anyway: the writer is judged by the live leases
    live = [
        (topic, partition, lease)
        for (topic, partition), shared in sorted(state.shared.items())
        for lease in shared.live_leases(at)
    ]
    if not live:
        return
    topic, partition, lease = data.draw(st.sampled_from(live))
    writer = data.draw(st.sampled_from([h for h in [*HOLDERS, OTHER_INSTANCE] if h != lease.holder]))
    end = data.draw(st.integers(lease.start + 1, lease.end))
    record = codec.ProgressRanges(
        v=1,
        ts=at,
        group=GROUP,
        client=writer.client,
        instance=writer.instance,
        topic=topic,
        ranges=(codec.ProgressEntry(partition=partition, offset=lease.start, end=end),),
    )
    before = copy.deepcopy(state.shared)
    assert list(state.apply(record, at)) == [False]  # type: ignore[call-overload]
    assert state.shared == before


@settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.integers(1, 200), st.data())
def test_a_lapse_after_progress_gives_back_only_what_was_not_marked(size: int, data: st.DataObject) -> None:
    """Whatever the holder marked in steps before its lease lapsed: exactly the unmarked offsets get one try more
    (at most once: are lost), the marked ones are done and counted acked once, and low stops at the first unmarked."""
    amo = data.draw(st.booleans())
    shared, holder = SharedPartition(), HOLDERS[0]
    assert shared.claim(100, 100 + size, holder, 0, 1000, amo)
    marked: set[int] = set()
    for at in range(1, data.draw(st.integers(1, 5)) + 1):
        end = data.draw(st.integers(101, 100 + size)) if size > 1 else 101
        failed = tuple(sorted(data.draw(st.sets(st.integers(100, end - 1), max_size=4))))
        assert shared.progress(100, end, holder, at, failed, ())
        marked |= set(range(100, end)) - set(failed)
    shared.lapse(1000)
    unmarked = set(range(100, 100 + size)) - marked
    assert shared.acked == len(marked)
    assert all(shared.is_done(o) for o in marked)
    if amo:
        assert shared.lost == len(unmarked) and shared.tries == []
    else:
        assert {o: t.count for t in shared.tries for o in range(t.start, t.end)} == {o: 1 for o in unmarked}
        assert shared.low == min(unmarked, default=100 + size)


def test_the_reference_model_and_the_fold_agree_on_a_hand_written_log_of_progress() -> None:
    model, shared = Model(), SharedPartition()
    a, b = HOLDERS[0], HOLDERS[1]
    steps = [
        ("claim", 0, 10, a, 0, 100, False, True),
        ("progress", 0, 4, a, 10, (2,), (3,), True),  # 0, 1, 3 done (3 dead-lettered), 2 failed
        ("progress", 0, 4, b, 11, (), (), False),  # not b's lease
        ("progress", 0, 11, a, 12, (), (), False),  # past the lease
        ("progress", 1, 4, a, 13, (), (), False),  # not the lease's start
        ("progress", 0, 6, a, 20, (2, 5), (), True),  # 4 done too; 2 and 5 not
        ("progress", 0, 2, a, 30, (0,), (), True),  # says less: takes nothing back
        ("deliver", 1, a, 31, 10, False),  # marked done: never handed out
        ("claim", 3, 5, b, 200, 100, False, False),  # a's lease lapsed: 3 and 4 were marked, so they are done
        ("claim", 2, 3, b, 200, 100, False, True),  # 2 came back, with a try
        ("claim", 5, 10, b, 200, 100, False, True),  # and 5..9
    ]
    for name, *args, expected in steps:
        assert getattr(model, name)(*args) == getattr(shared, name)(*args) == expected, (name, args)
    assert model.acked == shared.acked == 4 and model.dead == shared.dead_letters == 1
    assert model.low == shared.low == 2
    assert (
        model.tries
        == {o: t.count for t in shared.tries for o in range(t.start, t.end)}
        == {2: 1, **{o: 1 for o in range(5, 10)}}
    )
