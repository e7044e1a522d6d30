"""Checkpoints in a simulation: members write them as a real supervisor does, and a member that starts (a
restart after a crash, a join) begins at the latest one plus the log after it instead of the whole log.

Writing is the member core's ``CheckpointWriting`` (member/checkpoint_writing.py), which each simulated member
drives as a supervisor's checkpoint writer (runtime/supervisor/checkpoint_writer.py) does: its
``CheckpointSchedule`` (protocol/checkpoint_schedule.py) looks every HB at the coordination partitions without a
checkpoint in flight, ``checkpoints.due`` (the live member with the lowest instance id, every
``checkpoint_interval_s``; anyone once the last is 2 intervals old) decides, and ``checkpoints.state_records``
makes the records from the member's own fold as of its read position.

Starting is the coordination log's (kafka/reader_start.py: ``find_starts``; coordination_reader.py: ``start``): per
partition the latest complete checkpoint of the group (``checkpoints.Assembler``, ``checkpoints.choose_start``),
loaded into the member's empty fold (``checkpoints.begin``), reading on from its ``as_of``.

**Checkpoints agree**: a member that started at a checkpoint holds a fold equal to a fold of the whole log up
to the same offsets (as soon as it loaded the checkpoint, once it has read on, in its first pass, and at the end
of the run), in what decides anything: every partition's owner, record time, position (offset, AMO
offset, done set) and release request, the range leases, the operators' orders (drains, shutdowns, topic
pauses) and the group's pause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.invariants import Violations
from marshal_workers.simulation.member import SimMember
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.sim_log import SimulatedLog

WorldFactory = Callable[[int, int], WorldState]


class Fleet(Protocol):
    """What checkpointing needs of the simulation around it."""

    clock: VirtualClock
    log: SimulatedLog
    config: SimConfig
    violations: Violations
    world: WorldFactory


@dataclass
class Started:
    """A member instance that started at a checkpoint on some partition, until its fold is compared."""

    member: SimMember
    compared: bool = False


class Checkpointing:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.interval_ms = round(fleet.config.checkpoint_interval_s * 1000)
        self.enabled = self.interval_ms > 0
        self.started: list[Started] = []
        self._pending: dict[int, Started] = {}  # member.writer_id -> one not compared after reading on (lookups only)
        self.starts = 0  # member instances started after the log had records
        self.folded_at_start = 0  # the records they had to fold to catch up, starting at checkpoints
        self.folded_without = 0  # and from the beginning
        self.compared = 0

    # ------------------------------------------------------------- starting

    def start(self, member: SimMember) -> None:
        """Where ``member`` (a new instance, nothing read yet) begins on each coordination partition."""
        if not self.enabled:
            return
        log = self.fleet.log.partitions
        total = sum(len(entries) for entries in log)
        if not total:
            return
        from_checkpoint = False
        for partition, entries in enumerate(log):
            assembler = checkpoints.Assembler()
            for entry in entries:
                record = entry.record
                # A checkpoint of this partition, describing the log before itself (as reader_start._scan).
                if type(record) is codec.Checkpoint and record.source == partition and record.as_of <= entry.offset:
                    assembler.add(record)
            start = checkpoints.choose_start(assembler.latest, None)  # one group: no other group's directory
            checkpoints.begin(member.world, start, partition)
            if start.offset is not None:
                member.read_at[partition] = start.offset
                from_checkpoint = True
        self.starts += 1
        self.folded_without += total
        self.folded_at_start += sum(len(entries) - member.read_at[p] for p, entries in enumerate(log))
        if from_checkpoint:
            self.compare(member)  # the checkpoints alone, before any of the log after them
            self.started.append(Started(member))
            self._pending[member.writer_id] = self.started[-1]

    # ------------------------------------------------------------- agreeing

    def reading_on(self, member: SimMember) -> None:
        """A pass of ``member``'s loop, after it read the log: one started at a checkpoint is compared in its
        first (with what it read after the checkpoint)."""
        pending = self._pending
        if pending:
            started = pending.pop(member.writer_id, None)
            if started is not None:
                started.compared = True
                self.compare(member)

    def finish(self) -> None:
        """At the end of the run: every member started at a checkpoint and still running agrees."""
        for started in self.started:
            if started.member.alive:
                self.compare(started.member)

    def compare(self, member: SimMember) -> None:
        """The member's fold against a fold of the whole log up to the same offsets."""
        fleet = self.fleet
        config = fleet.config
        whole = fleet.world(config.heartbeat_ms, config.coordination_partitions)
        for partition, entries in enumerate(fleet.log.partitions):
            for entry in entries[: member.read_at[partition]]:
                whole.apply(entry.record, entry.at, partition)
        self.compared += 1
        differences = differ(member.world, whole)
        if differences:
            fleet.violations.add(
                "checkpoints agree",
                fleet.clock.now,
                f"{member.me.client}/{member.me.instance}, started at a checkpoint, folds "
                f"{'; '.join(differences[:3])}"
                + (f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""),
            )

    # ------------------------------------------------------------- figures

    def report(self) -> dict[str, Any]:
        return {
            "interval_s": self.fleet.config.checkpoint_interval_s,
            "starts": self.starts,
            "records_folded_at_start": self.folded_at_start,
            "records_folded_at_start_without_checkpoints": self.folded_without,
            "compared": self.compared,
        }


_FIELDS = ("owner", "last_ts", "offset", "amo_offset", "done", "release_requested")


def differ(seeded: WorldState, whole: WorldState) -> list[str]:
    """Where a fold started at checkpoints and a fold of the whole log disagree, in what decides anything."""
    found = []
    for key in sorted(set(seeded.partitions) | set(whole.partitions)):
        a, b = seeded.partitions.get(key), whole.partitions.get(key)
        for name in _FIELDS:
            left, right = getattr(a, name, None), getattr(b, name, None)
            if name == "last_ts" and (left, right) in ((None, 0), (0, None)):
                continue
            if left != right:
                found.append(f"{key[0]}[{key[1]}].{name} = {left!r}, the whole log {right!r}")
    for key in sorted(set(seeded.shared) | set(whole.shared)):
        if seeded.shared.get(key) != whole.shared.get(key):
            found.append(
                f"{key[0]}[{key[1]}]'s range leases {seeded.shared.get(key)!r}, the whole log {whole.shared.get(key)!r}"
            )
    for name, left, right in (
        ("drained", seeded.drained_clients(), whole.drained_clients()),
        ("topic pauses", dict(seeded.topic_pauses), dict(whole.topic_pauses)),
        ("group pause", seeded.paused_until(), whole.paused_until()),
        ("shutdowns", _shutdowns(seeded), _shutdowns(whole)),
    ):
        if left != right:
            found.append(f"{name} {left!r}, the whole log {right!r}")
    return found


def _shutdowns(state: WorldState) -> dict[int, dict[str, int]]:
    return {source: dict(controls.shutdowns) for source, controls in sorted(state.controls.items())}
