"""What the fold of one coordination partition says about owners: tenures, hand-overs, zombies, counts.

Pure: no Spark, no Kafka, no clock.  Records go in, in log order, and each
one is folded by the project's own WorldState.apply (the rules are written
once, in world_state.py); this module only compares a partition's owner
before and after each record and writes down what changed:

* a **tenure** is one owner's hold on a partition, from its accepted claim
  to the record that ended it: its release, a take-over, or a pause;
* a **hand-over** is the way from one tenure to the next, with its gap:
  ``release`` (gap from the release), ``stale`` (another member claimed a
  partition whose owner had been silent for more than 2*HB: gap from the
  moment it went stale, last record + 2*HB), ``reclaim`` (a restart of the
  same client took it back at once: gap from the old instance's last record)
  and ``pause`` (an operator's release_group dropped the owner: gap from the
  pause; its length is the operator's choice, so the summary leaves it out);
* a **zombie record** is a heartbeat or message claim from anyone but the
  owner while a partition has one: the fold ignores it, the Go library would
  have obeyed it (a zombie stealing a partition back, or handling messages
  twice);
* **counts** per (client, instance) of each record type and how many the
  rules accepted.

Ownership of a topic's partitions is totally ordered within its one
coordination partition (md5 routing, docs/protocol.md), so each
coordination partition is audited on its own, in one task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from marshal_workers.protocol import checkpoints
from marshal_workers.protocol.codec import (
    MESSAGE_RECORD_TYPES,
    RANGE_RECORD_TYPES,
    Checkpoint,
    Claim,
    ClaimMessages,
    Control,
    Heartbeat,
    PauseTopic,
    Record,
    Release,
    ReleaseGroup,
    ReleasePartition,
)
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.spark.lease_audit import LeaseTracker, RangeLease


class Tenure(NamedTuple):
    topic: str
    partition: int
    client: str
    instance: str
    start_ms: int  # record time of the accepted claim
    end_ms: int | None  # record time of what ended it; None: still the owner at the end of the log
    end_reason: str | None  # release, stale, reclaim, pause; None: still the owner
    last_seen_ms: int  # its last accepted claim, heartbeat or message claim
    end_offset: int | None  # the partition's resume offset when it ended (or at the end of the log)
    log_partition: int  # where its claim is in the coordination topic
    log_offset: int


class Handoff(NamedTuple):
    topic: str
    partition: int
    kind: str  # release, stale, reclaim, pause
    from_client: str
    from_instance: str
    to_client: str
    to_instance: str
    vacated_ms: int  # the release, the moment the old owner went stale, its last record (reclaim), the pause
    claimed_ms: int  # the next accepted claim
    gap_ms: int  # claimed_ms - vacated_ms
    silence_ms: int  # claimed_ms - the old owner's last accepted record (or its release): >= gap_ms
    resume_offset: int | None  # where the new owner starts
    log_partition: int  # where the claim is
    log_offset: int


class Zombie(NamedTuple):
    log_partition: int
    log_offset: int
    at_ms: int
    type: str  # heartbeat or claim_messages
    client: str
    instance: str
    topic: str
    partition: int
    offset: int  # the offset it reported (heartbeat) or claimed up to (claim_messages)
    owner_client: str
    owner_instance: str
    owner_since_ms: int  # when the owner's claim was accepted


class ClientCounts(NamedTuple):
    client: str
    instance: str
    records: int
    claims: int
    claims_accepted: int
    heartbeats: int
    heartbeats_accepted: int
    releases: int
    releases_accepted: int
    claim_messages: int
    claim_messages_accepted: int
    release_groups: int
    zombie_records: int
    first_ms: int
    last_ms: int


class LogSummary(NamedTuple):
    """One coordination partition's totals."""

    log_partition: int
    records: int  # records of the group folded here
    accepted: int
    misrouted: int  # on the wrong coordination partition for their topic: ignored by the rules
    partitions: int  # (topic, partition) pairs the log gave an owner or a position
    zombie_records: int
    tenures: int
    garbage: int  # values that did not decode (counted by the reader, as WorldState.apply_value does)


Event = Tenure | Handoff | Zombie | ClientCounts | LogSummary | RangeLease
HANDOFF_KINDS_MEASURED = ("release", "stale", "reclaim")  # a pause's gap is the operator's, not the fleet's

_NONE: tuple[Event, ...] = ()
ORDER_TYPES = (Control, PauseTopic, ReleasePartition)  # remote control: the operators' orders
_TYPES: dict[type, int] = {Claim: 0, Heartbeat: 1, Release: 2, ClaimMessages: 3, ReleaseGroup: 4}
_ZOMBIE, _FIRST, _LAST, _COUNTERS = 10, 11, 12, 13  # per instance: [total, accepted] per type, then these


class _Open(NamedTuple):
    owner: MemberId
    start_ms: int
    log_offset: int


class _Vacated(NamedTuple):
    kind: str
    at_ms: int
    owner: MemberId
    last_seen_ms: int


class OwnershipAudit:
    """Feed one coordination partition's records in log order; collect what the fold did with them."""

    def __init__(self, group: str, heartbeat_ms: int, coordination_partitions: int | None, log_partition: int) -> None:
        self.log_partition = log_partition
        self.stale_ms = 2 * heartbeat_ms
        self.state = WorldState(group, heartbeat_ms, coordination_partitions)
        self._open: dict[tuple[str, int], _Open] = {}
        self._vacated: dict[tuple[str, int], _Vacated] = {}
        self._counts: dict[tuple[str, str], list[int]] = {}  # (client, instance) -> counters (see _ZOMBIE etc.)
        self.zombie_records = 0
        self.tenures = 0
        self.leases = LeaseTracker(log_partition)  # shared partitions' range leases (lease_audit.py)

    def seed(self, parts: Sequence[Checkpoint]) -> None:
        """Start from a checkpoint of this coordination partition instead of the log before it.

        Its owners' tenures are open from the checkpoint's time (they began earlier: the log before it
        is not read), so hand-overs and zombies are audited from there on.
        """
        checkpoints.seed(self.state, parts, self.log_partition)
        self.leases.seed(self.state)
        since, as_of = parts[0].ts, parts[0].as_of
        for key, entry in self.state.partitions.items():
            if entry.owner is not None:
                self._open[key] = _Open(entry.owner, since, as_of)

    # ---------------------------------------------------------------- feed

    def feed(self, record: Record, at: int, log_offset: int) -> tuple[Event, ...]:
        """Fold one record; return the tenures it closed, the hand-over or zombie it was (usually nothing)."""
        kind = type(record)
        if isinstance(record, ReleaseGroup):
            return self._pause(record, at)
        if (
            kind in RANGE_RECORD_TYPES or kind in MESSAGE_RECORD_TYPES
        ):  # shared partitions: audited lease by lease (the summary counts them)
            return self.leases.feed(self.state, record, at, log_offset)
        if kind in ORDER_TYPES:
            # An operator's order changes what may be claimed; what the owners then do (their releases) is
            # audited as usual.  The orders themselves are in the records table, by their writer (admin@...).
            self.state.apply(record, at, self.log_partition)
            return _NONE
        state = self.state
        entry = state.partitions.get((record.topic, record.partition))  # type: ignore[union-attr]
        owner_before, last_before = (None, 0) if entry is None else (entry.owner, entry.last_ts)
        applied = state.stats.applied
        accepted = state.apply(record, at, self.log_partition)
        if state.stats.applied == applied:
            return _NONE  # another group's, or misrouted: the rules did not look at it
        counters = self._count(record, kind, accepted, at)
        if isinstance(record, Claim):
            return self._claimed(record, at, log_offset, owner_before, last_before) if accepted else _NONE
        if isinstance(record, Release):
            return self._released(record, at, owner_before, last_before) if accepted and owner_before else _NONE
        if not accepted and owner_before is not None and owner_before != (record.client, record.instance):
            counters[_ZOMBIE] += 1
            self.zombie_records += 1
            # Ignored: what is left here is a Heartbeat or a ClaimMessages (the caller expands the rest).
            return (self._zombie(record, at, log_offset, owner_before),)  # type: ignore[arg-type]
        return _NONE

    def finish(self) -> list[Event]:
        """The tenures still open at the end of the log, the counts per client instance, and the totals."""
        events: list[Event] = list(self.leases.finish(self.state))
        for key, held in sorted(self._open.items()):
            events.append(self._tenure(key, held, None, None, self.state.partitions[key].last_ts))
        for (client, instance), c in self._counts.items():
            # Ignored: mypy cannot count the slices' fields (15 in all: _COUNTERS is fixed).
            events.append(ClientCounts(client, instance, sum(c[0:10:2]), *c[0:8], c[8], *c[10:13]))  # type: ignore[call-arg]
        stats = self.state.stats
        partitions = len(self.state.partitions)
        events.append(
            LogSummary(
                self.log_partition,
                stats.applied,
                stats.accepted,
                stats.misrouted,
                partitions,
                self.zombie_records,
                self.tenures,
                stats.garbage,
            )
        )
        return events

    # ---------------------------------------------------------- what changed

    def _claimed(
        self, record: Claim, at: int, log_offset: int, owner_before: MemberId | None, last_before: int
    ) -> tuple[Event, ...]:
        key = (record.topic, record.partition)
        new_owner = MemberId(record.client, record.instance)
        if owner_before == new_owner:
            return _NONE  # its own lapsed claim renewed: the same tenure goes on
        events: list[Event] = []
        vacated: _Vacated | None
        if owner_before is not None:  # taken from an owner the log had not let go
            stale = at - last_before > self.stale_ms
            kind = "stale" if stale else "reclaim"
            vacated = _Vacated(kind, last_before + self.stale_ms if stale else last_before, owner_before, last_before)
            closed = self._close(key, at, kind, last_before)
            if closed is not None:
                events.append(closed)
            self._vacated.pop(key, None)
        else:
            vacated = self._vacated.pop(key, None)
        self._open[key] = _Open(new_owner, at, log_offset)
        self.tenures += 1
        if vacated is not None:
            entry = self.state.partitions[key]
            events.append(
                Handoff(
                    topic=record.topic,
                    partition=record.partition,
                    kind=vacated.kind,
                    from_client=vacated.owner.client,
                    from_instance=vacated.owner.instance,
                    to_client=record.client,
                    to_instance=record.instance,
                    vacated_ms=vacated.at_ms,
                    claimed_ms=at,
                    gap_ms=at - vacated.at_ms,
                    silence_ms=at - vacated.last_seen_ms,
                    resume_offset=entry.resume_offset,
                    log_partition=self.log_partition,
                    log_offset=log_offset,
                )
            )
        return tuple(events)

    def _released(self, record: Release, at: int, owner_before: MemberId, last_before: int) -> tuple[Event, ...]:
        key = (record.topic, record.partition)
        self._vacated[key] = _Vacated("release", at, owner_before, at)
        closed = self._close(key, at, "release", last_before)
        return _NONE if closed is None else (closed,)

    def _pause(self, record: ReleaseGroup, at: int) -> tuple[Event, ...]:
        """A release_group drops every owner of the group on this coordination partition."""
        state = self.state
        owned = [(key, entry.owner, entry.last_ts) for key, entry in state.partitions.items() if entry.owner]
        applied = state.stats.applied
        accepted = state.apply(record, at, self.log_partition)
        if state.stats.applied == applied:
            return _NONE
        self._count(record, ReleaseGroup, accepted, at)
        events: list[Event] = []
        for key, owner, last_seen in owned:
            if state.partitions[key].owner is None:
                assert owner is not None
                self._vacated[key] = _Vacated("pause", at, owner, last_seen)
                closed = self._close(key, at, "pause", last_seen)
                if closed is not None:
                    events.append(closed)
        return tuple(events)

    def _close(self, key: tuple[str, int], at: int, reason: str, last_seen: int) -> Tenure | None:
        held = self._open.pop(key, None)
        if held is None:
            return None
        return self._tenure(key, held, at, reason, last_seen)

    def _tenure(
        self, key: tuple[str, int], held: _Open, end_ms: int | None, reason: str | None, last_seen: int
    ) -> Tenure:
        return Tenure(
            topic=key[0],
            partition=key[1],
            client=held.owner.client,
            instance=held.owner.instance,
            start_ms=held.start_ms,
            end_ms=end_ms,
            end_reason=reason,
            last_seen_ms=last_seen,
            end_offset=self.state.partitions[key].resume_offset,
            log_partition=self.log_partition,
            log_offset=held.log_offset,
        )

    def _zombie(self, record: Heartbeat | ClaimMessages, at: int, log_offset: int, owner: MemberId) -> Zombie:
        held = self._open.get((record.topic, record.partition))
        return Zombie(
            log_partition=self.log_partition,
            log_offset=log_offset,
            at_ms=at,
            type=str(record.__struct_config__.tag),
            client=record.client,
            instance=record.instance,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            owner_client=owner.client,
            owner_instance=owner.instance,
            owner_since_ms=held.start_ms if held is not None else 0,
        )

    # --------------------------------------------------------------- counts

    def _count(self, record: Record, kind: type, accepted: bool, at: int) -> list[int]:
        key = (record.client, record.instance)
        counters = self._counts.get(key)
        if counters is None:
            counters = self._counts[key] = [0] * _COUNTERS
            counters[_FIRST] = at
        index = 2 * _TYPES[kind]
        counters[index] += 1
        if accepted:
            counters[index + 1] += 1
        counters[_LAST] = at
        return counters
