"""The range-lease member (marshal_workers.protocol.range_member), in one process: its decisions folded into the
same fold every member reads (WorldState, range_leases.SharedPartition), no broker, no clock (hypothesis).

What a user relies on: a member never acts on a lease the log may have let lapse (another member may hold
those offsets), never asks for offsets someone else holds, and settles a range saying exactly which
offsets are done, so nothing is skipped and nothing done is delivered again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import MAX_LEASE_MS, SharedPartition
from marshal_workers.protocol.range_member import (
    RangeMember,
    WantedRange,
    crashed_entry,
    given_back_entry,
    handled_entry,
    safety_margin_ms,
    topic_backlog,
)
from marshal_workers.protocol.world_state import WorldState, per_entry

GROUP = "g"
TOPIC = "thumbs"
US = MemberId("us", "us-1")
OTHERS = [MemberId("a", "a-1"), MemberId("b", "b-1")]
END = 120  # the partitions' end in the generated logs


def fields(holder: MemberId, ts: int) -> dict[str, object]:
    return {"v": 1, "ts": ts, "group": GROUP, "client": holder.client, "instance": holder.instance}


@dataclass
class Held:
    """A lease as a caller keeps it."""

    partition: int
    start: int
    end: int
    deadline_ms: int


def fold(world: WorldState, record: codec.Record, at: int) -> list[bool]:
    return per_entry(world.apply(record, at), len(record.ranges))  # type: ignore[union-attr]


# ------------------------------------------------------------------ the deadline


@given(lease_ms=st.integers(1, MAX_LEASE_MS), written_ms=st.integers(0, 2**40))
def test_the_deadline_comes_the_safety_margin_before_the_lease_ends(lease_ms: int, written_ms: int) -> None:
    member = RangeMember(TOPIC, lease_ms)
    margin = safety_margin_ms(lease_ms)
    assert member.deadline(written_ms) == written_ms + lease_ms - margin
    assert member.safety_ms == margin
    assert margin <= lease_ms // 2, "at most half the lease: a member still gets half of it"
    if lease_ms >= 2:
        assert margin >= min(500, lease_ms // 2) > 0, "at least half a second (or half of a short lease)"


def test_the_margin_is_a_tenth_of_the_lease_at_least_half_a_second() -> None:
    assert [safety_margin_ms(ms) for ms in (600, 2_000, 30_000, 120_000)] == [300, 500, 3_000, 12_000]


@settings(max_examples=examples(300), deadline=None)
@given(
    lease_ms=st.sampled_from([1_000, 3_000, 30_000]),
    skew=st.integers(0, 499),
    latency=st.integers(0, 400),
    steps=st.lists(st.tuples(st.integers(0, 20_000), st.booleans(), st.integers(0, 400)), max_size=25),
)
def test_a_member_acts_on_a_lease_only_while_the_log_holds_it_for_it(
    lease_ms: int, skew: int, latency: int, steps: list[tuple[int, bool, int]]
) -> None:
    """Claims and renewals take a while to land (or never do), and the log's clock runs behind ours by less than
    the margin: whenever the member would renew or hand out under a lease, the log still has it live."""
    member = RangeMember(TOPIC, lease_ms)
    skew = skew * member.safety_ms // 500  # the log's clock behind the member's, less than the margin
    world = WorldState(GROUP, 1000)
    now = 1_000_000
    at = now + latency - skew
    assert fold(world, member.claim(fields(US, at), [WantedRange(0, 0, 10, 0)]), at) == [True]
    held = Held(0, 0, 10, member.deadline(now))
    for advance, lands, renewal_latency in steps:
        now += advance
        lease = world.shared_partition(TOPIC, 0).as_of(now - skew).leases.get(0)  # type: ignore[union-attr]
        if member.usable(held, now):
            assert lease is not None and lease.holder == US, "acted on a lease the log let lapse"
            assert lease.expires + skew - held.deadline_ms >= member.safety_ms - skew
        due = member.renewals_due([held], now)
        assert due == ([held] if now < held.deadline_ms else []), "a lease past its deadline is never renewed"
        if not due:
            continue
        written = now  # taken before the write
        accepted = False
        if lands:
            at = written + renewal_latency - skew
            accepted = fold(world, member.renewal(fields(US, at), due), at) == [True]
            assert accepted, "a renewal written before the deadline lands on a live lease"
        before = held.deadline_ms
        deadline = member.renewed_deadline(held, written, accepted)
        if deadline is not None:
            held.deadline_ms = deadline
        assert held.deadline_ms >= before, "a deadline never moves back"
        assert (deadline is not None) <= accepted, "only a confirmed renewal moves the deadline"


@given(
    deadlines=st.lists(st.integers(0, 10_000), max_size=8), now=st.integers(0, 10_000), promise=st.integers(0, 5_000)
)
def test_nothing_is_handed_out_once_the_deadline_is_near_or_past(deadlines: list[int], now: int, promise: int) -> None:
    member = RangeMember(TOPIC, 30_000)
    held = [Held(0, 10 * i, 10 * i + 10, deadline) for i, deadline in enumerate(deadlines)]
    for lease in held:
        assert member.usable(lease, now, promise) == (now < lease.deadline_ms and lease.deadline_ms - now >= promise)
    assert member.renewals_due(held, now) == [lease for lease in held if lease.deadline_ms > now]


# --------------------------------------------------------------- which ranges


claims = st.lists(
    st.tuples(
        st.sampled_from(OTHERS),
        st.integers(0, 2),
        st.integers(0, END - 1),
        st.integers(1, 40),
        st.integers(0, 3_000),
        st.sampled_from(["hold", "ack", "cancel", "fail"]),
        st.integers(0, 4_000),
    ),
    max_size=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    log=claims,
    want=st.integers(1, 6),
    idle=st.integers(0, 3),
    size=st.sampled_from([1, 7, 25, 100]),
    probe=st.sampled_from([1, 25]),
    later=st.integers(0, 4_000),
    seed=st.integers(0, 2**16),
    split=st.booleans(),
)
# [60,100) failed once and [100,101)'s lease lapsed by ``now``: the fold gives [60,101) one try each, one range
# (a check that left the lapse out saw 40 offsets of one try and one of none).
@example(
    log=[(OTHERS[0], 1, 60, 40, 3_000, "fail", 0), (OTHERS[0], 1, 100, 1, 1, "hold", 0)],
    want=1,
    idle=0,
    size=100,
    probe=1,
    later=1,
    seed=2,
    split=False,
)
# A range of nothing but a lapsed lease's offsets: delivered once, so one try (the member said none: counted from
# the folded state, without the lapse, its messages would have been dead-lettered a delivery late).
@example(log=[(OTHERS[0], 1, 100, 1, 1, "hold", 0)], want=4, idle=0, size=100, probe=1, later=1, seed=2, split=False)
def test_the_ranges_asked_never_overlap_a_live_lease_and_the_fold_grants_them_all(
    log: list[tuple[MemberId, int, int, int, int, str, int]],
    want: int,
    idle: int,
    size: int,
    probe: int,
    later: int,
    seed: int,
    split: bool,
) -> None:
    """Others claim (and ack, cancel or fail) ranges, their leases lapsing as time passes; the member asks for
    ranges as the fold has them now (``split``: halfway through a backlog someone reads on, too): none overlaps a
    live lease of anyone, none overlaps another, none mixes offsets of different tries, and the fold accepts
    every one."""
    world = WorldState(GROUP, 1000)
    at = 1_000_000
    for holder, partition, start, length, lease_ms, then, step in log:
        at += step
        entry = codec.RangeEntry(partition=partition, offset=start, end=min(start + length, END))
        claim = codec.ClaimRanges(**fields(holder, at), topic=TOPIC, lease_ms=max(lease_ms, 1), ranges=(entry,))
        if not fold(world, claim, at)[0] or then == "hold":
            continue
        if then == "cancel":
            world.apply(codec.CancelRanges(**fields(holder, at), topic=TOPIC, ranges=(entry,)), at)
        else:
            failed = tuple(range(entry.offset, entry.end)) if then == "fail" else ()
            ack = codec.AckEntry(partition=partition, offset=entry.offset, end=entry.end, failed=failed)
            world.apply(codec.AckRanges(**fields(holder, at), topic=TOPIC, ranges=(ack,)), at)
    now = at + later
    member = RangeMember(TOPIC, 30_000, probe_size=probe)
    ends = {0: END, 1: END, 2: END, 3: END}
    initial = {0: 0, 1: 0, 2: 0, 3: 5}  # where partitions never leased start (partition 3: nobody claimed it)
    choice = member.choose(world, ends, initial, now, size, want, idle, random.Random(seed), split=split)
    assert choice.unknown == [] and len(choice.ranges) <= want
    for wanted in choice.ranges:
        state = world.shared_partition(TOPIC, wanted.partition)
        live = [] if state is None else state.live_leases(now)
        assert not any(lease.overlaps(wanted.start, wanted.end) for lease in live), f"{wanted} overlaps a live lease"
        others = [w for w in choice.ranges if w is not wanted and w.partition == wanted.partition]
        assert not any(w.start < wanted.end and wanted.start < w.end for w in others), "two ranges overlap"
        if state is not None:
            # As the fold will count them when the claim is folded: the leases lapsed by ``now`` give their offsets
            # one try more.
            tries = state.tries_in(wanted.start, wanted.end, now)
            assert all(t.count == wanted.tries for t in tries) and (
                not wanted.tries or sum(t.end - t.start for t in tries) == wanted.end - wanted.start
            ), f"{wanted} mixes offsets of different tries"
    if choice.ranges:
        record = member.claim(fields(US, now), choice.ranges)
        assert fold(world, record, now) == [True] * len(choice.ranges), "the fold refused a range asked for"
        assert member.won(choice.ranges, [True] * len(choice.ranges)) == choice.ranges


def test_an_idle_worker_waits_past_what_a_lapsed_at_most_once_lease_lost() -> None:
    """An at-most-once lease lapsed by ``now``, not yet in the fold: its offsets are lost (done), so an idle worker's
    one-offset range at the partition's end starts past them, where the fold accepts it (not at the folded
    low-water mark, below the one the lapse moves up)."""
    world = WorldState(GROUP, 1000)
    entry = codec.RangeEntry(partition=1, offset=0, end=10)
    assert fold(
        world, codec.ClaimRanges(**fields(OTHERS[0], 1_000), topic=TOPIC, lease_ms=1, amo=True, ranges=(entry,)), 1_000
    ) == [True]
    member = RangeMember(TOPIC, 30_000)
    choice = member.choose(world, {1: 10}, {}, 1_001, 100, 1, 1, random.Random(1))
    assert choice.ranges == [WantedRange(1, 10, 11, 0)]
    assert fold(world, member.claim(fields(US, 1_001), choice.ranges), 1_001) == [True]


def test_a_partition_never_leased_is_looked_up_before_anything_is_asked() -> None:
    member = RangeMember(TOPIC, 30_000)
    choice = member.choose(WorldState(GROUP, 1000), {0: 50, 1: 50}, {0: 7}, 1_000, 10, 4, 0, random.Random(1))
    assert (choice.ranges, choice.unknown) == ([], [1])


def test_the_records_carry_the_members_topic_lease_and_mode() -> None:
    member = RangeMember(TOPIC, 45_000, amo=True)
    claim = member.claim(fields(US, 5), [WantedRange(2, 10, 20, 1)])
    assert (claim.topic, claim.lease_ms, claim.amo) == (TOPIC, 45_000, True)
    assert claim.ranges == (codec.RangeEntry(partition=2, offset=10, end=20),)
    renewal = member.renewal(fields(US, 6), [Held(2, 10, 20, 0)])
    assert (renewal.topic, renewal.lease_ms, renewal.ranges) == (TOPIC, 45_000, claim.ranges)
    assert codec.decode(codec.encode(claim)) == claim


# ------------------------------------------------------------------- settling


def leased(lease_ms: int = 60_000, amo: bool = False) -> tuple[SharedPartition, Held]:
    """A fresh partition whose range [100, 130) we hold."""
    state = SharedPartition()
    assert state.claim(100, 130, US, 1_000, lease_ms, amo)
    return state, Held(0, 100, 130, 10_000)


FATES = st.sampled_from(["handled", "failed", "dead", "no message"])


@given(
    fates=st.lists(FATES, min_size=30, max_size=30),
    stopped_at=st.integers(101, 130),
    high=st.none() | st.integers(0, 500),
)
def test_a_range_handled_is_settled_with_exactly_the_offsets_done(
    fates: list[str], stopped_at: int, high: int | None
) -> None:
    """A worker handled [100, stopped_at) (a stop may end it early): after the ack, the fold has exactly the
    handled, dead-lettered and empty offsets done; the failed ones are to be delivered again, one try more; the
    rest go back untried."""
    state, held = leased()
    fate = {100 + i: f for i, f in enumerate(fates) if 100 + i < stopped_at}
    failed = [o for o, f in fate.items() if f == "failed"]
    dead = [o for o, f in fate.items() if f == "dead"]
    entry = handled_entry(held, stopped_at, failed, dead, high)
    assert state.ack(entry.offset, entry.end, US, 2_000, entry.failed, entry.dead, entry.high)
    done = {o for o in range(100, 130) if state.is_done(o)}
    assert done == {o for o, f in fate.items() if f != "failed"}
    assert {o for t in state.tries_in(100, 130) for o in range(t.start, t.end)} == set(failed)
    assert all(t.count == 1 for t in state.tries_in(100, 130))
    assert state.dead_letters == len(dead)


@given(started=st.booleans(), amo=st.booleans())
def test_a_crashed_workers_range_is_failed_whole_if_begun_else_given_back_untried(started: bool, amo: bool) -> None:
    state, held = leased(amo=amo)
    entry = crashed_entry(held, started)
    if isinstance(entry, codec.AckEntry):
        assert started
        assert state.ack(entry.offset, entry.end, US, 2_000, entry.failed, entry.dead)
    else:
        assert not started
        assert state.cancel(entry.offset, entry.end, US, 2_000)
    if started and amo:
        assert state.lost == 30, "at most once: a begun range whose worker died is lost, never delivered again"
    elif started:
        assert [tuple(t) for t in state.tries_in(100, 130)] == [(100, 130, 1)], "one try more each"
    else:
        assert state.tries_in(100, 130) == [] and list(state.free_ranges(3_000, 130, 100, 1)) == [(100, 130)]
    assert not any(state.is_done(o) for o in range(100, 130)) or (started and amo), "nothing reported handled"


@given(upto=st.integers(100, 130), failed=st.sets(st.integers(100, 129), max_size=4), amo=st.booleans())
def test_a_crashed_workers_range_keeps_what_it_had_done_and_fails_only_the_rest(
    upto: int, failed: set[int], amo: bool
) -> None:
    state, held = leased(amo=amo)
    failed_before = sorted(o for o in failed if o < upto)
    entry = crashed_entry(held, True, upto, failed_before, ())
    assert isinstance(entry, codec.AckEntry)
    assert state.ack(entry.offset, entry.end, US, 2_000, entry.failed, entry.dead)
    not_done = set(failed_before) | set(range(upto, 130))
    assert {o for o in range(100, 130) if state.is_done(o) and not (amo and o in not_done)} == set(
        range(100, 130)
    ) - not_done
    if amo:
        assert state.lost == len(not_done)
    else:
        assert {o for t in state.tries_in(100, 130) for o in range(t.start, t.end)} == not_done, (
            "one try more: only those"
        )
    assert state.acked == 30 - len(not_done)


HTTP_FATES = st.sampled_from(["acked", "handed", "dead", "unhanded", "no message"])


@given(fates=st.lists(HTTP_FATES, min_size=30, max_size=30), read_to=st.integers(100, 130))
def test_a_range_given_back_by_the_http_service_settles_exactly_what_clients_finished(
    fates: list[str], read_to: int
) -> None:
    """The HTTP service gives back a range no client holds a message of: the prefix up to the first message never
    handed out (or not read yet) is acked, with the offsets clients acked, the dead letters and the empty
    offsets done; what was handed out and not acked is tried once more; nothing else is done."""
    state, held = leased()
    fate = {100 + i: f if 100 + i < read_to else "not read" for i, f in enumerate(fates)}
    for offset, f in fate.items():
        if f in ("acked", "handed", "dead"):
            assert state.deliver(offset, US, 1_500, 100)
        if f == "acked":
            assert state.ack_offset(offset, 1_550)
    handed = {o for o, f in fate.items() if f in ("acked", "handed", "dead")}
    acked = {o for o, f in fate.items() if f == "acked"}
    dead = {o for o, f in fate.items() if f == "dead"}
    unhanded = [o for o, f in fate.items() if f == "unhanded"]
    entry = given_back_entry(held, read_to, unhanded, handed, acked, dead)
    prefix_end = min([*unhanded, read_to, 130])
    if entry is None:
        assert not handed or prefix_end == 100
        assert state.cancel(100, 130, US, 2_000)
    else:
        assert (entry.offset, entry.end) == (100, prefix_end)
        assert state.ack(entry.offset, entry.end, US, 2_000, entry.failed, entry.dead)
    settled = {o for o, f in fate.items() if o < prefix_end and f in ("dead", "no message")} if entry else set()
    assert {o for o in range(100, 130) if state.is_done(o)} == acked | settled
    tried = {o for t in state.tries_in(100, 130) for o in range(t.start, t.end)}
    dead_settled = {o for o in dead if o < prefix_end} if entry else set()
    assert tried == (handed - acked) - dead_settled, "handed out, not acked, not dead-lettered: one try more"


def test_the_backlog_that_sizes_ranges_is_the_topics_not_handed_out_offsets() -> None:
    world = WorldState(GROUP, 1000)
    world.shared[("t", 0)] = state = SharedPartition()
    assert state.claim(100, 200, MemberId("a", "1"), 0, 60_000, False)  # 100..199 leased: not backlog
    backlog, live = topic_backlog(world, "t", {0: 500, 1: 50, 2: 70}, {1: 20}, now_ms=10)
    assert backlog == (500 - 200) + (50 - 20), "partition 2's start is not known yet: not counted"
    assert [(lease.start, lease.end) for lease in live] == [(100, 200)]
    seen = []
    member = RangeMember("t", 60_000)
    choice = member.choose(
        world, {0: 500}, {}, 10, 7, 1, 0, random.Random(1), sizer=lambda backlog, leases: seen.append(backlog) or 50
    )
    assert seen == [300] and [(w.start, w.end) for w in choice.ranges] == [(200, 250)], "the sizer's size, not 7"


def test_a_reader_that_joins_a_partition_another_reads_on_starts_halfway_through_its_backlog() -> None:
    """Taking the next lowest ranges in turn, two readers of one partition would each skip the other's ranges and
    wait for a fresh fetch at every range; with ``split`` the one that joins starts halfway and both read on."""
    world = WorldState(GROUP, 1000)
    at = 1_000_000
    claim = codec.ClaimRanges(
        **fields(US, at), topic=TOPIC, lease_ms=30_000, ranges=(codec.RangeEntry(partition=0, offset=0, end=100),)
    )
    assert fold(world, claim, at) == [True]
    member = RangeMember(TOPIC, 30_000)
    ends, initial = {0: 1000}, {0: 0}

    def choose(want: int, follow: list[tuple[int, int]], split: bool = True) -> list[WantedRange]:
        return member.choose(
            world, ends, initial, at, 100, want, 0, random.Random(1), follow=follow, split=split
        ).ranges

    assert choose(2, []) == [WantedRange(0, 550, 650, 0), WantedRange(0, 650, 750, 0)], (
        "the joiner: from halfway, contiguous"
    )
    assert choose(2, [(0, 100)]) == [WantedRange(0, 100, 200, 0), WantedRange(0, 550, 650, 0)], "the reader reads on"
    assert choose(1, [], split=False) == [WantedRange(0, 100, 200, 0)], "without split: the lowest, as before"
    ends = {0: 250}
    assert choose(1, []) == [WantedRange(0, 100, 200, 0)], "a stretch shorter than two ranges is not split"


def test_each_reader_of_a_partition_reads_on_where_it_stands_and_a_joiner_halves_the_longest_stretch() -> None:
    """Two readers on one partition, at 0 and at 400,000: each finds its next two ranges where it stands (the
    second's is far above the lowest free ranges), a third starts halfway through the longest stretch left, and
    nobody is handed a range another reads on into while other offsets are free."""
    world = WorldState(GROUP, 1000)
    at = 1_000_000
    entries = (
        codec.RangeEntry(partition=0, offset=0, end=10_000),
        codec.RangeEntry(partition=0, offset=400_000, end=410_000),
    )
    assert fold(world, codec.ClaimRanges(**fields(US, at), topic=TOPIC, lease_ms=30_000, ranges=entries), at) == [
        True,
        True,
    ]
    member = RangeMember(TOPIC, 30_000)

    def choose(want: int, follow: list[tuple[int, int]]) -> list[WantedRange]:
        return member.choose(
            world, {0: 1_000_000}, {0: 0}, at, 10_000, want, 0, random.Random(1), follow=follow, split=True
        ).ranges

    assert choose(4, [(0, 10_000), (0, 10_000), (0, 410_000), (0, 410_000)]) == [
        WantedRange(0, 10_000, 20_000, 0),
        WantedRange(0, 20_000, 30_000, 0),
        WantedRange(0, 410_000, 420_000, 0),
        WantedRange(0, 420_000, 430_000, 0),
    ], "both read on"
    assert choose(2, []) == [WantedRange(0, 705_000, 715_000, 0), WantedRange(0, 715_000, 725_000, 0)], (
        "a joiner: halfway through the longest stretch (410,000 to the end), not into either reader's way"
    )
