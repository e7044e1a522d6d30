"""Range leases of one shared partition: the fold's bookkeeping for docs/shared-partitions.md.

A shared partition is never owned whole: any member leases ranges of its
offsets ``[offset, end)`` for a while (the pending timeout), hands them to
its workers and acks them when done.  :class:`SharedPartition` is what the
log says about one such partition, and its methods are the rules of the
fold for the range records (``claim_ranges``, ``renew_ranges``,
``ack_ranges``, ``cancel_ranges``).  Like the rest of the fold they are pure:
each takes the record's time ``at`` and reads no clock, so every reader that
folds the same log holds the same leases.

The invariants, property-tested in ``tests/unit/protocol/test_range_leases_properties.py``:

* no offset is leased to two live holders at any time;
* ``low`` (every offset below it is done) never passes an offset that is
  not done;
* an offset leased at most once (``amo``) is never leased again, whether
  it was acked, cancelled after being tried, or its lease lapsed;
* an offset the holder reported done inside its live lease (``progress_ranges``) is done
  when the lease ends, however it ends: never leased, handed out or tried again.

A lapse is applied when the next record about the partition is folded
(:meth:`SharedPartition.lapse`), or, for queries, at the ``now`` they are
given: the same log gives the same state either way.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from marshal_workers.protocol.field_copies import copier
from marshal_workers.protocol.member_id import MemberId

# One claim covers at most this many offsets, and no claim reaches further than MAX_WINDOW past the
# low-water mark: what a reader keeps per partition (done ranges, retry counts) stays bounded whatever
# a writer asks for.
MAX_RANGE: Final = 65_536  # codec.MAX_BEATS: an ack can list every offset of a range as failed
MAX_WINDOW: Final = 10_000_000
MAX_LEASE_MS: Final = 86_400_000  # a lease lasts at most a day (codec.LeaseMs)


@dataclass(slots=True)
class Lease:
    """A live range claim: ``holder`` may handle ``[start, end)`` until ``expires`` (record time, ms)."""

    start: int
    end: int
    holder: MemberId
    expires: int
    amo: bool  # at most once: a lapse makes the offsets lost instead of claimable again
    claimed_at: int
    # Per-message bookkeeping of the Read / Ack / Cancel service (docs/http-service.md): the offsets
    # handed to HTTP clients (offset -> (pending deadline, hand-outs in this lease)) and those a client acked.
    # Worker leases never fill them.
    handed: dict[int, tuple[int, int]] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    # The holder's progress inside the lease (``progress_ranges``): the runs it reported done
    # (sorted, disjoint, apart) and, of those, the offsets it dead-lettered.  Like clients' acks, they are done
    # when the lease ends, however it ends: a lapse or a crash gives back only the rest.
    progress: list[tuple[int, int]] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)

    def copy(self) -> Lease:
        """An equal, independent copy (field_copies.py)."""
        return _copy_lease(self)

    def overlaps(self, start: int, end: int) -> bool:
        return self.start < end and start < self.end

    def is_settled(self, offset: int) -> bool:
        """Done whatever becomes of the lease: a client acked it, or the holder reported it done."""
        if offset in self.acked:
            return True
        index = bisect.bisect_right(self.progress, (offset, float("inf"))) - 1
        return index >= 0 and self.progress[index][1] > offset

    def settled_runs(self) -> list[tuple[int, int]]:
        """The offsets :meth:`is_settled` says are done, as sorted runs apart from each other."""
        return _union_runs(self.progress, list(_offset_runs(sorted(self.acked))))


_copy_lease = copier(Lease)


class Tries(NamedTuple):
    """Offsets ``[start, end)`` were delivered ``count`` times and are not done."""

    start: int
    end: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count, which nothing here calls


@dataclass(slots=True)
class SharedPartition:
    """The range bookkeeping of one shared (topic, partition)."""

    low: int | None = None  # every offset below is done; None until the first accepted claim sets it
    done: list[tuple[int, int]] = field(default_factory=list)  # done ranges above ``low``: sorted, disjoint, apart
    leases: dict[int, Lease] = field(default_factory=dict)  # by start offset
    tries: list[Tries] = field(default_factory=list)  # sorted, disjoint: offsets delivered and given back
    acked: int = 0  # offsets acked as handled (dead letters included)
    dead_letters: int = 0  # of those, offsets the holder wrote to the dead-letter topic
    lost: int = 0  # offsets of at-most-once leases that lapsed: never delivered again
    lapsed: int = 0  # leases that lapsed (both modes)
    high: int = 0  # the partition's end as holders' fetches saw it (from acks): how far ranges may be claimed

    def copy(self) -> SharedPartition:
        """An equal, independent copy: its leases copied too (field_copies.py)."""
        return _copy_shared_partition(self)

    # ----------------------------------------------------------------- rules

    def lapse(self, at: int) -> None:
        """Drop the leases whose time is up at ``at``: their offsets are claimable again (ALO, one try more)
        or lost (AMO)."""
        for start in [s for s, lease in self.leases.items() if lease.expires <= at]:
            lease = self.leases.pop(start)
            self.lapsed += 1
            settled = self._settle_done(lease)
            self._tried(_gaps(settled, lease.start, lease.end), lease.amo)  # only what was not done: one try more

    def claim(self, start: int, end: int, holder: MemberId, at: int, lease_ms: int, amo: bool) -> bool:
        """A claim of ``[start, end)``: accepted iff no offset in it is done or leased, within the window."""
        if not (start < end and end - start <= MAX_RANGE):
            return False
        self.lapse(at)
        if self.low is None:
            self.low = start  # the first claim sets where the group starts on this partition
        elif start < self.low or end > self.low + MAX_WINDOW or self._any_done(start, end):
            return False
        if any(lease.overlaps(start, end) for lease in self.leases.values()):
            return False
        self.leases[start] = Lease(start, end, holder, at + lease_ms, amo, at)
        return True

    def renew(self, start: int, end: int, holder: MemberId, at: int, lease_ms: int) -> bool:
        """The holder of a live lease on exactly ``[start, end)`` extends it to ``at + lease_ms``."""
        lease = self._held(start, end, holder, at)
        if lease is None:
            return False
        lease.expires = max(lease.expires, at + lease_ms)
        return True

    def ack(
        self,
        start: int,
        end: int,
        holder: MemberId,
        at: int,
        failed: Sequence[int],
        dead: Sequence[int],
        high: int | None = None,
    ) -> bool:
        """The holder settles its lease that starts at ``start``, up to ``end``.

        Every offset of ``[start, end)`` is done except ``failed`` ones, which
        were tried and are claimable again at once (one try more; at most
        once: lost).  ``dead`` offsets were written to the dead-letter topic:
        done, and counted.  The lease's offsets from ``end`` on, if it is
        longer, go back untried, as by a cancel (a worker stopped at the
        partition's end).  Offsets outside the range or out of order make the
        whole entry invalid.  ``high``, the partition's end as the holder saw it,
        raises ``self.high``.
        """
        lease = self._holders_report(start, end, holder, at, failed, dead)
        if lease is None:
            return False
        del self.leases[start]
        if high is not None and high > self.high:
            self.high = high
        # What clients acked (the HTTP service) and what the holder's progress marked is done whatever the ack
        # says; the lease's other offsets from ``end`` on go back as by a cancel: untried, unless they were handed
        # to a client.
        settled = self._settle_done(lease)
        failed = [offset for offset in failed if not lease.is_settled(offset)]
        self.dead_letters += sum(1 for offset in dead if offset not in lease.dead)
        for gap_start, gap_end in _gaps(settled, start, end):
            for run_start, run_end in _runs(gap_start, gap_end, failed):
                self.acked += run_end - run_start
                self._mark_done(run_start, run_end)
        # Offsets past ``end`` that were handed to a client and not settled were tried: as by a cancel.
        handed_past = [o for o in sorted(lease.handed) if o >= end and not lease.is_settled(o)]
        self._tried(_offset_runs(failed + handed_past), lease.amo)
        return True

    def progress(
        self, start: int, end: int, holder: MemberId, at: int, failed: Sequence[int], dead: Sequence[int]
    ) -> bool:
        """The holder of the live lease that starts at ``start`` reports ``[start, end)`` done but ``failed``;
        ``dead`` of them were dead-lettered.  Nothing is settled yet: the lease marks them, and
        they are done when it ends, however it ends.  A mark is never taken back (a later entry that says less
        changes nothing), so no offset is done twice.  Offsets outside the range or out of order make the
        entry invalid, as in :meth:`ack`."""
        lease = self._holders_report(start, end, holder, at, failed, dead)
        if lease is None:
            return False
        lease.progress = _union_runs(lease.progress, list(_runs(start, end, failed)))
        lease.dead.update(dead)
        return True

    def cancel(self, start: int, end: int, holder: MemberId, at: int) -> bool:
        """The holder gives its lease on exactly ``[start, end)`` back: claimable at once, no try counted.

        Offsets HTTP clients acked are done; offsets handed to a client and not acked count one try (at most
        once: lost), as they would had the lease lapsed."""
        lease = self._held(start, end, holder, at)
        if lease is None:
            return False
        del self.leases[start]
        self._settle_done(lease)
        self._tried(_offset_runs([o for o in sorted(lease.handed) if not lease.is_settled(o)]), lease.amo)
        return True

    # Per-message records of the Read / Ack / Cancel service.  The holder hands offsets of its
    # lease to clients one by one; any member (any server of the group) may ack or cancel them, so a client's
    # ack may reach any server.  Each rule is about one offset and gives its verdict.

    def deliver(self, offset: int, holder: MemberId, at: int, pending_ms: int) -> bool:
        """The holder hands ``offset`` to a client until ``at + pending_ms``: accepted iff it lies in the holder's
        live lease, is not acked and is not pending with another client (at most once: was never handed out)."""
        lease = self._covering(offset, at)
        if lease is None or lease.holder != holder or lease.is_settled(offset):
            return False
        deadline, count = lease.handed.get(offset, (0, 0))
        if deadline > at or (lease.amo and count):
            return False  # pending with a client; or, at most once, handed out before
        lease.handed[offset] = (at + pending_ms, count + 1)
        return True

    def ack_offset(self, offset: int, at: int) -> bool:
        """A client acks ``offset`` (through any member): accepted iff it is pending (handed out, deadline not
        passed, under a live lease) and not acked yet.  It is done when the lease ends, however it ends."""
        lease = self._covering(offset, at)
        if lease is None or lease.is_settled(offset) or lease.handed.get(offset, (0, 0))[0] <= at:
            return False
        lease.acked.add(offset)
        return True

    def cancel_offset(self, offset: int, at: int) -> bool:
        """A client gives ``offset`` back (through any member): accepted iff it is pending; the holder may hand it
        out again at once."""
        lease = self._covering(offset, at)
        if lease is None or lease.is_settled(offset):
            return False
        deadline, count = lease.handed.get(offset, (0, 0))
        if deadline <= at:
            return False
        lease.handed[offset] = (at, count)
        return True

    # --------------------------------------------------------------- queries

    def live_leases(self, now: int) -> list[Lease]:
        """The leases not lapsed at ``now``, by start offset."""
        return sorted((lease for lease in self.leases.values() if lease.expires > now), key=lambda lease: lease.start)

    def is_done(self, offset: int) -> bool:
        if self.low is not None and offset < self.low:
            return True
        return self._any_done(offset, offset + 1)

    def tries_in(self, start: int, end: int, now: int | None = None) -> list[Tries]:
        """The tries of the offsets in ``[start, end)`` that were delivered before (clipped to the range), counting
        the leases lapsed at ``now`` if given (as :meth:`free_ranges` does)."""
        tries = self.tries if now is None else self.as_of(now).tries
        return [Tries(max(t.start, start), min(t.end, end), t.count) for t in tries if t.start < end and start < t.end]

    def free_ranges(self, now: int, end: int, size: int, most: int) -> Iterator[tuple[int, int]]:
        """Up to ``most`` claimable ranges of at most ``size`` offsets below ``end`` (the partition's end), lowest
        first, as the fold would see them at ``now``.  A range never mixes try counts, so offsets given back
        after a failure go out in ranges of their own and the dead-letter decision is per range."""
        if self.low is None or most <= 0:
            return
        # The leases lapsed at ``now`` but not yet in the fold: their offsets have one try more (ALO) or are done
        # (AMO, lost) once the next record lapses them, so they are counted so here.
        view = self.as_of(now)
        assert view.low is not None
        taken = sorted([(lease.start, lease.end) for lease in view.leases.values()] + view.done)
        ceiling = min(end, view.low + MAX_WINDOW)
        found = 0
        for gap_start, gap_end in _gaps(taken, view.low, ceiling):
            for piece_start, piece_end in view._split_by_tries(gap_start, gap_end):
                cursor = piece_start
                while cursor < piece_end:
                    stop = min(cursor + size, piece_end)
                    yield cursor, stop
                    found += 1
                    if found >= most:
                        return
                    cursor = stop

    def free_gaps(self, now: int, end: int) -> list[tuple[int, int]]:
        """The stretches of offsets nobody holds and nobody has done, below ``end`` and within the window, as the
        fold would see them at ``now``, lowest first (:meth:`free_ranges` cuts them into ranges)."""
        if self.low is None:
            return []
        view = self.as_of(now)
        assert view.low is not None
        taken = sorted([(lease.start, lease.end) for lease in view.leases.values()] + view.done)
        return list(_gaps(taken, view.low, min(end, view.low + MAX_WINDOW)))

    # --------------------------------------------------------------- helpers

    def as_of(self, now: int) -> SharedPartition:
        """This partition as the fold will see it once the leases lapsed at ``now`` are lapsed: itself if none is,
        else a copy (a query never changes the state: the lapse belongs to the next record's time).  Queries at
        ``now`` (status, metrics, the free ranges) look at this view: a lease that lapsed after the partition's
        last record is lapsed all the same, its offsets lost (AMO) or to try again (ALO)."""
        if all(lease.expires > now for lease in self.leases.values()):
            return self
        view = self.copy()
        view.lapse(now)
        return view

    def covering(self, offset: int, now: int) -> Lease | None:
        """The lease live at ``now`` that covers ``offset``, if any (a query: nothing is lapsed)."""
        for lease in self.leases.values():
            if lease.start <= offset < lease.end and lease.expires > now:
                return lease
        return None

    def _covering(self, offset: int, at: int) -> Lease | None:
        self.lapse(at)
        return self.covering(offset, at)

    def _tried(self, runs: Iterable[tuple[int, int]], amo: bool) -> None:
        """Runs of offsets tried without success: one try more each (at most once: done, and counted lost)."""
        for start, end in runs:
            if amo:
                self.lost += end - start
                self._mark_done(start, end)
            else:
                self._add_tries(start, end)

    def _settle_done(self, lease: Lease) -> list[tuple[int, int]]:
        """An ended lease's client acks and progress are done offsets, counted as acked (once: here), its progress'
        dead letters counted too; returns them as runs."""
        settled = lease.settled_runs()
        for run_start, run_end in settled:
            self._mark_done(run_start, run_end)
            self.acked += run_end - run_start
        self.dead_letters += len(lease.dead)
        return settled

    def _holders_report(
        self, start: int, end: int, holder: MemberId, at: int, failed: Sequence[int], dead: Sequence[int]
    ) -> Lease | None:
        """The live lease starting at ``start`` if ``holder`` holds it and may report on ``[start, end)`` of it with
        these ``failed`` and ``dead`` offsets (inside the range, in order, disjoint); else None."""
        self.lapse(at)
        lease = self.leases.get(start)
        if lease is None or lease.holder != holder or not start < end <= lease.end:
            return None
        if not _valid_offsets(failed, start, end) or not _valid_offsets(dead, start, end) or set(failed) & set(dead):
            return None
        return lease

    def _held(self, start: int, end: int, holder: MemberId, at: int) -> Lease | None:
        self.lapse(at)
        lease = self.leases.get(start)
        if lease is None or lease.end != end or lease.holder != holder:
            return None
        return lease

    def _any_done(self, start: int, end: int) -> bool:
        if self.low is not None and start < self.low:
            return True
        index = bisect.bisect_right(self.done, (start, float("inf"))) - 1
        if index >= 0 and self.done[index][1] > start:
            return True
        following = index + 1
        return following < len(self.done) and self.done[following][0] < end

    def _mark_done(self, start: int, end: int) -> None:
        """Add ``[start, end)`` (not done before) to the done ranges, merge neighbours, move ``low`` up."""
        index = bisect.bisect_left(self.done, (start, start))
        self.done.insert(index, (start, end))
        merged: list[tuple[int, int]] = []
        for run in self.done[max(index - 1, 0) : index + 2]:
            if merged and merged[-1][1] >= run[0]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], run[1]))
            else:
                merged.append(run)
        self.done[max(index - 1, 0) : index + 2] = merged
        self._clear_tries(start, end)
        low = self.low if self.low is not None else start
        while self.done and self.done[0][0] <= low:
            low = max(low, self.done.pop(0)[1])
        self.low = low

    def _add_tries(self, start: int, end: int) -> None:
        """One try more for every offset of ``[start, end)``."""
        pieces: list[Tries] = []
        cursor = start
        for t in self.tries:
            if t.end <= start or t.start >= end:
                pieces.append(t)
                continue
            if t.start < start:
                pieces.append(Tries(t.start, start, t.count))
            if cursor < t.start:
                pieces.append(Tries(cursor, t.start, 1))
            pieces.append(Tries(max(t.start, start), min(t.end, end), t.count + 1))
            if t.end > end:
                pieces.append(Tries(end, t.end, t.count))
            cursor = min(t.end, end)
        if cursor < end:
            pieces.append(Tries(cursor, end, 1))
        self.tries = _merge_tries(pieces)

    def _clear_tries(self, start: int, end: int) -> None:
        if not self.tries:
            return
        kept: list[Tries] = []
        for t in self.tries:
            if t.end <= start or t.start >= end:
                kept.append(t)
                continue
            if t.start < start:
                kept.append(Tries(t.start, start, t.count))
            if t.end > end:
                kept.append(Tries(end, t.end, t.count))
        self.tries = kept

    def _split_by_tries(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """``[start, end)`` cut where the try count changes."""
        cursor = start
        for t in self.tries:
            if t.end <= cursor or t.start >= end:
                continue
            if t.start > cursor:
                yield cursor, t.start
            yield max(t.start, cursor), min(t.end, end)
            cursor = min(t.end, end)
        if cursor < end:
            yield cursor, end


_copy_shared_partition = copier(SharedPartition)


def _valid_offsets(offsets: Sequence[int], start: int, end: int) -> bool:
    """Strictly increasing offsets inside ``[start, end)``."""
    previous = start - 1
    for offset in offsets:
        if not previous < offset < end:
            return False
        previous = offset
    return True


def _runs(start: int, end: int, excluded: Sequence[int]) -> Iterator[tuple[int, int]]:
    """The runs of ``[start, end)`` between the sorted offsets ``excluded``."""
    cursor = start
    for offset in excluded:
        if offset >= end:
            break
        if offset > cursor:
            yield cursor, offset
        cursor = max(cursor, offset + 1)
    if cursor < end:
        yield cursor, end


def _offset_runs(offsets: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Sorted distinct offsets as runs of consecutive ones, ``[start, end)``."""
    run_start: int | None = None
    previous = -2
    for offset in offsets:
        if offset != previous + 1:
            if run_start is not None:
                yield run_start, previous + 1
            run_start = offset
        previous = offset
    if run_start is not None:
        yield run_start, previous + 1


def _union_runs(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of two lists of runs ``[start, end)``: sorted, merged where they overlap or touch."""
    merged: list[tuple[int, int]] = []
    for run_start, run_end in sorted(first + second):
        if merged and merged[-1][1] >= run_start:
            merged[-1] = (merged[-1][0], max(merged[-1][1], run_end))
        else:
            merged.append((run_start, run_end))
    return merged


def _merge_tries(pieces: list[Tries]) -> list[Tries]:
    pieces.sort()
    merged: list[Tries] = []
    for piece in pieces:
        if piece.start >= piece.end:
            continue
        if merged and merged[-1].end == piece.start and merged[-1].count == piece.count:
            merged[-1] = Tries(merged[-1].start, piece.end, piece.count)
        else:
            merged.append(piece)
    return merged


def _gaps(taken: list[tuple[int, int]], start: int, end: int) -> Iterator[tuple[int, int]]:
    """The parts of ``[start, end)`` outside the sorted ranges ``taken``."""
    cursor = start
    for run_start, run_end in taken:
        if run_end <= cursor:
            continue
        if run_start >= end:
            break
        if run_start > cursor:
            yield cursor, run_start
        cursor = max(cursor, run_end)
    if cursor < end:
        yield cursor, end
