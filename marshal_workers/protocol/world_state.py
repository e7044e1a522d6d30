"""The world state of one group: a deterministic fold of the coordination log.

This is the fold of docs/protocol.md.  ``WorldState.apply`` takes
one decoded record, the record's time and the coordination partition it was
read from, and updates the state by the rules of the protocol.  It reads no
clock and does no I/O, so every reader that folds the same log reaches the
same state.  Queries that depend on the time (is a partition fresh, free)
take ``now`` as an argument.  :func:`fold` is the pure form used by tests and
tools: it returns a new state and leaves its input alone.

Two choices that go beyond the prose of docs/protocol.md, both needed for "same log,
same state" when the coordination topic has several partitions:

* A reader folds the coordination partitions in whatever interleaving its
  fetches return, so only the order *within* a partition is shared by every
  reader.  A pause (``release_group``, written to every coordination
  partition) is therefore kept per coordination partition: a claim is
  checked against the pause copy that is ordered with it in its own log.
  The group's ``paused_until`` is the latest of the copies.
* A record about a topic read from a coordination partition other than the
  topic's own (md5 routing) is not ordered with that topic's claims, so it is
  ignored and counted as misrouted.
"""

from __future__ import annotations

import copy
import enum
import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import done_set
from marshal_workers.protocol.codec import (
    MAX_DIRECTORY,
    AckMessages,
    AckRanges,
    Beat,
    CancelMessages,
    CancelRanges,
    Checkpoint,
    Claim,
    ClaimMessages,
    ClaimRanges,
    Control,
    DeliverMessages,
    Heartbeat,
    Heartbeats,
    MessageClaims,
    PauseTopic,
    ProgressRanges,
    Record,
    Release,
    ReleaseGroup,
    ReleasePartition,
    RenewRanges,
    coordination_partition,
    decode,
    group_named,
    reported_number,
)
from marshal_workers.protocol.field_copies import copier
from marshal_workers.protocol.range_leases import Holder, SharedPartition


class Liveness(str, enum.Enum):
    """How a partition looks at a given time (the ``state`` column of ``status``)."""

    FRESH = "fresh"  # owned, heartbeat younger than HB
    UNKNOWN = "unknown"  # owned, heartbeat between HB and 2*HB old
    STALE = "stale"  # owned, heartbeat older than 2*HB: anyone may claim it
    RELEASED = "released"  # known to the log, no owner
    UNCLAIMED = "unclaimed"  # never mentioned by the log


class Owner(NamedTuple):
    client: str
    instance: str


class Verdicts(tuple):
    """The verdicts of a record about several partitions (Heartbeats, MessageClaims), one per entry, in order.

    True if any entry was accepted, so code that wants one verdict per record still works.
    """

    def __bool__(self) -> bool:
        return any(self)


def per_entry(verdict: Any, count: int) -> list[bool]:
    """One record's verdict as one per entry: a multi-entry record's Verdicts (a tuple), or one verdict for all."""
    return [bool(v) for v in verdict] if isinstance(verdict, tuple) else [bool(verdict)] * count


@dataclass(slots=True)
class PartitionState:
    """What the log says about one (topic, partition) of the group."""

    owner: Owner | None = None
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

    counts: Mapping[Owner, int]  # shared by every caller: read it, copy it to change it
    askers: frozenset[Owner]
    most: tuple[tuple[int, Owner], ...]  # the (at most) two members that hold the most, the most first

    def most_held_by_others(self, me: Owner) -> int:
        """The most partitions any member other than ``me`` holds (0: no other member)."""
        return next((held for held, owner in self.most if owner != me), 0)


class Entry(NamedTuple):
    """A decoded record as read from the log."""

    record: Record
    at: int  # the record's time, see record_time()
    source: int = 0  # the coordination partition it was read from


def record_time(record: Record, log_append_time: int | None) -> int:
    """The time the fold uses: the broker's LogAppendTime if it stamped one, else ``ts``."""
    return record.ts if log_append_time is None else log_append_time


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
class WorldState:
    """Ownership, offsets and pauses of one group, folded from the coordination log.

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
    # The time of the latest checkpoint on each coordination partition (who writes the next: checkpoints.py).
    checkpoints: dict[int, int] = field(default_factory=dict)
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
    _owners: dict[tuple[str, int], Owner] | None = field(default=None, compare=False, repr=False)
    _owner_counts: dict[Owner, int] = field(default_factory=dict, compare=False, repr=False)
    _client_counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # the same, by client
    # Answers kept while no partition changes owner (cleared by _set_owner): free_partitions' common case for a
    # tuple of keys (the same tuple object: a tuple cannot change), and the holdings while none is stale.
    _free_memo: tuple[tuple[tuple[str, int], ...], list[tuple[str, int]]] | None = field(
        default=None, compare=False, repr=False
    )
    _holdings_memo: dict[Owner, list[tuple[str, int]]] | None = field(default=None, compare=False, repr=False)
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

    # ----------------------------------------------------------------- fold

    def apply(self, record: Record, at: int, source: int = 0) -> bool:
        """Fold one record; return whether it was accepted by the rules."""
        # The hot path of every reader (a million records a second): plain lookups, no helpers.
        stats = self.stats
        names = self.groups_seen.get(source)
        if names is None or record.group not in names:
            self._note_group(source, record.group)
        if record.group != self.group:
            stats.other_groups += 1
            return False
        kind = type(record)
        if (
            kind is not ReleaseGroup and kind is not Checkpoint and kind is not Control
            and self.coordination_partitions is not None
        ):  # fmt: skip
            home = self._routes.get(record.topic)  # type: ignore[union-attr]
            if home is None:
                home = self._routes[record.topic] = coordination_partition(record.topic, self.coordination_partitions)  # type: ignore[union-attr]
            if home != source:
                stats.misrouted += 1
                return False
        elif kind is Checkpoint and self.coordination_partitions is not None and record.source != source:  # type: ignore[union-attr]
            stats.misrouted += 1  # a checkpoint belongs to the partition it describes
            return False
        accepted = _RULES[kind](self, record, at, source)
        stats.applied += 1
        if accepted:
            stats.accepted += 1
        return accepted

    def apply_value(self, value: bytes | None, source: int = 0, log_append_time: int | None = None) -> tuple[Record, bool]:
        """Decode and fold one raw Kafka value; return the record and its verdict.

        Garbage is counted in ``stats.garbage`` and raises DecodeError; it changes nothing else.
        """
        try:
            record = decode(value)
        except DecodeError:
            self.stats.garbage += 1
            group = group_named(value)  # a newer release's record is still its group's (rare: only for garbage)
            if group is not None:
                self._note_group(source, group)
            raise
        return record, self.apply(record, record_time(record, log_append_time), source)

    # ------------------------------------------------------------ directory

    def _note_group(self, source: int, group: str) -> None:
        """A group's record on ``source``: its name noted, unless ``source`` has had more than MAX_DIRECTORY."""
        names = self.groups_seen.setdefault(source, set())
        if group in names or source in self._too_many_groups:
            return
        if len(names) >= MAX_DIRECTORY:  # too many to carry: this reader writes no directory of ``source``
            self._too_many_groups.add(source)
            self.directory_known.discard(source)
            return
        names.add(group)

    def set_directory(self, source: int, names: Iterable[str] | None) -> None:
        """Where this reader starts on ``source`` (before folding anything there), the groups with a record before:
        ``names``, or None if it does not know them (a checkpoint without a directory)."""
        if names is None:
            self.directory_known.discard(source)
            return
        self.learn_groups_before(source, names)

    def learn_groups_before(self, source: int, names: Iterable[str]) -> None:
        """``names`` are every group with a record on ``source`` before where this reader started: with those it
        has seen since, it knows the directory of ``source``."""
        for group in names:
            self._note_group(source, group)
        if source not in self._too_many_groups:
            self.directory_known.add(source)

    def groups_before(self, source: int) -> frozenset[str] | None:
        """The names of every group with a record on ``source`` among those folded, or None if this reader does
        not know them all."""
        if source not in self.directory_known:
            return None
        return frozenset(self.groups_seen.get(source, ()))

    def routed_here(self, topic: str, source: int) -> bool:
        """Is coordination partition ``source`` the one that carries every record about ``topic``?"""
        count = self.coordination_partitions
        return count is None or coordination_partition(topic, count) == source

    @staticmethod
    def _is_owner(state: PartitionState | None, record: Record) -> bool:
        owner = None if state is None else state.owner
        return owner is not None and owner[1] == record.instance and owner[0] == record.client

    def _claim(self, record: Claim, at: int, source: int) -> bool:
        self._view_box = [None]  # a claimer is a member (and may be an asker)
        self.last_claim[record.instance] = at
        self.clients[record.instance] = record.client
        if self.paused_at(source, at) is not None or self.held_back(record.client, record.topic, source, at):
            return False
        key = (record.topic, record.partition)
        state = self.partitions.get(key)
        if state is None:
            state = self.partitions[key] = PartitionState()
        elif not self._claimable_by(state, record.client, record.instance, at):
            self.last_refused_claim[record.instance] = at
            return False
        self._set_owner(key, state, Owner(record.client, record.instance))
        state.last_ts = at
        self._owned_at(at)
        state.clear_report()  # the previous owner's numbers
        return True

    def _claimable_by(self, state: PartitionState, client: str, instance: str, at: int) -> bool:
        owner = state.owner
        return (
            owner is None
            or at - state.last_ts > 2 * self.heartbeat_ms
            # Fast reclaim: a restarted program (same client, new instance) takes its partitions back.
            or (owner.client == client and owner.instance != instance)
        )

    def _heartbeat(self, record: Heartbeat, at: int, source: int) -> bool:
        return self._beat(record.client, record.instance, record.topic, record, at)

    def _beat(self, client: str, instance: str, topic: str, beat: Heartbeat | Beat, at: int) -> bool:
        """One partition's heartbeat by (client, instance): a Heartbeat record, or an entry of a Heartbeats."""
        state = self.partitions.get((topic, beat.partition))
        owner = None if state is None else state.owner
        if owner is None or owner[1] != instance or owner[0] != client:
            return False  # the Go library obeyed these, letting a zombie steal a partition back
        assert state is not None
        state.last_ts = at
        oldest = self._oldest_owned_ts  # _owned_at(at), inline: this runs for every beat every member folds
        if oldest is not None and at < oldest:
            self._oldest_owned_ts = at
        state.offset = beat.offset
        done = beat.done  # goes with the offset: a heartbeat without it clears the previous one
        state.done = None if done is None else (done_set.parse(beat.offset, done) or None)
        # Optional extras, kept only as numbers: whatever else a writer put there stays out of the state.
        lag, rate = beat.lag, beat.rate
        state.lag = None if lag is None else reported_number(lag)
        state.rate = None if rate is None else reported_number(rate)
        in_flight, window_used = beat.in_flight, beat.window_used
        state.in_flight = None if in_flight is None else reported_number(in_flight)
        state.window_used = None if window_used is None else reported_number(window_used)
        call_age_s = beat.call_age_s
        state.call_age_s = None if call_age_s is None else reported_number(call_age_s)
        return True

    def _heartbeats(self, record: Heartbeats, at: int, source: int) -> Verdicts:
        """One heartbeat per entry, in order, at the record's time; a verdict per entry (as ``record.heartbeats()``
        folded one by one, without building them: every member folds every heartbeat)."""
        client, instance, topic, beat = record.client, record.instance, record.topic, self._beat
        return Verdicts([beat(client, instance, topic, b, at) for b in record.beats])

    def _owned_at(self, at: int) -> None:
        """An owned partition's record time is now ``at``: keep the free_partitions index a lower bound."""
        oldest = self._oldest_owned_ts
        if oldest is not None and at < oldest:
            self._oldest_owned_ts = at

    def partitions_restored(self) -> None:
        """Partitions were loaded from outside the fold (a checkpoint): the free_partitions index is relearned."""
        self._oldest_owned_ts = None
        self._owners = self._release_requests = None
        self._free_memo = self._holdings_memo = None
        self._view_box = [None]

    def _set_owner(self, key: tuple[str, int], state: PartitionState, owner: Owner | None) -> None:
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

    def _owner_index(self) -> dict[tuple[str, int], Owner]:
        owners = self._owners
        if owners is None:
            owners = self._owners = {k: s.owner for k, s in self.partitions.items() if s.owner is not None}
            counts: dict[Owner, int] = {}
            by_client: dict[str, int] = {}
            for owner in owners.values():
                counts[owner] = counts.get(owner, 0) + 1
                by_client[owner[0]] = by_client.get(owner[0], 0) + 1
            self._owner_counts, self._client_counts = counts, by_client
        return owners

    def _release(self, record: Release, at: int, source: int) -> bool:
        key = (record.topic, record.partition)
        state = self.partitions.get(key)
        if self._is_owner(state, record):
            assert state is not None
            self._set_owner(key, state, None)
            state.offset = record.offset
            done = record.done
            state.done = None if done is None else (done_set.parse(record.offset, done) or None)
            state.clear_report()
            return True
        pause = self.paused_at(source, at)
        if pause is not None and pause.client == record.client:
            # An operator setting the group's position: the offset becomes the resume point.
            if state is None:
                state = self.partitions[key] = PartitionState()
            state.offset = record.offset
            state.amo_offset = None
            state.done = None  # a position set by an operator: everything from it on is processed
            return True
        return False

    def _claim_messages(self, record: ClaimMessages, at: int, source: int) -> bool:
        state = self.partitions.get((record.topic, record.partition))
        if not self._is_owner(state, record) or self.paused_at(source, at) is not None:
            return False
        if at < self.topic_pauses.get(record.topic, 0):
            return False  # the topic is paused: its owner is about to release it, and handles nothing more
        assert state is not None
        if at - state.last_ts > 2 * self.heartbeat_ms:
            return False  # the claim had lapsed: an AMO batch may not be claimed on a stale lease
        if state.amo_offset is None or record.offset > state.amo_offset:
            state.amo_offset = record.offset
        state.last_ts = at
        self._owned_at(at)
        return True

    def _message_claims(self, record: MessageClaims, at: int, source: int) -> Verdicts:
        """One claim_messages per entry, in order, at the record's time; a verdict per entry."""
        return Verdicts(self._claim_messages(claim, at, source) for claim in record.claim_messages())

    def _release_group(self, record: ReleaseGroup, at: int, source: int) -> bool:
        self.pauses[source] = Pause(until=record.expires, client=record.client)
        for key, state in self.partitions.items():
            if self.routed_here(key[0], source):
                self._set_owner(key, state, None)
                state.clear_report()
        return True

    def _checkpoint(self, record: Checkpoint, at: int, source: int) -> bool:
        """A checkpoint adds nothing to a state that has read the log before it: only its time is kept."""
        self.checkpoints[source] = max(at, self.checkpoints.get(source, 0))
        return True

    # Range records (docs/shared-partitions.md): one verdict per entry, by the rules of range_leases.SharedPartition.
    # A pause stops new leases and renewals; what is in hand may still be acked or given back.

    def _claim_ranges(self, record: ClaimRanges, at: int, source: int) -> Verdicts:
        if self.paused_at(source, at) is not None or self.held_back(record.client, record.topic, source, at):
            return Verdicts(False for _ in record.ranges)
        holder, topic, lease_ms, amo = Holder(record.client, record.instance), record.topic, record.lease_ms, record.amo
        verdicts = []
        for entry in record.ranges:
            key = (topic, entry.partition)
            shared = self.shared.get(key)
            if shared is None:
                shared = self.shared[key] = SharedPartition()
            verdicts.append(shared.claim(entry.offset, entry.end, holder, at, lease_ms, amo))
        return Verdicts(verdicts)

    def _renew_ranges(self, record: RenewRanges, at: int, source: int) -> Verdicts:
        if self.paused_at(source, at) is not None:
            return Verdicts(False for _ in record.ranges)
        holder = Holder(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.renew(entry.offset, entry.end, holder, at, record.lease_ms)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _ack_ranges(self, record: AckRanges, at: int, source: int) -> Verdicts:
        holder = Holder(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.ack(entry.offset, entry.end, holder, at, entry.failed, entry.dead, entry.high)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _progress_ranges(self, record: ProgressRanges, at: int, source: int) -> Verdicts:
        """Progress inside live leases.  Like acks, not stopped by a pause: it settles what is in
        hand."""
        holder = Holder(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.progress(entry.offset, entry.end, holder, at, entry.failed, entry.dead)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _cancel_ranges(self, record: CancelRanges, at: int, source: int) -> Verdicts:
        holder = Holder(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.cancel(entry.offset, entry.end, holder, at)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    # The Read / Ack / Cancel service's messages: one verdict per message.  A pause does not stop
    # them: like acks of ranges, they settle what is in hand.

    def _deliver_messages(self, record: DeliverMessages, at: int, source: int) -> Verdicts:
        holder = Holder(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.deliver(entry.offset, holder, at, record.pending_ms)
            for entry, shared in self._shared_of(record.topic, record.messages)
        )

    def _ack_messages(self, record: AckMessages, at: int, source: int) -> Verdicts:
        return Verdicts(
            shared is not None and shared.ack_offset(entry.offset, at)
            for entry, shared in self._shared_of(record.topic, record.messages)
        )

    def _cancel_messages(self, record: CancelMessages, at: int, source: int) -> Verdicts:
        return Verdicts(
            shared is not None and shared.cancel_offset(entry.offset, at)
            for entry, shared in self._shared_of(record.topic, record.messages)
        )

    # Remote control: an operator's orders.  They change what may be claimed; owners obey them
    # by releasing (a supervisor reads them as it reads everything else: remote_control.py).

    def _control(self, record: Control, at: int, source: int) -> bool:
        controls, target = self.controls.get(source), record.target
        if record.action == "resume":
            if controls is None or controls.drained.pop(target, None) is None:
                return False
            if not (controls.drained or controls.shutdowns):
                del self.controls[source]  # as if never drained: readers seeded from a checkpoint agree
            return True
        if controls is None:
            controls = self.controls[source] = Controls()
        if record.action == "drain":
            controls.drained[target] = at
        else:  # "shutdown"
            controls.shutdowns[target] = max(at, controls.shutdowns.get(target, 0))
        return True

    def _pause_topic(self, record: PauseTopic, at: int, source: int) -> bool:
        """The latest order about a topic wins: a pause, or (``expires`` in the past) the end of one."""
        self.topic_pauses[record.topic] = record.expires
        return True

    def _release_partition(self, record: ReleasePartition, at: int, source: int) -> bool:
        state = self.partitions.get((record.topic, record.partition))
        if state is None or state.owner is None:
            return False  # nobody to ask
        state.release_requested = True
        if self._release_requests is not None:
            self._release_requests.add((record.topic, record.partition))
        return True

    def held_back(self, client: str, topic: str, source: int, at: int) -> bool:
        """May ``client`` not claim ``topic`` at ``at``: drained (on this coordination partition) or topic paused?"""
        controls = self.controls.get(source)
        return (controls is not None and client in controls.drained) or at < self.topic_pauses.get(topic, 0)

    def _shared_of(self, topic: str, entries: Iterable[Any]) -> Iterator[tuple[Any, SharedPartition | None]]:
        for entry in entries:
            yield entry, self.shared.get((topic, entry.partition))

    def paused_at(self, source: int, at: int) -> Pause | None:
        """The pause in force at ``at`` on coordination partition ``source`` (the copy a record there is checked
        against), or None."""
        pause = self.pauses.get(source)
        return pause if pause is not None and at < pause.until else None

    # -------------------------------------------------------------- queries

    def has_records(self) -> bool:
        """Does the log hold anything of this group (a partition, a pause, a shared partition)?  A group it never
        heard of is most likely a typo of --group or --coordination-topic."""
        return bool(self.partitions or self.pauses or self.shared)

    def get(self, topic: str, partition: int) -> PartitionState | None:
        return self.partitions.get((topic, partition))

    def owner(self, topic: str, partition: int) -> Owner | None:
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

    def free_partitions(self, keys: Iterable[tuple[str, int]], now: int, client: str, instance: str) -> list[tuple[str, int]]:
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
            fast_reclaim = self._client_counts.get(client, 0) > self._owner_counts.get(Owner(client, instance), 0)
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

    def release_requests(self, owner: Owner) -> frozenset[tuple[str, int]]:
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

    def holdings(self, now: int) -> dict[Owner, list[tuple[str, int]]]:
        """The partitions of every owner whose claim is not stale (heard from within 2*HB)."""
        limit = 2 * self.heartbeat_ms
        none_stale = self._none_stale(now)
        memo = self._holdings_memo
        if none_stale and memo is not None:
            return {owner: list(keys) for owner, keys in memo.items()}
        held: dict[Owner, list[tuple[str, int]]] = {}
        for key, state in self.partitions.items():
            owner = state.owner
            if owner is not None and now - state.last_ts <= limit:
                held.setdefault(owner, []).append(key)
        if none_stale:  # every owner counted: the answer holds until a partition changes owner
            self._holdings_memo = {owner: list(keys) for owner, keys in held.items()}
        return held

    def holding_counts(self, now: int) -> dict[Owner, int]:
        """How many partitions each owner holds whose claim is not stale: the lengths of ``holdings(now)``, in no
        particular order.  While none can be stale (free_partitions' bound) it is the fold's count of owners."""
        if self._none_stale(now):
            self._owner_index()
            return dict(self._owner_counts)
        return {owner: len(keys) for owner, keys in self.holdings(now).items()}

    def live_members(self, now: int) -> set[Owner]:
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

    def _group_view(self, now: int, counts: dict[Owner, int]) -> tuple[int, int, GroupView]:
        """group_view's answer from ``counts`` (``holding_counts(now)``, completed here with the members that only
        claim), and the span of ``now`` over which claims and refusals give the same answer."""
        limit, clients, last_claim = 2 * self.heartbeat_ms, self.clients, self.last_claim
        lo, hi = -(2**63), 2**63
        askers = set()
        for instance, at in self.last_refused_claim.items():
            if last_claim.get(instance) != at:
                continue  # it claimed since: not an ask (see askers)
            if now - at <= limit:
                askers.add(Owner(clients[instance], instance))
                hi = min(hi, at + limit)
            else:
                lo = max(lo, at + limit + 1)
        for instance, at in last_claim.items():
            if now - at <= limit:
                counts.setdefault(Owner(clients[instance], instance), 0)
                hi = min(hi, at + limit)
            else:
                lo = max(lo, at + limit + 1)
        most = tuple(heapq.nlargest(2, ((n, owner) for owner, n in counts.items())))
        return lo, hi, GroupView(counts, frozenset(askers), most)

    def askers(self, now: int) -> set[Owner]:
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

    def snapshot(self) -> WorldState:
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


# Each rule's verdict: a bool, or Verdicts for a record about several partitions (a tuple whose truth is any entry's:
# callers take it as a bool, per_entry splits it); typed Any so the fold can hand it on as its bool.
_RULES: dict[type, Callable[[WorldState, Any, int, int], Any]] = {
    Heartbeat: WorldState._heartbeat,
    Heartbeats: WorldState._heartbeats,
    Checkpoint: WorldState._checkpoint,
    Claim: WorldState._claim,
    ClaimMessages: WorldState._claim_messages,
    MessageClaims: WorldState._message_claims,
    Release: WorldState._release,
    ReleaseGroup: WorldState._release_group,
    ClaimRanges: WorldState._claim_ranges,
    RenewRanges: WorldState._renew_ranges,
    AckRanges: WorldState._ack_ranges,
    CancelRanges: WorldState._cancel_ranges,
    ProgressRanges: WorldState._progress_ranges,
    DeliverMessages: WorldState._deliver_messages,
    AckMessages: WorldState._ack_messages,
    CancelMessages: WorldState._cancel_messages,
    Control: WorldState._control,
    PauseTopic: WorldState._pause_topic,
    ReleasePartition: WorldState._release_partition,
}


def fold(entries: Iterable[Entry], state: WorldState) -> WorldState:
    """Pure fold: a new state with ``entries`` applied to a copy of ``state``."""
    result = state.snapshot()
    for record, at, source in entries:
        result.apply(record, at, source)
    return result
