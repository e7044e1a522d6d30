"""Checkpoints of the coordination log a member writes: each coordination partition's, when it is due from it.

Which member writes a coordination partition's checkpoint, and when, is the fold's (protocol/checkpoints.py:
``due``: the live member with the lowest instance id, every interval; anyone once the last is two intervals old);
when to look (every HB) and what is in flight (one write per partition) is protocol/checkpoint_schedule.py's; what
a checkpoint holds is the member's fold as of the offset it has read to (``state_records``), written to the
partition it describes.  A supervisor's checkpoint writer (runtime/supervisor/checkpoint_writer.py) and a simulated
member (simulation/member.py) drive this object; the :class:`CheckpointShell` reads the fold and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from marshal_workers.member.shell import Log, OnFailure, OnVerdicts, Quiet
from marshal_workers.protocol import codec
from marshal_workers.protocol.checkpoint_schedule import CheckpointSchedule
from marshal_workers.protocol.checkpoints import due, state_records
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")


class CheckpointShell(Protocol):
    """What the core needs of the member around it: its fold, its clock, its writes."""

    def read_folded(self, query: Callable[[WorldState, Sequence[int]], T]) -> T:
        """``query`` over the fold and, per coordination partition, the log offset it has folded up to (read
        together: a supervisor's reader holds its lock)."""
        ...

    def now_ms(self) -> int:
        """The wall clock it compares with the fold's record times (who is live, how old the last checkpoint is)."""
        ...

    def fields(self) -> dict[str, Any]:
        """A record's common fields (client, instance, ts ...)."""
        ...

    def partition_count(self) -> int:
        """The coordination topic's partitions."""
        ...

    def submit(
        self,
        what: str,
        records: list[codec.Record],
        on_verdicts: OnVerdicts,
        on_failure: OnFailure,
        partitions: list[int],
    ) -> None:
        """Write ``records`` to the coordination ``partitions`` (one per record); the callbacks come back later."""
        ...


class CheckpointWriting:
    """One member's checkpoints: the looks for those due from it, and their writes."""

    def __init__(
        self, me: MemberId, shell: CheckpointShell, heartbeat_s: float, interval_ms: int, log: Log | None = None
    ) -> None:
        """``interval_ms``: the checkpoint interval (0: this member writes none)."""
        self.me = me
        self.shell = shell
        self.schedule = CheckpointSchedule(heartbeat_s, interval_ms)  # on the member's monotonic clock
        self.log: Log = Quiet() if log is None else log

    def step(self, now: float, running: bool) -> None:
        """Write the checkpoint of each coordination partition that is due from us (none while stopping)."""
        if now < self.schedule.next_look:
            return  # most passes (a look every HB): nothing to read
        shell, me = self.shell, self.me
        now_ms, interval_ms = shell.now_ms(), self.schedule.interval_ms

        def is_due(partition: int) -> bool:
            return shell.read_folded(
                lambda world, read_to: due(world, partition, now_ms, interval_ms, me, read_to[partition])
            )

        for partition in self.schedule.to_write(now, running, shell.partition_count(), is_due):
            self._write(partition)

    def _write(self, partition: int) -> None:
        shell, schedule = self.shell, self.schedule
        fields = shell.fields()
        records: list[codec.Record] = shell.read_folded(
            lambda world, read_to: list(state_records(world, partition, read_to[partition], fields))
        )

        def written(_verdicts: list[Any]) -> None:
            schedule.settled(partition)

        def failed(exc: Exception) -> None:
            schedule.settled(partition)
            self.log.warning("checkpoint of coordination partition %d not confirmed: %s", partition, exc)

        shell.submit("checkpoint", records, written, failed, partitions=[partition] * len(records))
