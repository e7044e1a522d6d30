"""Checkpoints: a reader's start-up does not grow with the coordination log's age (docs/protocol.md).

Every ``checkpoint_interval`` one member writes, to each coordination
partition, the fold's state of that partition (every position, owner and
pause of the topics routed there) as of a log offset ``as_of``: a
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
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.codec import MAX_DIRECTORY, MAX_NAME_LENGTH, reported_number
from marshal_workers.protocol.range_leases import Holder, Lease, SharedPartition, Tries
from marshal_workers.protocol.world_state import Controls, Owner, PartitionState, Pause, WorldState

# Positions per record: well below Kafka's default 1 MB message, even with done sets.
POSITIONS_PER_RECORD = 1000
# The directory's share of one record, in bytes of JSON (a name takes up to 6 bytes a character): a small directory
# rides in the first part, a large one spreads over parts, up to MAX_DIRECTORY names (codec.py) in all.
DIRECTORY_BYTES_PER_RECORD = 64 * 1024


def state_records(
    state: WorldState, source: int, as_of: int, common: dict[str, Any], per_record: int = POSITIONS_PER_RECORD
) -> list[codec.Checkpoint]:
    """The checkpoint of coordination partition ``source``: ``state`` as folded up to log offset ``as_of``."""
    positions = [_position(topic, partition, found) for (topic, partition), found in sorted(state.partitions.items())
                 if state.routed_here(topic, source)]  # fmt: skip
    shared = [_shared_position(topic, partition, found) for (topic, partition), found in sorted(state.shared.items())
              if state.routed_here(topic, source)]  # fmt: skip
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
            **common, source=source, as_of=as_of, part=index, parts=len(parts), positions=chunk, shared=shared_chunk,
            pause=None if pause is None else codec.PausePosition(until=pause.until, client=pause.client),
            controls=controls, directory=share,
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
        state.pauses[source] = Pause(until=pause.until, client=pause.client)
    controls = parts[0].controls if parts else None
    if controls is not None:
        if controls.drained or controls.shutdowns:
            state.controls[source] = Controls(drained=dict(controls.drained), shutdowns=dict(controls.shutdowns))
        for topic, until in controls.topic_pauses:
            if state.routed_here(topic, source):
                state.topic_pauses[topic] = until
    state.set_directory(source, directory_of(parts))


def _control_position(state: WorldState, source: int) -> codec.ControlPosition | None:
    """The operators' orders of coordination partition ``source``, or None if it has none."""
    controls = state.controls.get(source)
    drained = tuple(sorted(controls.drained.items())) if controls is not None else ()
    shutdowns = tuple(sorted(controls.shutdowns.items())) if controls is not None else ()
    topic_pauses = tuple(sorted((t, until) for t, until in state.topic_pauses.items() if state.routed_here(t, source)))
    if not (drained or shutdowns or topic_pauses):
        return None
    return codec.ControlPosition(drained=drained, shutdowns=shutdowns, topic_pauses=topic_pauses)


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


def due(state: WorldState, source: int, now: int, interval_ms: int, me: Owner) -> bool:
    """Should ``me`` write the checkpoint of ``source`` now?

    The live member with the lowest instance id writes one every ``interval_ms``;
    any member does once the last is 2 intervals old (the writer is gone).
    """
    last = state.checkpoints.get(source)
    age = now - last if last is not None else None
    if age is not None and age < interval_ms:
        return False
    if age is None or age >= 2 * interval_ms:
        return True
    members = state.live_members(now) | {me}
    return min(members, key=lambda owner: owner.instance) == me


def _position(topic: str, partition: int, found: PartitionState) -> codec.Position:
    owner = found.owner
    return codec.Position(
        topic=topic, partition=partition,
        owner_client=None if owner is None else owner.client, owner_instance=None if owner is None else owner.instance,
        last_ts=found.last_ts, offset=found.offset, amo_offset=found.amo_offset,
        done=None if found.done is None else list(found.done),
        lag=found.lag, rate=found.rate, in_flight=found.in_flight, window_used=found.window_used,
        call_age_s=found.call_age_s,
        release_requested=found.release_requested,
    )  # fmt: skip


def _partition_state(position: codec.Position) -> PartitionState:
    owner = None
    if position.owner_client is not None and position.owner_instance is not None:
        owner = Owner(position.owner_client, position.owner_instance)
    done = None
    if position.done is not None and position.offset is not None:
        done = done_set.parse(position.offset, position.done) or None
    return PartitionState(
        owner=owner, last_ts=position.last_ts, offset=position.offset, amo_offset=position.amo_offset, done=done,
        lag=reported_number(position.lag), rate=reported_number(position.rate),
        in_flight=reported_number(position.in_flight), window_used=reported_number(position.window_used),
        call_age_s=reported_number(position.call_age_s),
        release_requested=position.release_requested and owner is not None,
    )  # fmt: skip


def _shared_position(topic: str, partition: int, found: SharedPartition) -> codec.SharedPosition:
    return codec.SharedPosition(
        topic=topic, partition=partition, low=found.low, done=tuple(found.done),
        leases=tuple(
            codec.LeasePosition(offset=lease.start, end=lease.end, client=lease.holder.client,
                                instance=lease.holder.instance, expires=lease.expires, claimed_at=lease.claimed_at,
                                amo=lease.amo, handed=tuple((o, d, c) for o, (d, c) in sorted(lease.handed.items())),
                                acked=tuple(sorted(lease.acked)), progress=tuple(lease.progress),
                                dead=tuple(sorted(lease.dead)))
            for lease in sorted(found.leases.values(), key=lambda lease: lease.start)
        ),
        tries=tuple(tuple(t) for t in found.tries),  # type: ignore[misc]
        acked=found.acked, dead_letters=found.dead_letters, lost=found.lost, lapsed=found.lapsed, high=found.high,
    )  # fmt: skip


def _shared_partition(position: codec.SharedPosition) -> SharedPartition | None:
    """The bookkeeping a checkpoint carries, or None if it breaks the invariants (not an honest writer's)."""
    low = position.low
    runs = [(start, end) for start, end in position.done] + [(lease.offset, lease.end) for lease in position.leases]
    if low is None and runs:
        return None
    if any(start >= end or start < (low or 0) for start, end in runs):
        return None
    done = list(position.done)
    if (done and done[0][0] <= (low or 0)) or any(a[1] >= b[0] for a, b in itertools.pairwise(done)):
        return None  # done ranges out of order (the fold's lookups bisect them), touching, or not above ``low``
    ordered = sorted(runs)
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        return None  # a done range and a lease, or two leases, overlap
    tries = [Tries(*t) for t in position.tries]
    if any(t.start >= t.end or t.count < 1 for t in tries) or any(a.end > b.start for a, b in itertools.pairwise(tries)):
        return None
    if any(not lease.offset <= offset < lease.end for lease in position.leases
           for offset in [*(h[0] for h in lease.handed), *lease.acked]):  # fmt: skip
        return None  # a client's message outside its lease
    for lease in position.leases:  # the holder's progress: runs inside the lease, sorted and apart
        progress = list(lease.progress)
        if any(not lease.offset <= start < end <= lease.end for start, end in progress):
            return None
        if any(a[1] >= b[0] for a, b in itertools.pairwise(progress)):
            return None
        if any(not _in_runs(progress, offset) for offset in lease.dead):
            return None  # a dead letter the progress does not mark done
        if list(lease.dead) != sorted(set(lease.dead)):
            return None
    leases = {
        lease.offset: Lease(lease.offset, lease.end, Holder(lease.client, lease.instance), lease.expires, lease.amo,
                            lease.claimed_at, {o: (d, c) for o, d, c in lease.handed}, set(lease.acked),
                            [(start, end) for start, end in lease.progress], set(lease.dead))
        for lease in position.leases
    }  # fmt: skip
    return SharedPartition(
        low=low, done=[(start, end) for start, end in done], leases=leases, tries=tries,
        acked=position.acked, dead_letters=position.dead_letters, lost=position.lost, lapsed=position.lapsed,
        high=position.high,
    )  # fmt: skip


def _in_runs(runs: list[tuple[int, int]], offset: int) -> bool:
    """Is ``offset`` in one of the sorted, disjoint ``runs``?"""
    index = bisect.bisect_right(runs, (offset, 2**63)) - 1
    return index >= 0 and runs[index][1] > offset
