"""What the fold of one coordination partition says about range leases of shared partitions (docs/shared-partitions.md).

Pure, like ownership.py, whose audit calls it for every range record: it
compares each shared partition's leases before and after the project's own
fold (WorldState.apply) and writes down every lease that ended, and how:

* ``acked``: settled by its holder (``acked_end`` short of ``end`` when a
  worker stopped at the partition's end and gave the rest back), with how
  many offsets failed and how many were dead-lettered;
* ``cancelled``: given back untried;
* ``lapsed``: its time ran out first (a killed or frozen holder): its
  offsets were delivered again with one try more (at least once), or lost
  (at most once).

``deliveries`` is the lease's delivery number (one more than the tries of its
offsets when claimed): a lease with ``deliveries > 1`` holds offsets that were
handed out before, the ranges handled twice at least in part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from marshal_workers.protocol import codec
from marshal_workers.protocol.range_leases import Lease, SharedPartition
from marshal_workers.protocol.world_state import WorldState, per_entry


class RangeLease(NamedTuple):
    topic: str
    partition: int
    client: str
    instance: str
    start: int
    end: int
    deliveries: int
    amo: int  # 1: claimed at most once
    claimed_ms: int
    ended_ms: int | None  # None: still held at the end of the log
    outcome: str  # acked, cancelled, lapsed, open
    acked_end: int | None  # acked: settled up to here
    failed: int  # acked: offsets tried without success
    dead: int  # acked: offsets dead-lettered
    claim_to_end_ms: int | None
    log_partition: int
    log_offset: int | None  # of its claim; None if it was already held at the checkpoint the audit started from


class _Claimed(NamedTuple):
    deliveries: int
    log_offset: int | None


class LeaseTracker:
    """Follows the leases of the shared partitions routed to one coordination partition."""

    def __init__(self, log_partition: int) -> None:
        self.log_partition = log_partition
        self._claimed: dict[tuple[str, int, int], _Claimed] = {}  # (topic, partition, start) -> when claimed

    def seed(self, state: WorldState) -> None:
        """Leases held in a checkpoint the audit starts from: open, claim not in the log read."""
        for (topic, partition), shared in state.shared.items():
            for lease in shared.leases.values():
                self._claimed[(topic, partition, lease.start)] = _Claimed(_deliveries(shared, lease), None)

    def feed(self, state: WorldState, record: codec.Record, at: int, log_offset: int) -> tuple[RangeLease, ...]:
        """Fold one range record into ``state``; return the leases it ended."""
        topic = record.topic  # type: ignore[union-attr]
        # Range records, or the HTTP service's message records (whose rules may lapse a lease too).
        entries: Sequence[codec.RangeEntry | codec.MessageEntry] = getattr(record, "ranges", None) or record.messages  # type: ignore[union-attr]
        keys = {(topic, entry.partition) for entry in entries}
        before = {key: dict(found.leases) for key in keys if (found := state.shared.get(key)) is not None}
        verdicts = state.apply(record, at, self.log_partition)
        accepted_entries = per_entry(verdicts, len(entries))
        settled = {
            (topic, entry.partition, entry.offset): entry
            for entry, accepted in zip(entries, accepted_entries)
            if accepted and isinstance(record, (codec.AckRanges, codec.CancelRanges))
        }
        ended: list[RangeLease] = []
        for key in keys:
            shared = state.shared.get(key)
            if shared is None:
                continue
            held_before = before.get(key, {})
            for start, lease in held_before.items():
                if shared.leases.get(start) is not lease:
                    entry = settled.get((*key, start))
                    ended.append(self._ended(key, lease, at, entry))  # type: ignore[arg-type]  # a range's: acks, cancels
            for start, lease in shared.leases.items():
                if held_before.get(start) is not lease:
                    self._claimed[(*key, start)] = _Claimed(_deliveries(shared, lease), log_offset)
        return tuple(ended)

    def finish(self, state: WorldState) -> list[RangeLease]:
        """The leases still held at the end of the log."""
        return [
            self._ended(key, lease, None, None)
            for key, shared in sorted(state.shared.items())
            for lease in sorted(shared.leases.values(), key=lambda lease: lease.start)
            if (*key, lease.start) in self._claimed
        ]

    def _ended(self, key: tuple[str, int], lease: Lease, at: int | None, entry: codec.RangeEntry | None) -> RangeLease:
        claimed = self._claimed.pop((*key, lease.start), _Claimed(1, None))
        if at is None:
            outcome = "open"
        elif entry is None:
            outcome, at = "lapsed", lease.expires  # noticed at the next record about the partition; it ended here
        else:
            outcome = "acked" if isinstance(entry, codec.AckEntry) else "cancelled"
        acked = entry if isinstance(entry, codec.AckEntry) else None
        return RangeLease(
            topic=key[0],
            partition=key[1],
            client=lease.holder.client,
            instance=lease.holder.instance,
            start=lease.start,
            end=lease.end,
            deliveries=claimed.deliveries,
            amo=int(lease.amo),
            claimed_ms=lease.claimed_at,
            ended_ms=at,
            outcome=outcome,
            acked_end=None if acked is None else acked.end,
            failed=0 if acked is None else len(acked.failed),
            dead=0 if acked is None else len(acked.dead),
            claim_to_end_ms=None if at is None else at - lease.claimed_at,
            log_partition=self.log_partition,
            log_offset=claimed.log_offset,
        )


def _deliveries(shared: SharedPartition, lease: Lease) -> int:
    return 1 + max((t.count for t in shared.tries_in(lease.start, lease.end)), default=0)
