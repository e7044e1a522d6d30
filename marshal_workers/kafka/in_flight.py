"""Coordination writes a supervisor waits on without blocking its loop.

The supervisor's loop answers AMO workers' claims, reaps workers and handles
signals: it must never sit in a write.  Every claim, heartbeat, release and
message claim is submitted here with what to do on its verdicts, and
``collect()``, once per pass of the loop, runs those callbacks for the writes
whose records have been delivered and folded.  A write that fails, or is
not confirmed by its deadline, runs its failure callback instead.

Records of one topic go to one coordination partition and the producer keeps
their order, so writes about a partition are folded in the order submitted.

One produce batch per pass: the writes submitted between ``begin_pass()`` and
``end_pass()`` (the components' steps of one pass of the loop) are staged, and
``end_pass()`` produces them together, one ``produce_batch`` per coordination
partition (Coordinator.send).  Produced one by one, a member's heartbeats of
several topics, its range claims and renewals and its releases each left as a
batch of its own; the embedded broker lists every batch of a partition on
every fetch, and every broker counts a request per batch (docs/brokers.md,
"Stalled fetches on a long partition").  Staging keeps each write's deadline
(it runs from its submit) and its order: a partition's records go in the
order submitted.  A write submitted outside a pass is produced at once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.kafka.coordination_writer import Coordinator, PendingWrite
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
    def __init__(self, coordinator: Coordinator, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: monotonic seconds, for ``within`` and the health times (a unit test's fake clock)."""
        self._coordinator = coordinator
        self._clock = clock
        self._writes: list[_Write] = []  # produced, waiting for their verdicts, in the order produced
        self._staged: list[_Write] = []  # submitted during the pass, produced by end_pass()
        self._in_pass = False
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
        """Produce ``records`` (at the end of the pass, or now outside one); their verdicts (one per record) reach
        ``on_verdicts`` from a later collect().

        ``within``: seconds after which the write counts as failed even if Kafka may still confirm it
        (default: the write timeout).  A late verdict is then ignored.  Both count from now, staged or not.
        """
        pending = self._coordinator.prepare(records, partitions)
        give_up_at = pending.deadline if within is None else min(pending.deadline, self._clock() + within)
        write = _Write(what, pending, on_verdicts, on_failure, give_up_at)
        if self._in_pass:
            self._staged.append(write)
        else:
            self._send([write])

    def begin_pass(self) -> None:
        """From now until end_pass(), submitted writes are staged, to be produced together."""
        self._in_pass = True

    def end_pass(self) -> None:
        """Produce the writes staged since begin_pass(), one produce_batch per coordination partition."""
        self._in_pass = False
        staged, self._staged = self._staged, []
        if staged:
            self._send(staged)

    def _send(self, writes: list[_Write]) -> None:
        """Produce ``writes``; those the producer refused run their failure callback, after the others are kept
        (a callback that submits again is produced after them, and is collected after them too)."""
        refusals = self._coordinator.send([write.pending for write in writes])
        self._writes.extend(write for write, refused in zip(writes, refusals) if refused is None)
        for write, refused in zip(writes, refusals):
            if refused is not None:
                write.on_failure(refused)

    def collect(self) -> None:
        """Run the callbacks of every write that is decided (confirmed, failed or overdue); staged writes wait."""
        now = self._clock()
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
        """Writes in flight by kind, staged ones included (the state dump)."""
        return dict(collections.Counter(write.what for write in list(self._writes) + list(self._staged)))


def _age(write: _Write, now: float) -> float:
    return now - write.pending.submitted_at
