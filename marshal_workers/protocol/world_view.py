"""What the fold knows of one group, and the questions asked of it: the read side of the world state.

:class:`WorldView` holds all that the fold of the coordination log (world_state.py, docs/protocol.md) keeps about a
group: owners, offsets, pauses, operators' orders, the range leases of shared partitions, and what the reader knows
of the log itself (the groups it saw, counts).  Its queries answer what members, supervisors and tools ask: who
owns what and how fresh it is, what is free to claim, who is in the group and what each holds, what operators
ordered.  A query that depends on the time takes ``now``; none reads a clock.  ``WorldState`` (world_state.py) is
a WorldView that folds records into itself.

The questions members ask most (every claim round, every balance cycle) are answered from indexes kept here and
kept up by the fold as it changes owners (``_set_owner``, ``_owned_at``): the owners and their counts, a lower
bound of the owned partitions' record times, the partitions an operator asked to hand over, and answers kept while
no owner changes.  Each answers as a scan of the partitions would (tests/unit/protocol/test_world_view.py).
"""

from __future__ import annotations

import copy
import enum
import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from marshal_workers.protocol import done_set
from marshal_workers.protocol.codec import coordination_partition
from marshal_workers.protocol.field_copies import copier
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import SharedPartition


class Liveness(str, enum.Enum):
    """How a partition looks at a given time (the ``state`` column of ``status``)."""

    FRESH = "fresh"  # owned, heartbeat younger than HB
    UNKNOWN = "unknown"  # owned, heartbeat between HB and 2*HB old
    STALE = "stale"  # owned, heartbeat older than 2*HB: anyone may claim it
    RELEASED = "released"  # known to the log, no owner
    UNCLAIMED = "unclaimed"  # never mentioned by the log


@dataclass(slots=True)
class PartitionState:
    """What the log says about one (topic, partition) of the group."""

    owner: MemberId | None = None
    last_ts: int = 0  # record time of the owner's last claim, heartbeat or claim_messages
    offset: int | None = None  # from heartbeats and releases
    amo_offset: int | None = None  # from claim_messages
    # The offsets done above ``offset`` (done_set runs), from the same heartbeat or release; None: none.
    done: tuple[int, ...] | None = None
    # The owner's optional report in its last heartbeat (numbers >= 0 only: see codec.reported_number).
    lag: int | float | None = None
    rate: int | float | None = None
    in_flight: int | float | None = None  # handler calls running (concurrency inside a worker)
    window_used: int | float | None = None  # offsets from the lowest unfinished message to the furthest fetched
    call_age_s: int | float | None = None  # seconds the oldest handler call in flight had been running
    # An operator asked the owner to hand the partition over (release_partition); cleared when the owner changes.
    release_requested: bool = False

    def copy(self) -> PartitionState:
        """An equal, independent copy (every field; copy_on_write.copy_before makes one per partition a record is
        about)."""
        return _copy_partition_state(self)

    def clear_report(self) -> None:
        """Forget the owner's optional report (a new owner, none, or a pause): it was the previous owner's."""
        for name in REPORT_FIELDS:
            setattr(self, name, None)

    @property
    def resume_offset(self) -> int | None:
        """Where a new owner starts: max(offset, amo_offset), or None if neither is known."""
        if self.offset is None:
            return self.amo_offset
        if self.amo_offset is None:
            return self.offset
        return max(self.offset, self.amo_offset)

    def skip_ranges(self) -> list[tuple[int, int]]:
        """The offsets at or above ``resume_offset`` that a new owner must not process: half-open ranges.

        Together with ``resume_offset`` this is the whole position: process every
        offset from ``resume_offset`` on except these (the previous owner did them
        out of order).  Below ``amo_offset`` nothing is delivered anyway, so the
        done set is moot where the two overlap and the ranges are clipped to it.
        """
        if self.done is None or self.offset is None:
            return []
        floor = self.resume_offset or 0
        return [(max(start, floor), stop) for start, stop in done_set.decode(self.offset, self.done) if stop > floor]


_copy_partition_state = copier(PartitionState)
# The owner's optional report in its heartbeats, for people (status, metrics): numbers checked by
# codec.reported_number wherever they come from, forgotten with the owner that sent them.
REPORT_FIELDS = ("lag", "rate", "in_flight", "window_used", "call_age_s")


@dataclass(slots=True, frozen=True)
class Pause:
    """A ``release_group`` as seen on one coordination partition."""

    until: int
    client: str  # only this client's releases may set positions during the pause


@dataclass(slots=True)
class Controls:
    """The operators' orders about clients (``control`` records) as seen on one coordination partition.

    Kept per coordination partition, as pauses are: a claim is checked against the copy ordered with it.
    """

    drained: dict[str, int] = field(default_factory=dict)  # client -> time of the drain order still in force
    shutdowns: dict[str, int] = field(default_factory=dict)  # client -> time of its latest shutdown order

    def copy(self) -> Controls:
        """An equal, independent copy (field_copies.py)."""
        return _copy_controls(self)


_copy_controls = copier(Controls)


@dataclass(frozen=True)
class GroupView:
    """Who is in the group at a time, as the fold knows it: every live member with how many partitions it holds
    (0: it only claims), and the members that ask for more (``live_members``, ``holding_counts`` and ``askers``
    at one ``now``).  Every member's balance cycle asks for it (claiming.py)."""

    counts: Mapping[MemberId, int]  # shared by every caller: read it, copy it to change it
    askers: frozenset[MemberId]
    most: tuple[tuple[int, MemberId], ...]  # the (at most) two members that hold the most, the most first

    def most_held_by_others(self, me: MemberId) -> int:
        """The most partitions any member other than ``me`` holds (0: no other member)."""
        return next((held for held, owner in self.most if owner != me), 0)


@dataclass(slots=True)
class LogStats:
    """Counts of what the fold saw; part of the state, so equal logs give equal counts."""

    applied: int = 0  # records of this group that were folded
    accepted: int = 0  # of those, the ones that changed ownership, offsets or pauses
    other_groups: int = 0  # valid records of other groups, skipped
    misrouted: int = 0  # records on the wrong coordination partition, skipped
    garbage: int = 0  # values that did not decode (counted by the reader)

    def copy(self) -> LogStats:
        """An equal, independent copy (field_copies.py)."""
        return _copy_log_stats(self)


_copy_log_stats = copier(LogStats)


@dataclass(slots=True)
class WorldView:
    """Ownership, offsets and pauses of one group, as folded from the coordination log (by WorldState).

    ``coordination_partitions`` is the partition count of the coordination
    topic; with it the fold checks the md5 routing of every record.  Leave it
    None to fold a single log without routing checks (tests, tools).
    """

    group: str
    heartbeat_ms: int
    coordination_partitions: int | None = None
    partitions: dict[tuple[str, int], PartitionState] = field(default_factory=dict)
    pauses: dict[int, Pause] = field(default_factory=dict)
    # Every instance that claimed a partition, accepted or not: the time of its latest claim, and its client.
    # With the owners this gives the live members (a member asks for partitions to be seen: see balance.py).
    last_claim: dict[str, int] = field(default_factory=dict)
    # The time of each instance's latest claim refused because the partition had a live owner: who is
    # asking for partitions (fair balance, see balance.py).
    last_refused_claim: dict[str, int] = field(default_factory=dict)
    clients: dict[str, str] = field(default_factory=dict)
    # The time of the latest checkpoint on each coordination partition, and the offset it describes the log up to
    # (its ``as_of``) with the records it took (its parts): who writes the next, and when (checkpoints.py).
    checkpoints: dict[int, int] = field(default_factory=dict)
    checkpoint_offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Shared partitions (docs/shared-partitions.md): range leases, done offsets and tries, by (topic, partition).
    shared: dict[tuple[str, int], SharedPartition] = field(default_factory=dict)
    # Remote control: orders about clients by coordination partition, and topic pauses (expiry).
    controls: dict[int, Controls] = field(default_factory=dict)
    topic_pauses: dict[str, int] = field(default_factory=dict)
    stats: LogStats = field(default_factory=LogStats)
    # Per coordination partition, the names of every group with a record read there (this one's and others'),
    # since this reader started there; ``directory_known``: the partitions where that covers everything from the
    # partition's start (it started there, or at a checkpoint that listed the groups before it, or learned them
    # since: learn_groups_before).  Checkpoints carry it, so that a reader of a group it does not
    # name starts there (checkpoints.py).  Knowledge about the log, not the group: readers that agree on the
    # group may know more or less of it.
    groups_seen: dict[int, set[str]] = field(default_factory=dict, compare=False, repr=False)
    directory_known: set[int] = field(default_factory=set, compare=False, repr=False)
    _too_many_groups: set[int] = field(default_factory=set, compare=False, repr=False)  # past MAX_DIRECTORY
    _routes: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # topic -> coordination partition
    # An index for free_partitions, kept by the fold: at most the record time of every owned partition's latest
    # claim or heartbeat (None: not known, the next free_partitions scans and learns it).  While ``now`` is
    # within 2*HB of it no partition can be stale, so the members' claim rounds skip the staleness test.
    _oldest_owned_ts: int | None = field(default=None, compare=False, repr=False)
    # And the owners, by partition, with how many each holds (None: not known, learned at the next query).
    _owners: dict[tuple[str, int], MemberId] | None = field(default=None, compare=False, repr=False)
    _owner_counts: dict[MemberId, int] = field(default_factory=dict, compare=False, repr=False)
    _client_counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # the same, by client
    # Answers kept while no partition changes owner (cleared by _set_owner): free_partitions' common case for a
    # tuple of keys (the same tuple object: a tuple cannot change), and the holdings while none is stale.
    _free_memo: tuple[tuple[tuple[str, int], ...], list[tuple[str, int]]] | None = field(
        default=None, compare=False, repr=False
    )
    _holdings_memo: dict[MemberId, list[tuple[str, int]]] | None = field(default=None, compare=False, repr=False)
    # The partitions whose owner an operator asked to hand them over (None: not known, learned at the next query):
    # every member asks for its own every heartbeat (orders.py), and a scan of every partition for a flag that is
    # almost never set was most of a large fleet's fold cost.
    _release_requests: set[tuple[str, int]] | None = field(default=None, compare=False, repr=False)
    # group_view's answer, with the span of ``now`` [lo, hi] it holds for while none is stale, in a box that the
    # copies of copy_on_write.copy_before share until their fold changes the members (a claim, a change of owner:
    # those put a new box in place).  Members at different places in the log and times then share one answer.
    _view_box: list[tuple[int, int, GroupView] | None] = field(
        default_factory=lambda: [None], compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.heartbeat_ms <= 0:
            raise ValueError(f"heartbeat_ms must be > 0, got {self.heartbeat_ms}")

    # ----------------------------------- asked by the rules and the queries

    def routed_here(self, topic: str, source: int) -> bool:
        """Is coordination partition ``source`` the one that carries every record about ``topic``?"""
        count = self.coordination_partitions
        return count is None or coordination_partition(topic, count) == source

    def _claimable_by(self, state: PartitionState, client: str, instance: str, at: int) -> bool:
        owner = state.owner
        return (
            owner is None
            or at - state.last_ts > 2 * self.heartbeat_ms
            # Fast reclaim: a restarted program (same client, new instance) takes its partitions back.
            or (owner.client == client and owner.instance != instance)
        )

    def paused_at(self, source: int, at: int) -> Pause | None:
        """The pause in force at ``at`` on coordination partition ``source`` (the copy a record there is checked
        against), or None."""
        pause = self.pauses.get(source)
        return pause if pause is not None and at < pause.until else None

    def held_back(self, client: str, topic: str, source: int, at: int) -> bool:
        """May ``client`` not claim ``topic`` at ``at``: drained (on this coordination partition) or topic paused?"""
        controls = self.controls.get(source)
        return (controls is not None and client in controls.drained) or at < self.topic_pauses.get(topic, 0)

    # ----------------------------------------- indexes, kept up by the fold

    def _owned_at(self, at: int) -> None:
        """An owned partition's record time is now ``at``: keep the free_partitions index a lower bound."""
        oldest = self._oldest_owned_ts
        if oldest is not None and at < oldest:
            self._oldest_owned_ts = at

    def _set_owner(self, key: tuple[str, int], state: PartitionState, owner: MemberId | None) -> None:
        """The one place the fold changes a partition's owner: the free_partitions index follows, and an
        operator's request to hand the partition over is done with (it asked the previous owner)."""
        self._free_memo = self._holdings_memo = None
        self._view_box = [None]
        if state.release_requested:
            state.release_requested = False
            if self._release_requests is not None:
                self._release_requests.discard(key)
        owners = self._owners
        if owners is not None:
            counts, by_client = self._owner_counts, self._client_counts
            previous = owners.pop(key, None)
            if previous is not None:
                _count_down(counts, previous)
                _count_down(by_client, previous[0])
            if owner is not None:
                owners[key] = owner
                counts[owner] = counts.get(owner, 0) + 1
                by_client[owner[0]] = by_client.get(owner[0], 0) + 1
        state.owner = owner

    def _owner_index(self) -> dict[tuple[str, int], MemberId]:
        owners = self._owners
        if owners is None:
            owners = self._owners = {k: s.owner for k, s in self.partitions.items() if s.owner is not None}
            counts: dict[MemberId, int] = {}
            by_client: dict[str, int] = {}
            for owner in owners.values():
                counts[owner] = counts.get(owner, 0) + 1
                by_client[owner[0]] = by_client.get(owner[0], 0) + 1
            self._owner_counts, self._client_counts = counts, by_client
        return owners

    def partitions_restored(self) -> None:
        """Partitions were loaded from outside the fold (a checkpoint): the free_partitions index is relearned."""
        self._oldest_owned_ts = None
        self._owners = self._release_requests = None
        self._free_memo = self._holdings_memo = None
        self._view_box = [None]

    # -------------------------------------------------------------- queries

    def has_records(self) -> bool:
        """Does the log hold anything of this group (a partition, a pause, a shared partition)?  A group it never
        heard of is most likely a typo of --group or --coordination-topic."""
        return bool(self.partitions or self.pauses or self.shared)

    def get(self, topic: str, partition: int) -> PartitionState | None:
        return self.partitions.get((topic, partition))

    def owner(self, topic: str, partition: int) -> MemberId | None:
        state = self.partitions.get((topic, partition))
        return None if state is None else state.owner

    def liveness(self, topic: str, partition: int, now: int) -> Liveness:
        state = self.partitions.get((topic, partition))
        if state is None:
            return Liveness.UNCLAIMED
        if state.owner is None:
            return Liveness.RELEASED
        age = now - state.last_ts
        if age < self.heartbeat_ms:
            return Liveness.FRESH
        if age <= 2 * self.heartbeat_ms:
            return Liveness.UNKNOWN
        return Liveness.STALE

    def shared_marks(self, now: int, topic: str | None = None) -> dict[tuple[str, int], tuple[int, int]]:
        """(low-water mark, offsets lost) of each shared partition (of ``topic``, if given) that has a claim, as of
        ``now``: leases lapsed since the partition's last record count as lapsed."""
        marks = {}
        for key, shared in self.shared.items():
            if shared.low is not None and (topic is None or key[0] == topic):
                view = shared.as_of(now)
                marks[key] = (view.low if view.low is not None else shared.low, view.lost)
        return marks

    def paused_until(self) -> int | None:
        """The latest pause expiry the log holds for the group (it may lie in the past)."""
        return max((pause.until for pause in self.pauses.values()), default=None)

    def is_paused(self, now: int) -> bool:
        return any(now < pause.until for pause in self.pauses.values())

    def is_free(self, topic: str, partition: int, now: int, client: str, instance: str) -> bool:
        """Would a claim by (client, instance) written at ``now`` be accepted, as far as we know?"""
        if self.is_paused(now) or self.is_drained(client) or self.topic_paused(topic, now):
            return False
        state = self.partitions.get((topic, partition))
        return state is None or self._claimable_by(state, client, instance, now)

    def free_partitions(
        self, keys: Iterable[tuple[str, int]], now: int, client: str, instance: str
    ) -> list[tuple[str, int]]:
        """The ``keys`` that are free for (client, instance) at ``now``: ``[k for k in keys if is_free(*k, ...)]``,
        with the group's pause and drain checked once (a member asks this of every partition, every claim round).

        While no owned partition can be stale at ``now`` (the fold's lower bound of their record times is within
        2*HB), only the owners are looked at; otherwise every partition is tested, and the bound relearned."""
        if self.is_paused(now) or self.is_drained(client):
            return []
        partitions, topic_pauses = self.partitions, self.topic_pauses
        if self._none_stale(now):
            owners = self._owner_index()
            # Another instance of our client owns a partition (fast reclaim): it owns more than we do.
            fast_reclaim = self._client_counts.get(client, 0) > self._owner_counts.get(MemberId(client, instance), 0)
            if not fast_reclaim and not topic_pauses and now >= 0:  # the common case: only what nobody owns
                memo = self._free_memo
                if memo is not None and memo[0] is keys:
                    return list(memo[1])
                unowned = [key for key in keys if key not in owners]
                if type(keys) is tuple:  # the same tuple next time means the same keys
                    self._free_memo = (keys, unowned)
                return list(unowned)
            get = partitions.get
            free = []
            for key in keys:
                state = get(key)
                owner = None if state is None else state.owner
                # Free: no owner, or (fast reclaim) another instance of our client; none is stale.
                free_now = owner is None or (owner[0] == client and owner[1] != instance)
                if free_now and now >= topic_pauses.get(key[0], 0):
                    free.append(key)
            return free
        claimable = self._claimable_by
        free = []
        for key in keys:
            if now < topic_pauses.get(key[0], 0):
                continue
            state = partitions.get(key)
            if state is None or claimable(state, client, instance, now):
                free.append(key)
        self._oldest_owned_ts = min((s.last_ts for s in partitions.values() if s.owner is not None), default=now)
        return free

    def _none_stale(self, now: int) -> bool:
        """Can no owned partition be stale at ``now``?  True while the fold's lower bound of the owned partitions'
        record times is within 2*HB; then the owners alone answer free_partitions, holdings and group_view."""
        oldest = self._oldest_owned_ts
        return oldest is not None and now - oldest <= 2 * self.heartbeat_ms

    def relearn_free_index(self, now: int) -> None:
        """Relearn free_partitions' bound of the owned partitions' record times (one pass over the partitions)
        unless it is within an HB of ``now``.  A member's claim rounds relearn it when they need to; a fold that no
        claim round asks (the simulator's shared fold, whose copies its members ask) calls this now and then, so
        that the copies start from a recent bound.  Answers never change, only how fast they come."""
        oldest = self._oldest_owned_ts
        if oldest is None or now - oldest > self.heartbeat_ms:
            owned = (s.last_ts for s in self.partitions.values() if s.owner is not None)
            self._oldest_owned_ts = min(owned, default=now)

    def is_drained(self, client: str) -> bool:
        """Has an operator drained ``client`` (on any coordination partition) and not resumed it?"""
        return any(client in controls.drained for controls in self.controls.values())

    def drained_clients(self) -> dict[str, int]:
        """Every drained client and the time of its drain order."""
        found: dict[str, int] = {}
        for controls in self.controls.values():
            for client, at in controls.drained.items():
                found[client] = max(at, found.get(client, 0))
        return found

    def shutdown_ordered(self, client: str) -> int | None:
        """The time of the latest order to shut ``client``'s supervisors down, if any."""
        return max((c.shutdowns[client] for c in self.controls.values() if client in c.shutdowns), default=None)

    def topic_paused(self, topic: str, now: int) -> bool:
        return now < self.topic_pauses.get(topic, 0)

    def paused_topics(self, now: int) -> dict[str, int]:
        """The topics paused at ``now``, with the expiry of each pause."""
        return {topic: until for topic, until in self.topic_pauses.items() if now < until}

    def release_requests(self, owner: MemberId) -> frozenset[tuple[str, int]]:
        """The partitions of ``owner`` that an operator asked it to hand over (admin release, orders.py)."""
        partitions = self.partitions
        return frozenset(key for key in self._release_index() if partitions[key].owner == owner)

    def _release_index(self) -> set[tuple[str, int]]:
        requested = self._release_requests
        if requested is None:
            requested = self._release_requests = {k for k, s in self.partitions.items() if s.release_requested}
        return requested

    def owned_by(self, client: str, instance: str | None = None) -> Iterator[tuple[str, int]]:
        """The (topic, partition) pairs owned by a client (any instance if none is given)."""
        for key, state in self.partitions.items():
            owner = state.owner
            if owner is not None and owner.client == client and instance in (None, owner.instance):
                yield key

    def holdings(self, now: int) -> dict[MemberId, list[tuple[str, int]]]:
        """The partitions of every owner whose claim is not stale (heard from within 2*HB)."""
        limit = 2 * self.heartbeat_ms
        none_stale = self._none_stale(now)
        memo = self._holdings_memo
        if none_stale and memo is not None:
            return {owner: list(keys) for owner, keys in memo.items()}
        held: dict[MemberId, list[tuple[str, int]]] = {}
        for key, state in self.partitions.items():
            owner = state.owner
            if owner is not None and now - state.last_ts <= limit:
                held.setdefault(owner, []).append(key)
        if none_stale:  # every owner counted: the answer holds until a partition changes owner
            self._holdings_memo = {owner: list(keys) for owner, keys in held.items()}
        return held

    def holding_counts(self, now: int) -> dict[MemberId, int]:
        """How many partitions each owner holds whose claim is not stale: the lengths of ``holdings(now)``, in no
        particular order.  While none can be stale (free_partitions' bound) it is the fold's count of owners."""
        if self._none_stale(now):
            self._owner_index()
            return dict(self._owner_counts)
        return {owner: len(keys) for owner, keys in self.holdings(now).items()}

    def live_members(self, now: int) -> set[MemberId]:
        """The group's members at ``now``: owners of partitions that are not stale, and whoever claimed
        (accepted or not) within 2*HB (``group_view``'s members).

        A member that owns nothing and claims nothing is not seen: the protocol
        has no presence record, so a member that wants to be counted asks for a
        partition (see balance.py).  A member that released everything is gone.
        """
        return set(self.group_view(now).counts)

    def group_view(self, now: int) -> GroupView:
        """The live members, what each holds, and the askers at ``now``: one answer to the three queries.

        Kept while none can be stale, for the span of ``now`` over which no claim time crosses the 2*HB edge (a
        large group's members ask it every balance cycle, and it rarely changes)."""
        if not self._none_stale(now):  # holdings depend on now: nothing to keep
            return self._group_view(now, self.holding_counts(now))[2]
        kept = self._view_box[0]
        if kept is not None and kept[0] <= now <= kept[1]:
            return kept[2]
        found = self._group_view(now, self.holding_counts(now))
        self._view_box[0] = found
        return found[2]

    def _group_view(self, now: int, counts: dict[MemberId, int]) -> tuple[int, int, GroupView]:
        """group_view's answer from ``counts`` (``holding_counts(now)``, completed here with the members that only
        claim), and the span of ``now`` over which claims and refusals give the same answer."""
        limit, clients, last_claim = 2 * self.heartbeat_ms, self.clients, self.last_claim
        lo, hi = -(2**63), 2**63
        askers = set()
        for instance, at in self.last_refused_claim.items():
            if last_claim.get(instance) != at:
                continue  # it claimed since: not an ask (see askers)
            if now - at <= limit:
                askers.add(MemberId(clients[instance], instance))
                hi = min(hi, at + limit)
            else:
                lo = max(lo, at + limit + 1)
        for instance, at in last_claim.items():
            if now - at <= limit:
                counts.setdefault(MemberId(clients[instance], instance), 0)
                hi = min(hi, at + limit)
            else:
                lo = max(lo, at + limit + 1)
        most = tuple(heapq.nlargest(2, ((n, owner) for owner, n in counts.items())))
        return lo, hi, GroupView(counts, frozenset(askers), most)

    def askers(self, now: int) -> set[MemberId]:
        """Members whose claim of a partition with a live owner was refused within 2*HB: they want more
        (``group_view``'s askers).

        Not a member that has claimed since (its latest claim is not the refused one): it got a partition,
        and asks again within a heartbeat if it still wants more.  Its old ask must not make others give
        on: a member capped by max_partitions, which asked for its one partition and got it, would still
        be short of the fair share in their eyes, and be handed partitions it never takes.
        """
        return set(self.group_view(now).askers)

    def shared_partition(self, topic: str, partition: int) -> SharedPartition | None:
        """The range bookkeeping of a shared partition, or None if no range of it was ever claimed."""
        return self.shared.get((topic, partition))

    def snapshot(self) -> Self:
        """An independent copy, safe to read while the original keeps folding."""
        return copy.deepcopy(self)

    def learn_indexes(self) -> None:
        """Learn the indexes of owners and of hand-over requests now if they are not known: copies made before a
        record (copy_on_write.py) carry them along, so that none of them relearns them."""
        self._owner_index()
        self._release_index()


def _count_down(counts: dict[Any, int], key: Any) -> None:
    """One fewer for ``key``; a count that reaches 0 goes (the owner indexes hold only owners)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
