"""Coordination writes a supervisor waits on without blocking its loop.

The supervisor's loop answers AMO workers' claims, reaps workers and handles
signals: it must never sit in a write.  Every claim, heartbeat, release and
message claim is submitted here with what to do on its verdicts, and
``collect()``, once per pass of the loop, runs those callbacks for the writes
whose records have been delivered and folded.  A write that fails, or is
not confirmed by its deadline, runs its failure callback instead.

Records of one topic go to one coordination partition and the producer keeps
their order, so writes about a partition are folded in the order submitted.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.kafka.coordinator import Coordinator, PendingWrite
from marshal_workers.protocol import codec

OnVerdicts = Callable[[list[bool]], None]
OnFailure = Callable[[CoordinationWriteError], None]


@dataclass
class _Write:
    what: str  # for the log and the state dump: "claim", "heartbeat", "release", "message claim"
    pending: PendingWrite
    on_verdicts: OnVerdicts
    on_failure: OnFailure
    give_up_at: float  # monotonic


class InFlightWrites:
    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._writes: list[_Write] = []
        self.last_confirmed = 0.0  # monotonic: the latest write confirmed, and the latest that failed (/healthz)
        self.last_failed = 0.0

    def submit(
        self,
        what: str,
        records: Sequence[codec.Record],
        on_verdicts: OnVerdicts,
        on_failure: OnFailure,
        within: float | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        """Produce ``records`` now; their verdicts (one per record) reach ``on_verdicts`` from a later collect().

        ``within``: seconds after which the write counts as failed even if Kafka may still confirm it
        (default: the write timeout).  A late verdict is then ignored.
        """
        try:
            pending = self._coordinator.submit(records, partitions)
        except CoordinationWriteError as exc:
            on_failure(exc)
            return
        give_up_at = pending.deadline if within is None else min(pending.deadline, time.monotonic() + within)
        self._writes.append(_Write(what, pending, on_verdicts, on_failure, give_up_at))

    def collect(self) -> None:
        """Run the callbacks of every write that is decided (confirmed, failed or overdue)."""
        now = time.monotonic()
        for write in list(self._writes):
            try:
                verdicts = self._coordinator.collect(write.pending)
            except CoordinationWriteError as exc:
                self._writes.remove(write)
                self.last_failed = now
                write.on_failure(exc)
                continue
            if verdicts is not None:
                self._writes.remove(write)
                self.last_confirmed = now
                write.on_verdicts(verdicts)
            elif now > write.give_up_at:
                self._writes.remove(write)
                self.last_failed = now
                write.on_failure(CoordinationWriteError(f"{write.what} not confirmed within {_age(write, now):.1f}s"))

    def counts(self) -> dict[str, int]:
        """Writes in flight by kind (the state dump)."""
        return dict(collections.Counter(write.what for write in list(self._writes)))


def _age(write: _Write, now: float) -> float:
    return now - write.pending.submitted_at
