"""Fair balance (``balance = "fair"``): pure decisions about how many partitions to hold.

Each supervisor computes the same fair share from the world state: the
group's partitions divided by its live members, rounded down (``low``) and
up (``high``).  It claims free partitions only up to ``high``.  A supervisor
holding more than ``high`` hands the surplus over by clean release, and the
busiest give one each while a member holds fewer than ``low``.  A member
below ``low`` with nothing free to claim asks for a partition: a claim of a
busy member's partition, refused while its owner is alive, but it makes the
asker a live member in everyone's world state, so the owners see the new
share.

Two kinds of hysteresis keep it from flapping:

* a band: nothing moves while every member holds between ``low`` and ``high``;
* time: a surplus is handed over only after it has lasted ``settle_s``, so a
  member that shows up for one heartbeat does not reshuffle the group; and
  a partition handed over is not claimed back by the same supervisor at once.

Time is an argument (seconds on any monotonic clock); nothing here reads a
clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")
M = TypeVar("M")


@dataclass(frozen=True)
class FairShare:
    low: int  # fewer than this: ask for more
    high: int  # more than this: hand the surplus over


def fair_share(total_partitions: int, members: int) -> FairShare:
    """The band every member should hold within: floor and ceiling of total / members."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    low, rest = divmod(total_partitions, members)
    return FairShare(low=low, high=low + (1 if rest else 0))


def partitions_to_hand_over(me: M, counts: Mapping[M, int], share: FairShare) -> int:
    """How many of its partitions ``me`` should hand over, every member seeing the same ``counts``.

    Above ``high``: the surplus.  And while some member holds fewer than
    ``low`` (a newcomer, or one that asked) and the surpluses do not cover
    it, the busiest members (ties broken by name, so all agree who) give one
    each: otherwise 10 partitions over 3 members could rest at 4, 4 and 2.
    """
    mine = counts.get(me, 0)
    surplus = max(mine - share.high, 0)
    shortfall = sum(share.low - n for n in counts.values() if n < share.low)
    shortfall -= sum(n - share.high for n in counts.values() if n > share.high)
    if shortfall > 0 and mine > share.low:
        givers = sorted((m for m, n in counts.items() if n > share.low), key=lambda m: (-counts[m], str(m)))
        if me in givers[:shortfall]:
            surplus += 1
    return surplus


@dataclass(frozen=True)
class BalanceState:
    """What a supervisor remembers between balance cycles."""

    surplus_since: float | None = None  # when it started having partitions to hand over


def settled_surplus(state: BalanceState, surplus: int, now: float, settle_s: float) -> tuple[BalanceState, int]:
    """The surplus to hand over now: 0 until it has lasted ``settle_s`` (a member seen once moves nothing)."""
    if surplus <= 0:
        return BalanceState(), 0
    since = now if state.surplus_since is None else state.surplus_since
    if now - since < settle_s:
        return BalanceState(surplus_since=since), 0
    return BalanceState(), surplus  # handed over: the clock starts again if a surplus reappears


def claim_cap(share: FairShare, max_partitions: int) -> int:
    """The most partitions to hold when claiming free ones (max_partitions 0: no cap of its own)."""
    return share.high if not max_partitions else min(share.high, max_partitions)


def is_hungry(held: int, share: FairShare, max_partitions: int) -> bool:
    """Below the band (and below our own cap): worth asking others for a partition."""
    wanted = share.low if not max_partitions else min(share.low, max_partitions)
    return held < wanted


def yields_to_hungry(me: M, counts: Mapping[M, int], share: FairShare) -> bool:
    """Another member holds fewer than ``low`` and we do not: a partition just freed is theirs first.

    (The supervisor still claims one that stays free for a heartbeat interval, so
    nothing waits for a member that cannot take it.)
    """
    return counts.get(me, 0) >= share.low and any(n < share.low for m, n in counts.items() if m != me)


def partition_to_ask_for(owned: Mapping[M, Iterable[K]], me: M) -> K | None:
    """A partition of the member holding the most (more than one), to ask for; None if nobody has a surplus."""
    counts = {member: sorted(keys) for member, keys in owned.items() if member != me}  # type: ignore[type-var]
    if not counts:
        return None
    busiest = max(counts, key=lambda member: (len(counts[member]), str(member)))
    keys = counts[busiest]
    return keys[-1] if len(keys) > 1 else None
