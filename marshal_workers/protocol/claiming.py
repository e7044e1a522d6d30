"""One member's decisions about whole partitions: claim, heartbeat, balance, health, and what verdicts mean.

The member core's whole partitions (member/partition_holding.py) sequence these decisions, and the supervisor's
component for whole partitions (runtime/supervisor/partition_claims.py) and the simulator
(marshal_workers/simulation/) drive the core, so what the simulator proves is about the supervisor's own policy,
not a model of it.  Every decision is this object's, over plain data: the folded world (a ``WorldState``), the
partitions held, ``now`` (seconds on a monotonic clock, for its own schedule and cool-downs) and ``now_ms`` (the
time to compare with record times), and an injected ``random.Random`` for the jitter and the order of claims.

Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
import functools
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from marshal_workers.protocol.balance import (
    BalanceState,
    claim_cap,
    fair_share,
    greedy_claims,
    is_hungry,
    partition_to_ask_for,
    partitions_to_hand_over,
    settled,
    yields_to_askers,
)
from marshal_workers.protocol.health import HealthPolicy, PartitionHealth, Sample, Verdict, observe
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

Key = tuple[str, int]
CLAIMS_PER_TICK = 4  # our first claims (others see us), and partitions free for an HB, per round
CLAIM_INTERVAL_S = 0.25  # between two rounds of claims (jittered), unless a release comes first


@dataclass(frozen=True)
class ClaimingSettings:
    """The settings the policy obeys (a member's Settings, or the simulator's)."""

    heartbeat_s: float
    balance: str = "greedy"  # "greedy" or "fair" (balance.py)
    max_partitions: int = 0  # 0: no cap
    sick_cooldown_s: float = 60.0  # a partition released as sick is not claimed back for this long
    release_if_behind: bool = True
    behind_cycles: int = 5

    def health_policy(self, call_time_limit: float) -> HealthPolicy:
        """A topic's health policy: a worker silent for an HB with lag is stalled; a handler call in flight is
        progress until it passes ``call_time_limit`` (the hard time limit, else the soft one; 0: never)."""
        return HealthPolicy(
            behind_cycles=self.behind_cycles, stall_after_s=self.heartbeat_s, call_time_limit=call_time_limit
        )


def lease_until(written_ms: int, heartbeat_ms: int) -> int:
    """How long a worker may handle messages after its member's accepted record written at ``written_ms`` (on
    the member's monotonic clock, read before the write): 2*HB, minus half an HB of safety.  The fold lets
    another member take the partition 2*HB after the record's time, which is later than its write."""
    return written_ms + int(1.5 * heartbeat_ms)


@functools.lru_cache(maxsize=16)
def all_keys(partition_counts: tuple[tuple[str, int], ...]) -> tuple[Key, ...]:
    """Every (topic, partition) of ``partition_counts`` ((topic, count) pairs), in their order."""
    return tuple((topic, p) for topic, count in partition_counts for p in range(count))


class Rebalance(NamedTuple):
    """One balance cycle's decisions."""

    hand_over: list[Key]  # partitions to hand over (the most recently claimed of those offered)
    ask: Key | None  # a partition to ask for: a claim, refused while its owner lives, that every member sees


class HealthCall(enum.Enum):
    KEEP = "keep"  # the worker keeps up, or releasing is off
    HAND_OVER = "hand over"  # it cannot keep up and another member could take it: stop it, release as sick
    NO_ONE_ELSE = "no one else"  # it cannot keep up but no other member is live: keep it, judge it afresh


class ClaimingPolicy:
    """A member's decisions about whole partitions, and what it remembers between them.

    The caller tells it what it wrote (``claims_sent``, ``released``) and the verdicts (``claims_decided``,
    ``claims_failed``, ``release_decided``), so it knows what is in flight.
    """

    def __init__(self, me: MemberId, settings: ClaimingSettings, rng: random.Random) -> None:
        self.me = me
        self.settings = settings
        self.rng = rng
        self.cooldown_until: dict[Key, float] = {}  # partitions released as sick or handed over
        self._sick_until: dict[Key, float] = {}  # those released as sick (they count as ours for the balance)
        self._claiming: set[Key] = set()  # claims in flight
        self._releasing: set[Key] = set()  # releases in flight
        self._announced = False  # our first claims are written: later rounds claim our part at once
        self._balance = BalanceState()
        self._free_since: dict[Key, float] = {}  # when a partition was first seen free
        self._next_heartbeat = 0.0  # the times at which each is next due
        self._next_claim = 0.0
        self._next_ask = 0.0  # the next time we may ask another member for a partition

    def _keys(self, partition_counts: Mapping[str, int]) -> tuple[Key, ...]:
        """Every (topic, partition), in the order of ``partition_counts``: one tuple for equal counts, which the
        fold's free_partitions keeps its answer for while no partition changes owner."""
        return all_keys(tuple(partition_counts.items()))

    # ----------------------------------------------------------- schedule

    def release_seen(self) -> None:
        """A partition was released in the log: try to take it now, not at the next round."""
        self._next_claim = 0.0

    def heartbeat_due(self, now: float) -> bool:
        """Heartbeat and balance every HB/2 (True: now, and the next is scheduled)."""
        if now < self._next_heartbeat:
            return False
        self._next_heartbeat = now + self.settings.heartbeat_s / 2
        return True

    def claim_due(self, now: float) -> bool:
        """Claim free partitions every CLAIM_INTERVAL_S, jittered so that members starting together interleave."""
        if now < self._next_claim:
            return False
        self._next_claim = now + CLAIM_INTERVAL_S * self.rng.uniform(0.5, 1.5)
        return True

    # ------------------------------------------------------------- claims

    def partitions_to_claim(
        self, world: WorldState, partition_counts: Mapping[str, int], held: Collection[Key], now: float, now_ms: int
    ) -> list[Key]:
        """The free partitions to claim this round (the caller writes the claims, then calls ``claims_sent``)."""
        settings = self.settings
        room = (settings.max_partitions or float("inf")) - (len(held) + len(self._claiming))
        if room <= 0:
            return []
        busy = set(held) | self._claiming | self._releasing
        cooldown = self.cooldown_until
        # Free first, then ours to take: few are free, so the second filter is cheap (the order is the keys').
        free = [
            key
            for key in world.free_partitions(self._keys(partition_counts), now_ms, *self.me)
            if key not in busy and cooldown.get(key, 0) <= now
        ]
        self._free_since = {key: self._free_since.get(key, now) for key in free}
        self.rng.shuffle(free)
        if not free:
            return []  # (what follows would choose none of none)
        if not self._announced:
            # Our first claims tell the members that start with us that we are here: claim a few, then our part.
            free = free[:CLAIMS_PER_TICK]
        elif settings.balance == "fair":
            free = self._fair_claims(world, free, sum(partition_counts.values()), len(held), now, now_ms)
        else:
            members = len(self.group_view(world, now_ms)[0])
            free = free[: greedy_claims(len(free), members, CLAIMS_PER_TICK)]
        if free:
            self._announced = True
        return free[: int(min(room, len(free)))]

    def _fair_claims(
        self, world: WorldState, free: list[Key], total: int, held: int, now: float, now_ms: int
    ) -> list[Key]:
        """balance="fair": which free partitions to claim.  One freed just now only up to our share, and not
        while a member that asks for partitions could take it; one free for an HB is anyone's (a few a round)."""
        counts, askers = self.group_view(world, now_ms)
        share = fair_share(total, len(counts))
        hb_s = self.settings.heartbeat_s
        long_free = [key for key in free if now - self._free_since[key] >= hb_s][:CLAIMS_PER_TICK]
        if yields_to_askers(self.me, counts, share, askers):
            return long_free
        room = claim_cap(share, self.settings.max_partitions) - (held + len(self._claiming))
        just_freed = [key for key in free if now - self._free_since[key] < hb_s]
        return just_freed[: max(room, 0)] + long_free

    def claims_sent(self, keys: Sequence[Key]) -> list[Key]:
        """Claims about to be written: those not already in flight (now in flight)."""
        keys = [key for key in keys if key not in self._claiming]
        self._claiming.update(keys)
        return keys

    def claims_decided(self, keys: Sequence[Key], verdicts: Sequence[bool]) -> list[Key]:
        """The claims' verdicts came: the partitions won."""
        self._claiming.difference_update(keys)
        return [key for key, accepted in zip(keys, verdicts) if accepted]

    def claims_failed(self, keys: Sequence[Key]) -> None:
        self._claiming.difference_update(keys)

    def in_flight(self) -> int:
        """Claims in flight (they count towards what we hold)."""
        return len(self._claiming)

    # ------------------------------------------------------------ balance

    def group_view(self, world: WorldState, now_ms: int) -> tuple[dict[MemberId, int], set[MemberId]]:
        """The live members of the group (us included) with the partitions each holds, and who asks for more."""
        view = world.group_view(now_ms)
        counts = dict(view.counts)
        counts.setdefault(self.me, 0)
        return counts, set(view.askers)

    def rebalance(
        self, world: WorldState, total_partitions: int, held: int, offered: Sequence[Key], now: float, now_ms: int
    ) -> Rebalance:
        """balance="fair": hand partitions over to members that ask, and ask when we hold too few.

        ``held``: every partition we hold; ``offered``: those we could hand over (not lost, sick or already
        being handed over), the oldest claim first.  Asking is a claim of the busiest member's partition:
        refused while its owner lives, but the refusal is in the log, so every member sees who asks.  With
        balance="greedy" only an idle member asks, so the health monitor knows someone could take a partition.
        """
        settings = self.settings
        hand_over: list[Key] = []
        if settings.balance == "fair":
            view = world.group_view(now_ms)
            counts, askers = dict(view.counts), set(view.askers)
            counts[self.me] = len(offered)
            share = fair_share(total_partitions, len(counts))
            # Partitions we released as sick count as ours while we keep away from them: asking would only have
            # them handed back to us, which the cool-down keeps us from taking, and they would go back and forth.
            holding = held + self.sick_cooling_down(now)
            hungry = is_hungry(holding, share, settings.max_partitions, view.most_held_by_others(self.me))
            if hungry:
                askers.add(self.me)  # about to ask, if not already
            wanted = partitions_to_hand_over(self.me, counts, share, askers)
            self._balance, count = settled(self._balance, wanted, now, settle_s=settings.heartbeat_s)
            hand_over = list(offered[len(offered) - count :]) if count else []
        else:
            hungry = not held
        ask = None
        if hungry and now >= self._next_ask and not world.is_paused(now_ms):
            self._next_ask = now + settings.heartbeat_s  # once per HB keeps us visible (2*HB) at one record per HB
            ask = partition_to_ask_for(world.holdings(now_ms), self.me)
        return Rebalance(hand_over, ask)

    def share(self, world: WorldState, total_partitions: int, now_ms: int) -> tuple[int, int]:
        """Our fair share (low, high) as the group looks now: for the log line of a hand-over."""
        counts, _ = self.group_view(world, now_ms)
        share = fair_share(total_partitions, len(counts))
        return share.low, share.high

    # ----------------------------------------------------------- releases

    def handed_over(self, key: Key, now: float) -> None:
        """A partition handed over: not ours to take back when its release wakes our claims; it is meant for
        another member."""
        self.cooldown_until[key] = now + 2 * self.settings.heartbeat_s

    def released(self, key: Key, sick: bool, now: float) -> None:
        """A release about to be written (as sick: not claimed back here for sick_cooldown)."""
        if sick:
            self.cooldown_until[key] = self._sick_until[key] = now + self.settings.sick_cooldown_s
        self._releasing.add(key)

    def release_decided(self, key: Key) -> None:
        """A release's verdict came (or it failed): it is no longer in flight."""
        self._releasing.discard(key)

    def cooling_down(self, now: float) -> list[Key]:
        """The partitions released as sick (or handed over) that we do not claim again yet."""
        return [key for key, until in list(self.cooldown_until.items()) if until > now]

    def sick_cooling_down(self, now: float) -> int:
        """How many partitions released as sick we still keep away from."""
        for key in [key for key, until in self._sick_until.items() if until <= now]:
            del self._sick_until[key]
        return len(self._sick_until)

    def stopped(self) -> bool:
        """No claim or release in flight."""
        return not self._claiming and not self._releasing

    # ------------------------------------------------------------- health

    def judge_health(
        self, health: PartitionHealth, sample: Sample, policy: HealthPolicy, running: bool, others: Callable[[], bool]
    ) -> tuple[PartitionHealth, Verdict, HealthCall]:
        """One health cycle of a partition whose heartbeat was accepted: keep it, or hand it over if its worker
        cannot keep up and another member could take it.  ``others``: is any other member live (asked only when
        it matters)?"""
        health, verdict = observe(health, sample, policy)
        if not verdict.release or not self.settings.release_if_behind or not running:
            return health, verdict, HealthCall.KEEP
        if not others():
            return PartitionHealth(), verdict, HealthCall.NO_ONE_ELSE  # judge it afresh rather than warn every cycle
        return health, verdict, HealthCall.HAND_OVER

    def others_live(self, world: WorldState, now_ms: int) -> bool:
        """Is any member of the group other than us live (could it take a partition we release)?"""
        return bool(world.live_members(now_ms) - {self.me})
