"""Copies of the world state to fold one record into, sharing with it what the record cannot change.

The simulator's members share one fold (simulation/shared_fold.py, docs/simulation.md): each record is folded
once, into a copy of the state before it, and every state stays as it was for the members that still read it.
``WorldState.snapshot`` would copy every partition for every record; :func:`copy_before` copies only what folding
the record may change: the states of the partitions it is about, and the group-wide tables, one level.
"""

from __future__ import annotations

import copy

from marshal_workers.protocol.codec import (
    AckMessages,
    AckRanges,
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
)
from marshal_workers.protocol.field_copies import mutable_fields
from marshal_workers.protocol.world_state import WorldState


def copy_before(state: WorldState, record: Record) -> WorldState:
    """A copy of ``state`` to fold ``record`` into, while ``state`` stays as it is: ``state.snapshot()``, made
    cheaply.  The copy shares with ``state`` the states of the partitions ``record`` is not about (the fold of
    ``record`` cannot change them); everything else is copied.  Fold only ``record`` into it: the next record
    needs a copy of its own.  Many readers at the same place in the log can so share one fold (the simulator's
    members: docs/simulation.md); a record this function does not know is copied whole."""
    kind = type(record)
    touched = _touched_partitions(record)
    if touched is None:
        return state.snapshot()
    state.learn_indexes()  # carried along, so no copy relearns them
    new = copy.copy(state)
    beats = kind is Heartbeats or kind is Heartbeat
    for name in _BEAT_CONTAINERS if beats else _COPIED_CONTAINERS:
        setattr(new, name, getattr(state, name).copy())
    new.stats = state.stats.copy()
    new.groups_seen = {source: set(names) for source, names in state.groups_seen.items()}
    if not beats:
        new.controls = {source: controls.copy() for source, controls in state.controls.items()}
    if record.group == state.group:
        partitions, shared = new.partitions, new.shared
        topic = record.topic if kind not in _GROUP_KINDS else None  # type: ignore[union-attr]
        for number in touched:
            key = (topic, number)
            found = partitions.get(key)  # type: ignore[arg-type]
            if found is not None:
                partitions[key] = found.copy()  # type: ignore[index]
            ranges = shared.get(key)  # type: ignore[arg-type]
            if ranges is not None:
                shared[key] = ranges.copy()  # type: ignore[index]
    return new


# What copy_before copies one level: every field of WorldState whose value can change in place (from the fields'
# types, field_copies.py) but those it copies apart (deeper: the orders, the groups seen, the counts) and the answers
# kept for queries, which the copies share (the fold puts new ones in place when it changes what they answer).  A new
# field is so copied unless named here.  The copied containers' values are immutable, or copied where a record
# touches them (the states of partitions and shared partitions).
_COPIED_APART = ("controls", "groups_seen", "stats")
_KEPT_ANSWERS = ("_free_memo", "_holdings_memo", "_view_box")
_COPIED_CONTAINERS = tuple(name for name in mutable_fields(WorldState) if name not in _COPIED_APART + _KEPT_ANSWERS)
# A heartbeat changes only the states of its partitions (and the counts, and the caches of routes and groups seen):
# the copy for one shares the rest, the most of the fold's records and so the most of its copies.
_BEAT_CONTAINERS = ("partitions", "_routes", "directory_known", "_too_many_groups")
_GROUP_KINDS = (ReleaseGroup, Checkpoint, Control)  # records about no topic


def _touched_partitions(record: Record) -> tuple[int, ...] | None:
    """The partitions of ``record``'s topic whose state folding it may change (none for a record about no
    partition), or None if it may change them all, or this function does not know the record."""
    kind = type(record)
    if kind is Heartbeats:
        return tuple(beat.partition for beat in record.beats)  # type: ignore[union-attr]
    if kind in (Claim, Heartbeat, Release, ClaimMessages, ReleasePartition):
        return (record.partition,)  # type: ignore[union-attr]
    if kind is MessageClaims:
        return tuple(claim.partition for claim in record.claims)  # type: ignore[union-attr]
    if kind in (ClaimRanges, RenewRanges, AckRanges, CancelRanges, ProgressRanges):
        return tuple(entry.partition for entry in record.ranges)  # type: ignore[union-attr]
    if kind in (DeliverMessages, AckMessages, CancelMessages):
        return tuple(entry.partition for entry in record.messages)  # type: ignore[union-attr]
    if kind in (Checkpoint, Control, PauseTopic):
        return ()
    return None  # ReleaseGroup (every partition), or a kind added since
