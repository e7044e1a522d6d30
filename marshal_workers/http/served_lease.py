"""A range of a served topic whose lease this server holds, and what it knows of the range's messages.

The serve loop (served_topic.py) reads a held range's messages from Kafka into it, hands them out to HTTP
clients (``pick``, ``handed_until``), takes their acks and cancels, dead-letters those out of deliveries, and
settles the range once every message is done (``complete``) or gives it back (:func:`given_back`).  The fold
judges every hand-out, ack and settlement; this is the server's local mirror, kept under the ServedTopic's lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marshal_workers.protocol import codec
from marshal_workers.protocol.range_member import given_back_entry
from marshal_workers.runtime.channel import monotonic_ms

_NEVER = 2**62


@dataclass
class ServedLease:
    """A lease this server holds for its HTTP clients (a member's own record, a HeldLease; the fold's is
    range_leases.Lease), and what the server knows of the range's messages."""

    partition: int
    start: int
    end: int
    tries: int  # deliveries of its offsets before this lease
    deadline_ms: int  # monotonic: past it the lease may have lapsed, so nothing more is handed out
    fetched_to: int  # the next offset to read from Kafka
    messages: dict[int, Any] = field(default_factory=dict)  # offset -> Kafka message, until acked or dead
    pending_until: dict[int, int] = field(default_factory=dict)  # offset -> monotonic ms: handed out until then
    handed: dict[int, int] = field(default_factory=dict)  # offset -> hand-outs in this lease (the fold's)
    acked: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    reserved: set[int] = field(default_factory=set)  # being handed out: a deliver_messages write for them is in flight
    unwritten: set[int] = field(default_factory=set)  # answered to a client; their deliver_messages not confirmed yet
    settling: bool = False
    last_used: int = field(default_factory=monotonic_ms)  # claimed, or a message handed out: monotonic ms
    # Where the next pick looks from: no message below it could be handed out at the last look (each was acked, dead,
    # reserved, pending or out of deliveries), so a read does not step over every pending message again. Lowered
    # when one of them may go out again (free_again); back to the start once a pending deadline below it passes.
    scan_from: int = -1
    rescan_at: int = _NEVER  # monotonic ms: the earliest pending deadline among the offsets below scan_from

    def __post_init__(self) -> None:
        if self.scan_from < 0:
            self.scan_from = self.start

    def fetched(self) -> bool:
        return self.fetched_to >= self.end

    def deliveries(self, offset: int) -> int:
        """How often ``offset`` was handed out: under earlier leases (``tries``) and under this one."""
        return self.tries + self.handed.get(offset, 0)

    def eligible(self, offset: int, now: int) -> bool:
        return (
            offset not in self.acked
            and offset not in self.dead
            and offset not in self.reserved
            and self.pending_until.get(offset, 0) <= now
        )

    def pick(self, most: int, now: int, max_deliveries: int) -> list[int]:
        """Up to ``most`` offsets that may be handed out now, in offset order, reserved."""
        if now >= self.rescan_at:  # a message handed out may be handed out again: look from the start
            self.scan_from, self.rescan_at = self.start, _NEVER
        picked: list[int] = []
        messages, pending_until, handed = self.messages, self.pending_until, self.handed
        offset = self.scan_from
        while offset < self.fetched_to and len(picked) < most:
            if offset in messages:
                if self.eligible(offset, now):
                    if self.tries + handed.get(offset, 0) < max_deliveries:
                        self.reserved.add(offset)
                        picked.append(offset)
                elif (until := pending_until.get(offset, 0)) > now:
                    self.rescan_at = min(self.rescan_at, until)  # out with a client: may go out again then
            offset += 1
        self.scan_from = offset
        return picked

    def handed_until(self, offset: int, until: int) -> None:
        """A reserved message is out with a client until ``until`` (monotonic ms)."""
        self.reserved.discard(offset)
        self.pending_until[offset] = until
        if offset < self.scan_from:
            self.rescan_at = min(self.rescan_at, until)

    def free_again(self, offset: int) -> None:
        """``offset`` may be handed out again (cancelled, or its hand-out refused): the next pick looks from it."""
        self.scan_from = min(self.scan_from, offset)

    def complete(self) -> bool:
        """Every message read, and each acked or dead-lettered (offsets without a message need nothing)."""
        return self.fetched() and all(o in self.acked or o in self.dead for o in self.messages)

    def holds_a_client_message(self, now: int) -> bool:
        return (
            any(until > now and o not in self.acked for o, until in self.pending_until.items())
            or bool(self.reserved)
            or bool(self.unwritten)
        )


def given_back(held: ServedLease) -> codec.AckEntry | None:
    """How a range no client holds a message of goes back (range_member.given_back_entry): None, a plain cancel, if
    nothing of it was handed out; else an ack of its prefix up to the first message never handed out."""
    never = [o for o in held.messages if o not in held.handed and o not in held.dead and o not in held.acked]
    return given_back_entry(held, held.fetched_to, never, held.handed, held.acked, held.dead)


def covering(ranges: Mapping[tuple[int, int], ServedLease], partition: int, offset: int) -> ServedLease | None:
    """The held range of ``ranges`` (by (partition, start)) that covers ``offset`` of ``partition``, if any."""
    for held in ranges.values():
        if held.partition == partition and held.start <= offset < held.end:
            return held
    return None


def reserve_dead_letters(
    ranges: Iterable[ServedLease], max_deliveries: int, now: int
) -> list[tuple[ServedLease, int, Any]]:
    """The messages handed out ``max_deliveries`` times (earlier leases' included) and never acked, once their last
    pending time is over, as (lease, offset, message): each reserved, so no client gets it while it is written to
    the dead-letter topic.  Called under the served topic's lock."""
    due = []
    for held in ranges:
        for offset, message in held.messages.items():
            if held.deliveries(offset) >= max_deliveries and held.eligible(offset, now):
                held.reserved.add(offset)
                due.append((held, offset, message))
    return due
