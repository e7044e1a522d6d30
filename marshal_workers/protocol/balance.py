"""Fair balance (``balance = "fair"``): pure decisions about how many partitions to hold.

Each supervisor computes the same fair share from the world state: the
group's partitions divided by its live members, rounded down (``low``) and
up (``high``).

* Claiming: a supervisor claims a partition that has just become free only
  up to ``high``, and not while a member that is asking for partitions could
  take it; a partition still free after a heartbeat interval may be taken by
  anyone with room (``max_partitions``), so nothing stays unowned because of
  the balance.
* Asking: a supervisor below ``low`` (and below its own ``max_partitions``)
  with nothing free to claim asks for a partition once per HB: a claim of the
  busiest member's partition, refused while its owner lives.  The refused
  claim is in the log, so every member sees who is asking.  So does one below
  ``high`` while another member holds more than ``high``: 8 partitions over 3
  members (a band of 2 to 3) held 4/2/2 would otherwise stay so, nobody being
  below the floor (the simulator found it: docs/simulation.md).
* Giving: partitions move only towards members that ask.  Their shortfall
  (up to ``low`` each) is covered one partition at a time by the busiest
  member (ties broken by name, so every member agrees who gives); then, by
  members above ``high`` only, one more each for askers still below ``high``.

Hysteresis keeps it from flapping:

* a band: nobody asks while it holds ``low`` or more, and nobody gives
  unless someone asks, so a group within the band never moves (nor does a
  member capped by ``max_partitions``, which never asks beyond its cap);
* time: a member gives only once the need has lasted ``settle_s``, so a
  member seen for one heartbeat does not reshuffle the group; and a
  partition handed over is not claimed back by the same supervisor at once.

Time is an argument (seconds on any monotonic clock); nothing here reads a
clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")
M = TypeVar("M")


@dataclass(frozen=True)
class FairShare:
    low: int  # fewer than this: ask for more
    high: int  # claim freshly freed partitions up to this


def fair_share(total_partitions: int, members: int) -> FairShare:
    """The band every member should hold within: floor and ceiling of total / members."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    low, rest = divmod(total_partitions, members)
    return FairShare(low=low, high=low + (1 if rest else 0))


def greedy_claims(free: int, members: int, least: int) -> int:
    """balance="greedy": how many of ``free`` partitions a member claims in one round: its part of them, so
    that members starting together share, but at least ``least`` (a lone member takes everything at once)."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    return min(free, max(least, -(-free // members)))


def partitions_to_hand_over(me: M, counts: Mapping[M, int], share: FairShare, asking: Collection[M]) -> int:
    """How many of its partitions ``me`` should hand over, every member seeing the same counts and askers.

    The askers' shortfall (up to ``low`` each) is covered one partition at a
    time by whoever holds the most at that point, ties broken by name; nobody
    gives below ``low``.
    """
    remaining = dict(counts)
    to_the_floor = sum(max(share.low - counts.get(m, 0), 0) for m in asking)
    given = _cover(me, remaining, to_the_floor, keep=share.low)
    # Then towards the ceiling, from those above it only: within the band nothing moves.
    to_the_ceiling = sum(1 for m in asking if max(counts.get(m, 0), share.low) < share.high)
    return given + _cover(me, remaining, to_the_ceiling, keep=share.high)


def _cover(me: M, remaining: dict[M, int], need: int, keep: int) -> int:
    """Cover ``need`` partitions one at a time from whoever holds the most (ties by name), none giving below
    ``keep``: how many of them ``me`` gives.  ``remaining`` is updated."""
    given = 0
    for _ in range(need):
        busiest = max(remaining, key=lambda m: (remaining[m], str(m)))
        if remaining[busiest] <= keep:
            break
        remaining[busiest] -= 1
        given += busiest == me
    return given


@dataclass(frozen=True)
class BalanceState:
    """What a supervisor remembers between balance cycles."""

    need_since: float | None = None  # since when it has had partitions to hand over


def settled(state: BalanceState, wanted: int, now: float, settle_s: float) -> tuple[BalanceState, int]:
    """How many to hand over now: 0 until the need has lasted ``settle_s`` (a member seen once moves nothing)."""
    if wanted <= 0:
        return BalanceState(), 0
    since = now if state.need_since is None else state.need_since
    if now - since < settle_s:
        return BalanceState(need_since=since), 0
    return BalanceState(), wanted  # handed over: the clock starts again if a need reappears


def claim_cap(share: FairShare, max_partitions: int) -> int:
    """The most partitions to hold when claiming freshly freed ones (max_partitions 0: no cap of its own)."""
    return share.high if not max_partitions else min(share.high, max_partitions)


def is_hungry(held: int, share: FairShare, max_partitions: int, others_most: int = 0) -> bool:
    """Below the band (and below our own cap), or below its ceiling while another member holds more than the
    ceiling (``others_most``: the most any other member holds): worth asking others for a partition."""
    floor, ceiling = (
        (share.low, share.high)
        if not max_partitions
        else (min(share.low, max_partitions), min(share.high, max_partitions))
    )
    return held < floor or (held < ceiling and others_most > share.high)


def yields_to_askers(me: M, counts: Mapping[M, int], share: FairShare, asking: Collection[M]) -> bool:
    """Another member asks and holds fewer than ``low``, and we do not: a partition just freed is theirs first.

    (A partition that stays free for a heartbeat interval is anyone's, so
    nothing waits for a member that cannot take it.)
    """
    return counts.get(me, 0) >= share.low and any(counts.get(m, 0) < share.low for m in asking if m != me)


def partition_to_ask_for(owned: Mapping[M, Iterable[K]], me: M) -> K | None:
    """A partition of the member holding the most, to ask for; None if no other member holds any."""
    counts = {member: sorted(keys) for member, keys in owned.items() if member != me}  # type: ignore[type-var]
    counts = {member: keys for member, keys in counts.items() if keys}
    if not counts:
        return None
    busiest = max(counts, key=lambda member: (len(counts[member]), str(member)))
    return counts[busiest][-1]
