"""When a member writes checkpoints: it looks every HB, and writes those due from it (checkpoints.due), one
write in flight per coordination partition.

Pure: ``now`` and a predicate in, partition numbers out.  The member core's checkpoint writing
(member/checkpoint_writing.py), which the supervisor and the simulator drive, steps it.
"""

from __future__ import annotations

from collections.abc import Callable


class CheckpointSchedule:
    """One member's looks for checkpoints to write, and the partitions whose checkpoint is being written."""

    def __init__(self, look_every_s: float, interval_ms: int) -> None:
        """``look_every_s``: the HB; ``interval_ms``: the checkpoint interval (0: this member writes none)."""
        self.look_every_s = look_every_s
        self.interval_ms = interval_ms
        self.next_look = 0.0  # on the caller's monotonic clock: before it, to_write looks at nothing
        self._in_flight: set[int] = set()

    def to_write(self, now: float, running: bool, partition_count: int, due: Callable[[int], bool]) -> list[int]:
        """The coordination partitions to write a checkpoint of now, in order: at most one look per
        ``look_every_s``; none while not running or with checkpoints off; none whose last write is in flight;
        of the rest, those ``due`` says are due from us.  They count as in flight until :meth:`settled`."""
        if now < self.next_look:
            return []
        self.next_look = now + self.look_every_s
        if not self.interval_ms or not running:
            return []
        chosen = [p for p in range(partition_count) if p not in self._in_flight and due(p)]
        self._in_flight.update(chosen)
        return chosen

    def settled(self, partition: int) -> None:
        """The checkpoint write of ``partition`` is done (confirmed or failed): it may be written again."""
        self._in_flight.discard(partition)
