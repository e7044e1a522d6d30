"""The range-lease member: what a member of a shared topic decides about its leases (docs/shared-partitions.md).

Two kinds of member lease ranges of a shared topic's offsets in the coordination log: a supervisor's shared
pool (runtime/supervisor/shared_pool.py), for its shared workers, and the HTTP service
(http/served_topic.py), for its clients.  Both take the same steps, decided here, once:

* which ranges to ask for: the free ranges the fold shows (:func:`free_candidates`), spread over the
  partitions and picked at random among the lowest so members rarely race for one (:func:`pick_ranges`);
* the ``claim_ranges`` record, and what its verdicts mean: a lease until a deadline that comes a safety
  margin before the lease's end in the log (:meth:`RangeMember.deadline`: clock skew and the write's time);
* which leases to renew (never one whose deadline has passed), and the deadline a confirmed renewal gives;
* whether a lease may still be acted on: nothing is handed out or handled once its deadline has passed;
* how a range is settled: an ``ack_ranges`` entry that says exactly which offsets are done (every offset of
  the entry's range but its ``failed`` ones), or a ``cancel_ranges`` entry for a range never begun.

Pure, like the rest of the protocol: the callers read the clock (``now``, ``written_ms``: monotonic ms for
deadlines, the log's wall-clock ms for the fold) and do the writes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.partition_end import partition_end
from marshal_workers.protocol.range_leases import MAX_RANGE, Lease, SharedPartition
from marshal_workers.protocol.world_state import WorldState


class WantedRange(NamedTuple):
    """A free range to ask for in a ``claim_ranges`` (and, once won, to lease): ``[start, end)`` of ``partition``,
    whose offsets were delivered ``tries`` times."""

    partition: int
    start: int
    end: int
    tries: int


class HeldLease(Protocol):
    """What the member needs of a lease it holds: the callers' own records of their leases (a shared pool's
    worker_supply.PoolLease, a served topic's http ServedLease), beside the fold's range_leases.Lease."""

    partition: int
    start: int
    end: int
    deadline_ms: int  # monotonic: past it the lease may have lapsed in the log


Held = TypeVar("Held", bound=HeldLease)

# The size of the ranges to claim, from the topic's backlog (what is not handed out yet, :func:`topic_backlog`) and
# the leases live on it (range_sizing.BacklogSizer: a share of the backlog, not the whole tail).
Sizer = Callable[[int, Sequence[Lease]], int]


@dataclass(frozen=True)
class RangeChoice:
    """The ranges to claim now, or the partitions whose start must be looked up first (then nothing is claimed)."""

    ranges: list[WantedRange]
    unknown: list[int]


def safety_margin_ms(lease_ms: int) -> int:
    """How much earlier than the lease's end in the log a member stops acting on it: clock skew between the
    member and the log's timestamps, and the time the write took.  A tenth of the lease, at least half a second,
    at most half of the lease."""
    return min(lease_ms // 2, max(500, lease_ms // 10))


@dataclass(frozen=True)
class RangeMember:
    """One member's leases on one shared topic: the decisions, over plain data.  ``lease_ms``: how long a lease
    lasts from its record's time (the handler's pending timeout); ``amo``: at most once (a lapse loses the
    offsets); ``probe_size``: the offsets asked for at the end of a partition read to its end (see
    :func:`free_candidates`)."""

    topic: str
    lease_ms: int
    amo: bool = False
    probe_size: int = 1

    @property
    def safety_ms(self) -> int:
        return safety_margin_ms(self.lease_ms)

    def deadline(self, written_ms: int) -> int:
        """The deadline of a lease claimed or renewed by a write that started at ``written_ms`` (taken before the
        write, so the deadline errs short)."""
        return written_ms + self.lease_ms - self.safety_ms

    # ----------------------------------------------------------------- claim

    def choose(
        self,
        world: WorldState,
        ends: dict[int, int],
        initial: dict[int, int],
        now_ms: int,
        size: int,
        want: int,
        idle: int,
        rng: random.Random,
        sizer: Sizer | None = None,
        follow: Collection[tuple[int, int]] = (),
        split: bool = False,
    ) -> RangeChoice:
        """Up to ``want`` ranges of at most ``size`` offsets to claim, as the fold has it at ``now_ms`` (the log's
        clock).  ``ends``: the partitions' ends as asked; ``initial``: where partitions never leased start, as looked
        up; ``idle``: workers (or readers) with nothing to do, who may wait at a partition's end; ``sizer``, if
        given, sizes each partition's ranges instead of ``size`` (adaptive range sizes); ``follow``: (partition,
        offset) where the member's readers stand, once per range each wants, ranges starting there (and following
        one another) first (see :func:`pick_ranges`); ``split``: a reader new to a partition another reads on starts
        halfway through its backlog (see :func:`split_ahead`)."""
        candidates, members, unknown = free_candidates(
            world, self.topic, ends, initial, now_ms, size, want, idle, self.probe_size, sizer, split
        )
        if unknown:
            return RangeChoice([], unknown)
        return RangeChoice(pick_ranges(candidates, want, members, rng, follow), [])

    def claim(self, fields: dict[str, Any], ranges: Sequence[WantedRange]) -> codec.ClaimRanges:
        """The ``claim_ranges`` record for ``ranges`` (``fields``: the writer's common record fields)."""
        return codec.ClaimRanges(
            **fields,
            topic=self.topic,
            lease_ms=self.lease_ms,
            amo=self.amo,
            ranges=tuple(codec.RangeEntry(partition=w.partition, offset=w.start, end=w.end) for w in ranges),
        )

    @staticmethod
    def won(ranges: Sequence[WantedRange], verdicts: Sequence[bool]) -> list[WantedRange]:
        """The ranges the fold accepted: leases now ours (until :meth:`deadline`); the others are someone else's."""
        return [wanted for wanted, accepted in zip(ranges, verdicts) if accepted]

    # ----------------------------------------------------------------- renew

    @staticmethod
    def usable(lease: HeldLease, now_ms: int, promise_ms: int = 0) -> bool:
        """Whether anything may still be done under ``lease`` at ``now_ms``: before its deadline, with at least
        ``promise_ms`` left (what a hand-out promises a client)."""
        return now_ms < lease.deadline_ms and lease.deadline_ms - now_ms >= promise_ms

    def renewals_due(self, held: Iterable[Held], now_ms: int) -> list[Held]:
        """The leases to renew now: every one still usable.  One past its deadline may have lapsed in the log
        already (another member may hold its offsets): it is left to lapse, never renewed."""
        return [lease for lease in held if self.usable(lease, now_ms)]

    def renewal(self, fields: dict[str, Any], held: Sequence[HeldLease]) -> codec.RenewRanges:
        """The ``renew_ranges`` record for ``held``."""
        return codec.RenewRanges(
            **fields,
            topic=self.topic,
            lease_ms=self.lease_ms,
            ranges=tuple(codec.RangeEntry(partition=h.partition, offset=h.start, end=h.end) for h in held),
        )

    def renewed_deadline(self, lease: HeldLease, written_ms: int, accepted: bool) -> int | None:
        """The lease's new deadline after a renewal written at ``written_ms``: None if the fold refused it or it
        would not move the deadline on (a deadline never moves back)."""
        deadline = self.deadline(written_ms)
        return deadline if accepted and deadline > lease.deadline_ms else None

    # ---------------------------------------------------------------- settle

    def acks(self, fields: dict[str, Any], entries: Sequence[codec.AckEntry]) -> codec.AckRanges:
        return codec.AckRanges(**fields, topic=self.topic, ranges=tuple(entries))

    def cancels(self, fields: dict[str, Any], entries: Sequence[codec.RangeEntry]) -> codec.CancelRanges:
        return codec.CancelRanges(**fields, topic=self.topic, ranges=tuple(entries))

    def progress(self, fields: dict[str, Any], entries: Sequence[codec.ProgressEntry]) -> codec.ProgressRanges:
        """The ``progress_ranges`` record for ``entries``: one per pass, for every lease that moved on."""
        return codec.ProgressRanges(**fields, topic=self.topic, ranges=tuple(entries))


def cancel_entry(lease: HeldLease) -> codec.RangeEntry:
    """A range given back untried (never begun)."""
    return codec.RangeEntry(partition=lease.partition, offset=lease.start, end=lease.end)


def handled_entry(
    lease: HeldLease, end: int, failed: Sequence[int], dead: Sequence[int], high: int | None = None
) -> codec.AckEntry:
    """A range handled up to ``end``: every offset of ``[lease.start, end)`` is done but ``failed`` (to be delivered
    again; at most once: lost); ``dead`` were dead-lettered (done).  The lease's offsets from ``end`` on go back
    untried.  ``high``: the partition's end as the handler's fetches saw it."""
    return codec.AckEntry(
        partition=lease.partition, offset=lease.start, end=end, failed=tuple(failed), dead=tuple(dead), high=high
    )


def progress_entry(lease: HeldLease, upto: int, failed: Sequence[int], dead: Sequence[int]) -> codec.ProgressEntry:
    """Progress inside a live lease: every offset of ``[lease.start, upto)`` done but ``failed``; ``dead`` of them
    dead-lettered."""
    return codec.ProgressEntry(
        partition=lease.partition, offset=lease.start, end=upto, failed=tuple(failed), dead=tuple(dead)
    )


def crashed_entry(
    lease: HeldLease, started: bool, upto: int | None = None, failed: Sequence[int] = (), dead: Sequence[int] = ()
) -> codec.AckEntry | codec.RangeEntry:
    """What becomes of a lease whose worker died: never begun, it goes back untried; begun, the offsets its worker
    reported done (every one of ``[lease.start, upto)`` but ``failed``; ``dead`` dead-lettered) are done and every
    other one is failed: any of them may have been handled (the one in hand surely was tried), so one try more (at
    most once: lost).  Without ``upto``, nothing is known done: every offset is failed."""
    if not started:
        return cancel_entry(lease)
    upto = lease.start if upto is None else min(max(upto, lease.start), lease.end)
    failed_before = tuple(o for o in failed if lease.start <= o < upto)
    dead_before = tuple(o for o in dead if lease.start <= o < upto and o not in failed_before)
    return handled_entry(lease, lease.end, failed_before + tuple(range(upto, lease.end)), dead_before)


def given_back_entry(
    lease: HeldLease,
    read_to: int,
    unhanded: Iterable[int],
    handed: Collection[int],
    acked: Collection[int],
    dead: Collection[int],
) -> codec.AckEntry | None:
    """How a range no client holds a message of goes back (the HTTP service): None, a plain cancel, if nothing of
    it was handed out; else an ack of its prefix up to the first message never handed out (``unhanded``) or the
    first offset not read yet (``read_to``): done are the offsets clients ``acked``, the ``dead`` letters and the
    offsets with no message; what was ``handed`` out and not acked is failed (one try more).  The rest goes back
    untried."""
    end = min([*unhanded, read_to, lease.end])
    if end <= lease.start or not (handed or dead):
        return None
    failed = tuple(sorted(o for o in handed if o < end and o not in acked and o not in dead))
    return handled_entry(lease, end, failed, tuple(sorted(o for o in dead if o < end)))


def free_candidates(
    world: WorldState,
    topic: str,
    high: dict[int, int],
    initial: dict[int, int],
    now_ms: int,
    size: int,
    want: int,
    idle: int,
    probe_size: int = 1,
    sizer: Sizer | None = None,
    split: bool = False,
) -> tuple[dict[int, list[tuple[int, int, int]]], int, list[int]]:
    """Free ranges by partition, as (start, end, tries); how many members hold leases on the topic; and the
    partitions never leased whose start is not known yet.  ``high``: the partitions' ends as asked (ListOffsets);
    ``initial``: where partitions never leased start, as looked up.

    A partition read to its end, with nobody waiting there, gets a one-offset range at its end if a worker
    is idle (``idle``): that worker waits for the next message (and its fetches tell the true end, which
    ListOffsets may under-report).  Only idle workers: a range queued behind it would wait too.  The HTTP
    service asks for ``probe_size`` offsets there instead: its readers take the messages as they come.

    ``sizer``: the range size from the topic's backlog and live leases (:func:`topic_backlog`), instead of ``size``.
    ``split``: ranges ordered so that readers read on where they stand (:func:`split_ahead`).
    """
    if sizer is not None:
        size = sizer(*topic_backlog(world, topic, high, initial, now_ms))
    found: dict[int, list[tuple[int, int, int]]] = {}
    unknown: list[int] = []
    holders: set[MemberId] = set()
    for partition, asked_end in high.items():
        state = world.shared_partition(topic, partition)
        end = asked_end if state is None else partition_end(asked_end, state.high)
        if state is None or state.low is None:
            start = initial.get(partition)
            if start is None:
                unknown.append(partition)
            else:
                found[partition] = [(start, max(min(start + size, end), start + 1), 0)]
            continue
        # The partition as the fold will have it when our claim is folded: the leases lapsed by ``now_ms`` lapsed,
        # their offsets one try more (ALO) or done (AMO, lost), as free_ranges cuts them.  Counted from the folded
        # state instead, a range of a lapsed lease's offsets would go out with a try too few: its messages
        # delivered once more than max_deliveries before they are dead-lettered, ``msg.attempt`` one short.
        view = state.as_of(now_ms)
        assert view.low is not None  # set by the first claim; a lapse only moves it up
        live = view.live_leases(now_ms)
        holders.update(lease.holder for lease in live)
        ranges = []
        for start, stop in view.free_ranges(now_ms, end, size, want + 8):
            tries = view.tries_in(start, stop)
            ranges.append((start, stop, tries[0].count if tries else 0))
        if split and ranges:
            ranges = split_ahead(view, live, ranges, end, size, want, now_ms)
        if not ranges and not live and idle > 0:
            idle -= 1
            start = view.low  # past what a lapse made done: a claim below ``low`` is refused
            tries = view.tries_in(start, start + 1)
            ranges.append((start, start + (1 if tries else probe_size), tries[0].count if tries else 0))
        found[partition] = ranges
    return found, max(len(holders), 1), unknown


def split_ahead(
    state: SharedPartition,
    live: Sequence[Lease],
    lowest: list[tuple[int, int, int]],
    end: int,
    size: int,
    want: int,
    now_ms: int,
) -> list[tuple[int, int, int]]:
    """The free ranges of a partition (``lowest``: the lowest ones, as (start, end, tries)) in the order a fast
    handler's workers should take them: a worker that moves to another place in the log waits for a fresh fetch
    there (tens of milliseconds, more than such a handler's whole range), so every reader should read on where
    it stands.  A stretch of free offsets that starts where a live lease ends is its reader's to read on into:

    * first, for a reader that joins, ranges from halfway through the longest such stretch (at least two ranges
      long): the two then read on side by side, where taking the next lowest range would have each skip the
      other's ranges and wait at every one (each reader that joins halves the longest stretch again);
    * then the free ranges nobody reads on into (offsets given back, a partition not begun), lowest first;
    * last the ranges that start where a reader reads on (the first two of each stretch, for that reader to
      follow: :func:`pick_ranges` finds them by their start), taken by anyone else only if nothing else is free.

    Ranges with offsets given back after a failure (tries) are left where ``lowest`` has them."""
    gaps = state.free_gaps(now_ms, end)
    ends = {lease.end for lease in live}
    read_on = [(start, stop) for start, stop in gaps if start in ends]
    joiner: list[tuple[int, int, int]] = []
    if read_on:
        start, stop = max(read_on, key=lambda gap: gap[1] - gap[0])
        middle = start + (stop - start) // 2
        if stop - start >= 2 * size and not state.tries_in(middle, stop, now_ms):
            joiner = [(at, min(at + size, stop), 0) for at in range(middle, stop, size)][:want]
    followed = [
        (at, min(at + size, stop), 0)
        for start, stop in read_on
        for at in range(start, stop, size)[:2]
        if not state.tries_in(at, min(at + size, stop), now_ms)
    ]
    reserved = [r for r in lowest if any(start <= r[0] < stop for start, stop in read_on)]
    open_ = [r for r in lowest if r not in reserved]
    found, starts = [], set()
    for candidate in [*joiner, *open_, *reserved, *followed]:
        if candidate[0] not in starts:
            starts.add(candidate[0])
            found.append(candidate)
    return found


def topic_backlog(
    world: WorldState, topic: str, high: dict[int, int], initial: dict[int, int], now_ms: int
) -> tuple[int, list[Lease]]:
    """The offsets of ``topic`` not yet handed out: on each partition, its end (as asked, or as holders saw it) less
    where its free offsets start (a partition never leased: where it starts, if known); and the leases live on it."""
    backlog, live = 0, []
    for partition, asked_end in high.items():
        state = world.shared_partition(topic, partition)
        end = asked_end if state is None else partition_end(asked_end, state.high)
        if state is None or state.low is None:
            start = initial.get(partition)
            backlog += 0 if start is None else max(end - start, 0)
            continue
        live.extend(state.live_leases(now_ms))
        first = next(state.free_ranges(now_ms, end, MAX_RANGE, 1), None)
        backlog += 0 if first is None else end - first[0]
    return backlog, live


def pick_ranges(
    candidates: dict[int, list[tuple[int, int, int]]],
    want: int,
    members: int,
    rng: random.Random,
    follow: Collection[tuple[int, int]] = (),
) -> list[WantedRange]:
    """Up to ``want`` ranges: first those that start where one of our readers stands (``follow``: (partition,
    offset) where a reader's last range ends, once per range it wants: its second range follows its first), so
    its consumer goes on reading where it is, its read-ahead already fetched (a reader that moves to another
    partition waits for a fresh fetch there, tens of milliseconds); then one partition after another (spread),
    each a random one of the lowest few free ranges (the more members, the wider the pick), so members racing
    for the same range are rare."""
    pools = {p: list(ranges) for p, ranges in candidates.items() if ranges}
    picked: list[WantedRange] = []
    stands: dict[tuple[int, int], int] = {}  # a reader's position -> where it stands after the ranges picked for it
    for partition, offset in follow:
        pool = pools.get(partition, [])
        at = stands.get((partition, offset), offset)
        found = next((r for r in pool if r[0] == at), None)
        if found is not None and len(picked) < want:
            pool.remove(found)
            picked.append(WantedRange(partition, *found))
            stands[partition, offset] = found[1]
    order = [p for p, pool in pools.items() if pool]
    rng.shuffle(order)
    while len(picked) < want and order:
        for partition in list(order):
            pool = pools[partition]
            index = rng.randrange(min(len(pool), members))
            start, end, tries = pool.pop(index)
            picked.append(WantedRange(partition, start, end, tries))
            if not pool:
                order.remove(partition)
            if len(picked) >= want:
                break
    return picked
