"""Checkpoints: a reader's start-up does not grow with the coordination log's age (docs/protocol.md).

Every ``checkpoint_interval``, or once CHECKPOINT_RECORDS records came after
the last, one member writes, to each coordination partition, the fold's
state of that partition (every position, owner and pause of the topics
routed there) as of a log offset ``as_of``: a
:class:`codec.Checkpoint`, in parts if large.  A reader starts at the latest
complete checkpoint it finds near the end of each partition, seeds its state
from it and folds the log from ``as_of``, instead of reading from the
beginning.  A reader that did read the log before a checkpoint ignores it.

Agreement: a reader seeded from a checkpoint written by an honest member
and a reader that read everything hold the same positions, owners and
pauses once they have folded the same offsets (property-tested).  What the
fold keeps about members for balance (``last_claim``, ``last_refused_claim``)
only matters within 2 HB of ``now`` and is rebuilt from the records read,
so a reader that starts 2 HB before ``now`` agrees on it too.

Directories: every checkpoint also lists the groups with a
record on its partition before ``as_of``, when its writer knows them all
(it read the partition from its start, or started at a checkpoint that
listed them; a reader that started at a checkpoint without one cannot know:
it writes none).  A group that is not listed had no record there before
``as_of``: its state there was empty.  So a reader of a group that has no
checkpoint of its own (a new group on a topic other groups have filled)
starts at the latest checkpoint of any group that does not list it, with
the empty state, instead of reading the whole partition.  It reaches the
state a reader of everything reaches (property-tested), and so does every
reader that starts elsewhere, once they have read the same offsets.

Everything here is pure: states, records and numbers in, records out.
Where each piece of state lives once the log before a checkpoint is gone:
``docs/protocol.md``.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.codec import MAX_DIRECTORY, MAX_NAME_LENGTH, reported_number
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import Lease, SharedPartition, Tries
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import REPORT_FIELDS, Controls, PartitionState, Pause

# Positions per record: well below Kafka's default 1 MB message, even with done sets.
POSITIONS_PER_RECORD = 1000
# The directory's share of one record, in bytes of JSON (a name takes up to 6 bytes a character): a small directory
# rides in the first part, a large one spreads over parts, up to MAX_DIRECTORY names (codec.py) in all.
DIRECTORY_BYTES_PER_RECORD = 64 * 1024


def state_records(
    state: WorldState, source: int, as_of: int, common: dict[str, Any], per_record: int = POSITIONS_PER_RECORD
) -> list[codec.Checkpoint]:
    """The checkpoint of coordination partition ``source``: ``state`` as folded up to log offset ``as_of``."""
    positions = [
        _position(topic, partition, found)
        for (topic, partition), found in sorted(state.partitions.items())
        if state.routed_here(topic, source)
    ]
    shared = [
        _shared_position(topic, partition, found)
        for (topic, partition), found in sorted(state.shared.items())
        if state.routed_here(topic, source)
    ]
    pause = state.pauses.get(source)
    controls = _control_position(state, source)
    chunks = [positions[i : i + per_record] for i in range(0, len(positions), per_record)] or [[]]
    # Shared partitions ride in parts of their own after the positions: a few per record, as leases add up.
    per_shared = max(per_record // 10, 1)
    shared_chunks = [shared[i : i + per_shared] for i in range(0, len(shared), per_shared)]
    parts: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = [(tuple(chunk), ()) for chunk in chunks]
    parts += [((), tuple(chunk)) for chunk in shared_chunks]
    # The directory, if known, in every part (an empty share where it has none left): a reader knows it only if
    # every part has one.  Parts of their own after the rest if it needs more than they have.
    names = state.groups_before(source)
    shares: list[tuple[str, ...] | None] = [None] * len(parts)
    if names is not None:
        shares = list(directory_chunks(names))
        parts += [((), ())] * (len(shares) - len(parts))
        shares += [()] * (len(parts) - len(shares))
    return [
        codec.Checkpoint(
            **common,
            source=source,
            as_of=as_of,
            part=index,
            parts=len(parts),
            positions=chunk,
            shared=shared_chunk,
            pause=None if pause is None else _pause_position(pause),
            controls=controls,
            directory=share,
        )
        for index, ((chunk, shared_chunk), share) in enumerate(zip(parts, shares))
    ]


def directory_chunks(names: Iterable[str], budget: int = DIRECTORY_BYTES_PER_RECORD) -> list[tuple[str, ...]]:
    """``names`` sorted, in shares of at most ``budget`` bytes of JSON each (at least one name a share; one empty
    share if there is no name)."""
    chunks: list[tuple[str, ...]] = []
    chunk: list[str] = []
    size = 0
    for name in sorted(names):
        cost = len(msgspec.json.encode(name)) + 1
        if chunk and size + cost > budget:
            chunks.append(tuple(chunk))
            chunk, size = [], 0
        chunk.append(name)
        size += cost
    chunks.append(tuple(chunk))
    return chunks


def directory_of(parts: Sequence[codec.Checkpoint]) -> frozenset[str] | None:
    """The groups a complete checkpoint lists, or None if it lists none: written by a release before 0.7.0, by a
    writer that did not know them, or malformed (a part without its share, a share that is not an array of
    names, more than MAX_DIRECTORY names).  A malformed directory is ignored, never trusted in part."""
    return directory_of_shares([part.directory for part in parts])


def directory_of_shares(shares: Sequence[Any]) -> frozenset[str] | None:
    """The union of the parts' shares of a directory (see :func:`directory_of`)."""
    names: set[str] = set()
    for share in shares:
        if not isinstance(share, (list, tuple)) or len(share) > MAX_DIRECTORY:
            return None
        for name in share:
            if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH:
                return None
        names.update(share)
        if len(names) > MAX_DIRECTORY:
            return None
    return frozenset(names) if shares else None


def seed(state: WorldState, parts: Sequence[codec.Checkpoint], source: int) -> None:
    """Load a complete checkpoint of ``source`` into ``state`` (which has read nothing of ``source`` yet).

    Positions of topics that are not routed to ``source`` are ignored, as the fold ignores misrouted records.
    """
    for part in parts:
        for position in part.positions:
            if state.routed_here(position.topic, source):
                state.partitions[(position.topic, position.partition)] = _partition_state(position)
        for shared in part.shared:
            found = _shared_partition(shared)
            if found is not None and state.routed_here(shared.topic, source):
                state.shared[(shared.topic, shared.partition)] = found
    state.partitions_restored()
    pause = parts[0].pause if parts else None
    if pause is not None:
        state.pauses[source] = _pause(pause)
    controls = parts[0].controls if parts else None
    if controls is not None:
        orders = {name: dict(getattr(controls, name)) for name in _CONTROL_FIELDS}
        if any(orders.values()):
            state.controls[source] = Controls(**orders)
        for topic, until in controls.topic_pauses:
            if state.routed_here(topic, source):
                state.topic_pauses[topic] = until
    state.set_directory(source, directory_of(parts))


def _control_position(state: WorldState, source: int) -> codec.ControlPosition | None:
    """The operators' orders of coordination partition ``source``, or None if it has none."""
    controls = state.controls.get(source)
    orders = {
        name: tuple(sorted(getattr(controls, name).items())) if controls is not None else () for name in _CONTROL_FIELDS
    }
    topic_pauses = tuple(sorted((t, until) for t, until in state.topic_pauses.items() if state.routed_here(t, source)))
    if not (any(orders.values()) or topic_pauses):
        return None
    return codec.ControlPosition(**orders, topic_pauses=topic_pauses)


class Assembler:
    """Collects the parts of the checkpoints met while scanning a partition; keeps the latest complete one."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], dict[int, codec.Checkpoint]] = {}
        self.latest: list[codec.Checkpoint] | None = None

    def add(self, record: codec.Checkpoint) -> None:
        key = (record.instance, record.as_of)
        parts = self._parts.setdefault(key, {})
        if parts and next(iter(parts.values())).parts != record.parts:
            return  # parts of one checkpoint that disagree on their number: not an honest writer's
        parts[record.part] = record
        if len(parts) == record.parts and all(i in parts for i in range(record.parts)):
            complete = [parts[i] for i in range(record.parts)]
            if self.latest is None or record.as_of >= self.latest[0].as_of:
                self.latest = complete
            del self._parts[key]


class DirectoryFinder:
    """The directories of other groups' checkpoints met while scanning a partition.

    Keeps the latest complete one that does not list ``group``: ``group`` had no record on the partition
    before its ``as_of``, so a reader of ``group`` may start there with the empty state.  Only the directory of
    each part is kept, not its positions.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self._shares: dict[tuple[str, str, int], tuple[int, dict[int, Any]]] = {}
        self.latest: tuple[int, frozenset[str]] | None = None  # (as_of, directory)

    def add(self, record: codec.Checkpoint) -> None:
        if record.directory is None:
            return  # a part without a directory: its checkpoint has none
        key = (record.group, record.instance, record.as_of)
        parts, shares = self._shares.setdefault(key, (record.parts, {}))
        if parts != record.parts:
            return  # parts of one checkpoint that disagree on their number: not an honest writer's
        shares[record.part] = record.directory
        if len(shares) < parts or not all(i in shares for i in range(parts)):
            return
        del self._shares[key]
        names = directory_of_shares([shares[i] for i in range(parts)])
        if names is None or self.group in names:
            return
        if self.latest is None or record.as_of > self.latest[0]:
            self.latest = (record.as_of, names)


@dataclass(frozen=True)
class Start:
    """Where a reader of a group starts on one coordination partition.

    At its group's own checkpoint (``checkpoint``: seed from it), at another group's checkpoint whose directory
    does not list the group (``directory``: the empty state, and the groups before ``offset``),
    or at the beginning (``offset`` None).
    """

    offset: int | None = None
    checkpoint: list[codec.Checkpoint] | None = None
    directory: frozenset[str] | None = None

    @property
    def kind(self) -> str:
        """For people: "checkpoint", "directory" or "beginning"."""
        return "checkpoint" if self.checkpoint is not None else "directory" if self.offset is not None else "beginning"


BEGINNING = Start()


def choose_start(own: list[codec.Checkpoint] | None, elsewhere: tuple[int, frozenset[str]] | None) -> Start:
    """The later of the group's own latest checkpoint and the latest other group's directory that does not list it
    (both are sound; the later leaves less to read; on a tie, the own one, which names its writer)."""
    if own is not None and (elsewhere is None or own[0].as_of >= elsewhere[0]):
        return Start(offset=own[0].as_of, checkpoint=own)
    if elsewhere is not None:
        return Start(offset=elsewhere[0], directory=elsewhere[1])
    return BEGINNING


def begin(state: WorldState, start: Start, source: int) -> None:
    """Make ``state`` (which has read nothing of ``source`` yet) what a reader knows at ``start``."""
    if start.checkpoint is not None:
        seed(state, start.checkpoint, source)
    else:
        state.set_directory(source, start.directory if start.offset is not None else ())


# A checkpoint is also due once this many records came after the latest one, however young it is: a reader starts
# by looking for the latest checkpoint among a partition's last 2,000 records (reader_start.py) and reads every
# record after it, so a busy log gets checkpoints as often as a quiet one gets records, and a restart after a
# fault storm reads a thousand records, not a minute's worth.  A large checkpoint (of many parts) waits for ten
# times its own records, so checkpoints stay under a tenth of the log.
CHECKPOINT_RECORDS = 1_000


def records_since_checkpoint(state: WorldState, source: int, read_to: int) -> int:
    """How many records of coordination partition ``source`` a reader that has read up to offset ``read_to``
    has read after the latest checkpoint's parts (all of them, if there was none)."""
    as_of, parts = state.checkpoint_offsets.get(source, (0, 0))
    return read_to - as_of - parts


def due(state: WorldState, source: int, now: int, interval_ms: int, me: MemberId, read_to: int = 0) -> bool:
    """Should ``me``, having read ``source`` up to offset ``read_to``, write its checkpoint now?

    The live member with the lowest instance id writes one every ``interval_ms``, or once CHECKPOINT_RECORDS (or ten
    times the latest checkpoint's parts) came after the latest; any member does once the last is 2 intervals old,
    or twice that many records behind (the writer is gone).
    """
    last = state.checkpoints.get(source)
    if last is None:
        return True
    age = now - last
    records = records_since_checkpoint(state, source, read_to)
    enough = max(CHECKPOINT_RECORDS, 10 * state.checkpoint_offsets.get(source, (0, 0))[1])
    if age < interval_ms and records < enough:
        return False
    if age >= 2 * interval_ms or records >= 2 * enough:
        return True
    members = state.live_members(now) | {me}
    return min(members, key=lambda owner: owner.instance) == me


class NoCheckpointRule(TypeError):
    """A field of the fold's state that no checkpoint carries, or a wire field of a checkpoint nothing fills."""


def by_name(
    kept: type, wire: type[msgspec.Struct], kept_rules: Sequence[str], wire_rules: Sequence[str]
) -> tuple[str, ...]:
    """The fields of dataclass ``kept`` that a checkpoint carries in the field of the same name of ``wire``: all
    but ``kept_rules``, converted by rules of their own to and from ``wire_rules``.  Raises NoCheckpointRule for a
    field of either that is neither, and for a rule about a field that is not there."""
    kept_names = [found.name for found in dataclasses.fields(kept)]
    wire_names = list(wire.__struct_fields__)
    same = tuple(name for name in kept_names if name not in kept_rules)
    for name in same:
        if name not in wire_names:
            raise NoCheckpointRule(
                f"{kept.__name__}.{name} has no checkpoint rule: no field {name} in codec."
                f"{wire.__name__}, and no rule of its own in checkpoints.py"
            )
    for name in wire_names:
        if name not in same and name not in wire_rules:
            raise NoCheckpointRule(
                f"codec.{wire.__name__}.{name} has no checkpoint rule: no field {name} in "
                f"{kept.__name__}, and no rule of its own in checkpoints.py"
            )
    for names, cls in ((kept_rules, kept), (wire_rules, wire)):
        stale = [name for name in names if name not in (kept_names if cls is kept else wire_names)]
        if stale:
            raise NoCheckpointRule(f"checkpoints.py has a rule for {cls.__name__}.{stale[0]}, which is not a field")
    return same


def check_carried(state: type, carried: Sequence[str], not_carried: Sequence[str]) -> None:
    """Raise NoCheckpointRule for a field of dataclass ``state`` that its equality covers and that is neither
    ``carried`` by a checkpoint nor declared ``not_carried`` (caches and indexes, compare=False, are neither)."""
    for found in dataclasses.fields(state):
        if found.compare and found.name not in carried and found.name not in not_carried:
            raise NoCheckpointRule(
                f"{state.__name__}.{found.name} has no checkpoint rule: carry it (state_records, "
                f"seed) or say why a reader that starts at a checkpoint need not have it"
            )


# What of a WorldState a checkpoint carries (and the directory, which is not part of its equality: groups_seen,
# directory_known).  The rest of what its equality covers is the reader's own, or rebuilt from the records after
# ``as_of``: a claim counts for balance only within 2 HB (the module's docstring), and the time and place of the
# latest checkpoint are those of the checkpoint itself, which lies after its ``as_of``.
check_carried(
    WorldState,
    carried=("partitions", "shared", "pauses", "controls", "topic_pauses"),
    not_carried=(
        "group",
        "heartbeat_ms",
        "coordination_partitions",
        "last_claim",
        "last_refused_claim",
        "clients",
        "checkpoints",
        "checkpoint_offsets",
        "stats",
    ),
)


# How a checkpoint carries the fold's dataclasses (codec.py: Position, SharedPosition, LeasePosition, PausePosition,
# ControlPosition): every field by the wire field of the same name, except those named here, which the functions
# below convert (the owner split in two, sets and dicts as sorted tuples, ...).  A field of either side that is
# neither stops the import, naming the field: a new field is carried or refused, never silently dropped.
_POSITION_FIELDS = by_name(
    PartitionState,
    codec.Position,
    kept_rules=("owner", "done"),
    wire_rules=("topic", "partition", "owner_client", "owner_instance", "done"),
)
_SHARED_FIELDS = by_name(
    SharedPartition,
    codec.SharedPosition,
    kept_rules=("done", "leases", "tries"),
    wire_rules=("topic", "partition", "done", "leases", "tries"),
)
_LEASE_FIELDS = by_name(
    Lease,
    codec.LeasePosition,
    kept_rules=("start", "holder", "handed", "acked", "progress", "dead"),
    wire_rules=("offset", "client", "instance", "handed", "acked", "progress", "dead"),
)
_PAUSE_FIELDS = by_name(Pause, codec.PausePosition, kept_rules=(), wire_rules=())
# Every field of Controls is a dict (client -> time), carried as its sorted items; the topic pauses come from the
# world state (_control_position).
_CONTROL_FIELDS = by_name(Controls, codec.ControlPosition, kept_rules=(), wire_rules=("topic_pauses",))


def _position(topic: str, partition: int, found: PartitionState) -> codec.Position:
    owner = found.owner
    return codec.Position(
        topic=topic,
        partition=partition,
        owner_client=None if owner is None else owner.client,
        owner_instance=None if owner is None else owner.instance,
        done=None if found.done is None else list(found.done),
        **{name: getattr(found, name) for name in _POSITION_FIELDS},
    )


def _partition_state(position: codec.Position) -> PartitionState:
    owner = None
    if position.owner_client is not None and position.owner_instance is not None:
        owner = MemberId(position.owner_client, position.owner_instance)
    done = None
    if position.done is not None and position.offset is not None:
        done = done_set.parse(position.offset, position.done) or None
    found = PartitionState(owner=owner, done=done, **{name: getattr(position, name) for name in _POSITION_FIELDS})
    # What the writer reported is checked as the fold checks a heartbeat's report, and a request to hand a
    # partition over needs an owner to ask: a checkpoint is no more trusted than the records it stands for.
    for name in REPORT_FIELDS:
        setattr(found, name, reported_number(getattr(found, name)))
    found.release_requested = found.release_requested and owner is not None
    return found


def _shared_position(topic: str, partition: int, found: SharedPartition) -> codec.SharedPosition:
    return codec.SharedPosition(
        topic=topic,
        partition=partition,
        done=tuple(found.done),
        leases=tuple(_lease_position(lease) for lease in sorted(found.leases.values(), key=lambda lease: lease.start)),
        tries=tuple(tuple(t) for t in found.tries),  # type: ignore[misc]
        **{name: getattr(found, name) for name in _SHARED_FIELDS},
    )


def _lease_position(lease: Lease) -> codec.LeasePosition:
    return codec.LeasePosition(
        offset=lease.start,
        client=lease.holder.client,
        instance=lease.holder.instance,
        handed=tuple((o, d, c) for o, (d, c) in sorted(lease.handed.items())),
        acked=tuple(sorted(lease.acked)),
        progress=tuple(lease.progress),
        dead=tuple(sorted(lease.dead)),
        **{name: getattr(lease, name) for name in _LEASE_FIELDS},
    )


def _shared_partition(position: codec.SharedPosition) -> SharedPartition | None:
    """The bookkeeping a checkpoint carries, or None if it breaks the invariants (not an honest writer's)."""
    if not _honest_shared(position):
        return None
    return SharedPartition(
        done=[(start, end) for start, end in position.done],
        leases={lease.offset: _lease(lease) for lease in position.leases},
        tries=[Tries(*t) for t in position.tries],
        **{name: getattr(position, name) for name in _SHARED_FIELDS},
    )


def _lease(position: codec.LeasePosition) -> Lease:
    return Lease(
        start=position.offset,
        holder=MemberId(position.client, position.instance),
        handed={o: (d, c) for o, d, c in position.handed},
        acked=set(position.acked),
        progress=[(start, end) for start, end in position.progress],
        dead=set(position.dead),
        **{name: getattr(position, name) for name in _LEASE_FIELDS},
    )


def _pause_position(pause: Pause) -> codec.PausePosition:
    return codec.PausePosition(**{name: getattr(pause, name) for name in _PAUSE_FIELDS})


def _pause(position: codec.PausePosition) -> Pause:
    return Pause(**{name: getattr(position, name) for name in _PAUSE_FIELDS})


def _honest_shared(position: codec.SharedPosition) -> bool:
    """Does a shared partition's bookkeeping keep the invariants the fold keeps (an honest writer's does)?"""
    low = position.low
    runs = [(start, end) for start, end in position.done] + [(lease.offset, lease.end) for lease in position.leases]
    if low is None and runs:
        return False
    if any(start >= end or start < (low or 0) for start, end in runs):
        return False
    done = list(position.done)
    if (done and done[0][0] <= (low or 0)) or any(a[1] >= b[0] for a, b in itertools.pairwise(done)):
        return False  # done ranges out of order (the fold's lookups bisect them), touching, or not above ``low``
    ordered = sorted(runs)
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        return False  # a done range and a lease, or two leases, overlap
    tries = [Tries(*t) for t in position.tries]
    if any(t.start >= t.end or t.count < 1 for t in tries):
        return False
    if any(a.end > b.start for a, b in itertools.pairwise(tries)):
        return False  # tries out of order or overlapping
    if any(
        not lease.offset <= offset < lease.end
        for lease in position.leases
        for offset in [*(h[0] for h in lease.handed), *lease.acked]
    ):
        return False  # a client's message outside its lease
    for lease in position.leases:  # the holder's progress: runs inside the lease, sorted and apart
        progress = list(lease.progress)
        if any(not lease.offset <= start < end <= lease.end for start, end in progress):
            return False
        if any(a[1] >= b[0] for a, b in itertools.pairwise(progress)):
            return False
        if any(not _in_runs(progress, offset) for offset in lease.dead):
            return False  # a dead letter the progress does not mark done
        if list(lease.dead) != sorted(set(lease.dead)):
            return False
    return True


def _in_runs(runs: list[tuple[int, int]], offset: int) -> bool:
    """Is ``offset`` in one of the sorted, disjoint ``runs``?"""
    index = bisect.bisect_right(runs, (offset, 2**63)) - 1
    return index >= 0 and runs[index][1] > offset
