"""How many offsets a shared handler's next range lease covers (docs/shared-partitions.md, "Range sizes").

A fixed range size is a guess that is wrong for most handlers: 100 offsets is a hundredth of a second of a fast
handler (the supervisor then spends its time writing claims and acks, and the worker waiting on them) and
minutes of a slow one (a crash repeats all of it, and one worker sits on offsets others could handle).  So a
shared pool sizes each claim from what its workers measured:

* each worker reports, as it settles a range, how many messages it went through and how long it was busy
  with them (the time its fetches returned messages and its handler ran; not the time it waited for messages at
  a partition's end, which says nothing about the handler);
* a lease should cover :func:`target_span_ms` of that work: the smaller of a sixth of the lease and
  :data:`MOST_SPAN_MS`.  A sixth: the pool renews leases every third of the pending timeout, so a range is
  done well before its lease needs more than one renewal, even if the handler slows down by half; at most
  three seconds: a crash repeats at most a few seconds of work, sharing stays fine-grained, and a fast
  handler still needs only a claim and an ack per several thousand messages;
* between :data:`FLOOR` and :data:`CAP` offsets; the handler's ``range_size`` is the size until a worker has
  measured something;
* never more than a fair share of the topic's backlog (on each partition, its end as known less where its free
  offsets start), split between this member's workers and the workers of other members seen holding leases on
  the topic: near the tail nobody takes the rest alone while others go idle, and the ranges shrink as the
  backlog does.  The topic's, not each partition's: a worker that has a partition to itself (as many workers as
  partitions) reads it to its end in full-sized ranges, with no tail of tiny ones.

Pure, like the rest of the protocol: the caller passes ``now`` (seconds, any monotonic clock) and the
measurements; nothing here reads a clock or Kafka.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import MAX_RANGE, Lease

FLOOR = 1
# 10,000, not the fold's MAX_RANGE (65,536): a worker that crashes in a range acks every offset of it as failed,
# one entry in one record with the other settlements of its pass; 10,000 offsets keep that record small, and a
# fast handler needs no more (a claim and an ack per 10,000 messages is a thousandth of a record per message).
CAP = 10_000
assert CAP <= MAX_RANGE
MOST_SPAN_MS = 3_000
# Measurements fade with this half-life (seconds): a handler that slows down (a dependency gets slow) is seen
# within a few ranges, while one range's noise does not swing the size.
HALF_LIFE_S = 10.0
LEASES_PER_WORKER = 2  # a shared pool keeps each worker supplied with two leases: the range in hand and the next


def target_span_ms(lease_ms: int) -> int:
    """How much handling time one lease should cover: the smaller of a sixth of the lease and three seconds."""
    return max(1, min(lease_ms // 6, MOST_SPAN_MS))


@dataclass
class _Rate:
    """Faded sums of one worker's measurements: messages and busy milliseconds."""

    messages: float = 0.0
    busy_ms: float = 0.0
    at: float = 0.0  # when the last measurement came (the caller's clock, seconds)

    def add(self, messages: int, busy_ms: float, now: float) -> None:
        fade = 0.5 ** (max(0.0, now - self.at) / HALF_LIFE_S) if self.busy_ms else 0.0
        self.messages = self.messages * fade + messages
        self.busy_ms = self.busy_ms * fade + busy_ms
        self.at = now

    @property
    def per_ms(self) -> float:
        return self.messages / self.busy_ms


@dataclass
class RangeSizing:
    """One shared handler's range sizes in one member.  ``initial``: the handler's ``range_size`` (the size before
    any measurement; with ``adaptive`` False, every size); ``lease_ms``: the handler's pending timeout."""

    initial: int
    lease_ms: int
    adaptive: bool = True
    floor: int = FLOOR
    cap: int = CAP
    _rates: dict[Hashable, _Rate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cap = max(self.cap, self.floor)
        self.initial = min(max(self.initial, self.floor), self.cap) if self.adaptive else self.initial

    @property
    def span_ms(self) -> int:
        return target_span_ms(self.lease_ms)

    def observe(self, worker: Hashable, messages: int, busy_ms: float, now: float) -> None:
        """``worker`` went through ``messages`` messages of a range in ``busy_ms`` of handling (its settlement)."""
        if messages <= 0 or busy_ms <= 0 or not math.isfinite(busy_ms):
            return  # nothing handled (a range at the partition's end, all skipped): no news about the rate
        self._rates.setdefault(worker, _Rate()).add(messages, busy_ms, now)

    def rate_per_s(self, worker: Hashable) -> float | None:
        """Messages per second of handling ``worker`` measured; one not measured yet gets its siblings' (the same
        handler in the same member), None before anyone measured anything."""
        rate = self._rates.get(worker)
        if rate is not None:
            return rate.per_ms * 1000
        if not self._rates:
            return None
        return sum(r.messages for r in self._rates.values()) / sum(r.busy_ms for r in self._rates.values()) * 1000

    def size_for(self, worker: Hashable) -> int:
        """Offsets of ``worker``'s next lease, before the backlog's share bound: the target span at its rate."""
        if not self.adaptive:
            return self.initial
        rate = self.rate_per_s(worker)
        if rate is None:
            return self.initial
        in_span = rate * self.span_ms / 1000
        return self.cap if not in_span < self.cap else self._clamp(math.floor(in_span))  # inf: a near-zero time

    def claim_size(self, workers: Iterable[Hashable]) -> int:
        """The size of one claim for ``workers`` (the pool claims for every hungry worker at once and hands the
        ranges to whichever needs one): the smallest of theirs, so that none gets more than its span."""
        return min((self.size_for(w) for w in workers), default=self.initial)

    def shared_size(self, size: int, backlog: int, sharers: int) -> int:
        """``size`` bounded by a fair share of ``backlog`` offsets among ``sharers`` workers (at least one, at least
        ``floor`` offsets).  A fixed size (not ``adaptive``) is what the user asked for: left as it is."""
        if not self.adaptive:
            return size
        share = math.ceil(max(backlog, 0) / max(sharers, 1))
        return self._clamp(min(size, share))

    def sizer(self, hungry: Iterable[Hashable], our_workers: int, me: MemberId | None) -> BacklogSizer:
        """The size of one claim by ``me`` for its ``hungry`` workers, ``our_workers`` in all, given the backlog."""
        return BacklogSizer(self, self.claim_size(hungry), max(our_workers, 1), me)

    def _clamp(self, size: int) -> int:
        return min(max(size, self.floor), self.cap)


@dataclass(frozen=True)
class BacklogSizer:
    """The size of one claim's ranges: ``size`` bounded by the topic's backlog shared among ``our_workers`` and the
    other members' workers, estimated from their live leases on the topic (a pool keeps two per worker; any lease
    at all is at least one worker)."""

    sizing: RangeSizing
    size: int
    our_workers: int
    me: MemberId | None

    def __call__(self, backlog: int, live: Iterable[Lease]) -> int:
        others = [lease.holder for lease in live if lease.holder != self.me]
        other_workers = 0
        for holder in set(others):
            other_workers += max(1, math.ceil(others.count(holder) / LEASES_PER_WORKER))
        return self.sizing.shared_size(self.size, backlog, self.our_workers + other_workers)
