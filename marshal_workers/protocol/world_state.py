"""The world state of one group: a deterministic fold of the coordination log.

This is the fold of docs/protocol.md.  ``WorldState.apply`` takes
one decoded record, the record's time and the coordination partition it was
read from, and updates the state by the rules of the protocol.  It reads no
clock and does no I/O, so every reader that folds the same log reaches the
same state.  What the state holds, and the queries about it (which take
``now`` where they depend on the time), are those of a :class:`WorldView`
(world_view.py).  :func:`fold` is the pure form used by tests and
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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import SharedPartition
from marshal_workers.protocol.world_view import Controls, PartitionState, Pause, WorldView


class Verdicts(tuple):
    """The verdicts of a record about several partitions (Heartbeats, MessageClaims), one per entry, in order.

    True if any entry was accepted, so code that wants one verdict per record still works.
    """

    def __bool__(self) -> bool:
        return any(self)


def per_entry(verdict: Any, count: int) -> list[bool]:
    """One record's verdict as one per entry: a multi-entry record's Verdicts (a tuple), or one verdict for all."""
    return [bool(v) for v in verdict] if isinstance(verdict, tuple) else [bool(verdict)] * count


class Entry(NamedTuple):
    """A decoded record as read from the log."""

    record: Record
    at: int  # the record's time, see record_time()
    source: int = 0  # the coordination partition it was read from


def record_time(record: Record, log_append_time: int | None) -> int:
    """The time the fold uses: the broker's LogAppendTime if it stamped one, else ``ts``."""
    return record.ts if log_append_time is None else log_append_time


@dataclass(slots=True)
class WorldState(WorldView):
    """A group's :class:`WorldView`, kept by folding its coordination log: ``apply`` each record in log order."""

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
            kind is not ReleaseGroup
            and kind is not Checkpoint
            and kind is not Control
            and self.coordination_partitions is not None
        ):
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

    def apply_value(
        self, value: bytes | None, source: int = 0, log_append_time: int | None = None
    ) -> tuple[Record, bool]:
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

    # ---------------------------------------------------------------- rules

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
        self._set_owner(key, state, MemberId(record.client, record.instance))
        state.last_ts = at
        self._owned_at(at)
        state.clear_report()  # the previous owner's numbers
        return True

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
        """A checkpoint adds nothing to a state that has read the log before it: only its time and place are kept."""
        self.checkpoints[source] = max(at, self.checkpoints.get(source, 0))
        if record.as_of >= self.checkpoint_offsets.get(source, (0, 0))[0]:
            self.checkpoint_offsets[source] = (record.as_of, record.parts)
        return True

    # Range records (docs/shared-partitions.md): one verdict per entry, by the rules of range_leases.SharedPartition.
    # A pause stops new leases and renewals; what is in hand may still be acked or given back.

    def _claim_ranges(self, record: ClaimRanges, at: int, source: int) -> Verdicts:
        if self.paused_at(source, at) is not None or self.held_back(record.client, record.topic, source, at):
            return Verdicts(False for _ in record.ranges)
        holder, topic, lease_ms, amo = (
            MemberId(record.client, record.instance),
            record.topic,
            record.lease_ms,
            record.amo,
        )
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
        holder = MemberId(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.renew(entry.offset, entry.end, holder, at, record.lease_ms)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _ack_ranges(self, record: AckRanges, at: int, source: int) -> Verdicts:
        holder = MemberId(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.ack(entry.offset, entry.end, holder, at, entry.failed, entry.dead, entry.high)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _progress_ranges(self, record: ProgressRanges, at: int, source: int) -> Verdicts:
        """Progress inside live leases.  Like acks, not stopped by a pause: it settles what is in
        hand."""
        holder = MemberId(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.progress(entry.offset, entry.end, holder, at, entry.failed, entry.dead)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    def _cancel_ranges(self, record: CancelRanges, at: int, source: int) -> Verdicts:
        holder = MemberId(record.client, record.instance)
        return Verdicts(
            shared is not None and shared.cancel(entry.offset, entry.end, holder, at)
            for entry, shared in self._shared_of(record.topic, record.ranges)
        )

    # The Read / Ack / Cancel service's messages: one verdict per message.  A pause does not stop
    # them: like acks of ranges, they settle what is in hand.

    def _deliver_messages(self, record: DeliverMessages, at: int, source: int) -> Verdicts:
        holder = MemberId(record.client, record.instance)
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

    def _shared_of(self, topic: str, entries: Iterable[Any]) -> Iterator[tuple[Any, SharedPartition | None]]:
        for entry in entries:
            yield entry, self.shared.get((topic, entry.partition))


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
