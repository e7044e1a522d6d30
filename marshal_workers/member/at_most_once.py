"""At most once: the batch claims a member's workers ask for, how they are written, and what their verdicts mean.

A worker of an at-most-once whole partition claims the end of its next batch before it handles it, and handles
nothing at or past the end claimed.  A supervisor's message claims (runtime/supervisor/message_claims.py) feed this
object the claims its workers ask on their pipes, a simulated member's (simulation/amo_claims.py) those of its
simulated workers; both take the same steps:

* group commit: while one message-claim write is in flight, the claims asked meanwhile wait for it
  (protocol/claim_batching.py), then go together in one write, a record per topic (member/record_chunks.py);
* a claim of a partition lost meanwhile is refused without a write; one of a worker since replaced is dropped
  (its successor asks for itself);
* the verdicts: an accepted claim moves the partition's claimed end on and extends its worker's lease
  (partition_holding.extend_lease); the worker is told CLAIMED, REFUSED (not ours, or our lease lapsed in the
  log), or UNCONFIRMED (Kafka did not confirm the write within an HB: it asks again; the log keeps the highest
  claim).  The write fails fast, within an HB: a worker waits on it.

It reads no clock and talks to no worker itself: the :class:`ClaimsShell` it is given writes, answers and reads
the lease clock.  What a refused worker does next (it stops; its partition is forgotten if another member owns it)
is its driver's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from marshal_workers.member.partition_holding import Key, extend_lease
from marshal_workers.member.record_chunks import entry_verdicts, topic_chunks
from marshal_workers.member.shell import Log, OnFailure, OnVerdicts, Quiet
from marshal_workers.protocol import codec
from marshal_workers.protocol.claim_batching import ClaimBatching


class ClaimAnswer(enum.IntEnum):
    """The member's answer to a worker's batch claim."""

    REFUSED = 0  # the partition is not ours (any more): stop, handle nothing
    CLAIMED = 1  # written and accepted: handle the batch (while the lease holds)
    UNCONFIRMED = 2  # Kafka did not confirm the claim within an HB: handle nothing yet, ask again


class Claimant(Protocol):
    """What the core needs of an at-most-once partition the member holds (the driver's own object)."""

    @property
    def key(self) -> Key: ...

    lost: bool  # someone else owns it now: refused without asking the log
    claimed_end: int  # the end of the last batch claim accepted (-1: none); a new owner never resumes before it
    lease_until_ms: int  # its worker handles nothing at or after this (the lease clock's ms)


A = TypeVar("A", bound=Claimant)
A_contra = TypeVar("A_contra", bound=Claimant, contravariant=True)  # the shell takes partitions, never gives them
Asked = tuple[A, object, int]  # (the partition, the worker that asked, the end offset claimed)


class ClaimsShell(Protocol[A_contra]):
    """What the core needs of the member around it: its writes, its lease clock, its workers."""

    def fields(self) -> dict[str, Any]:
        """A record's common fields (client, instance, ts ...)."""
        ...

    def lease_clock_ms(self) -> int:
        """Milliseconds on the clock of its workers' leases (read before a write: the lease errs short)."""
        ...

    def submit(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None:
        """Write ``records``, failing after ``within`` seconds if not confirmed; the callbacks come back later."""
        ...

    def current(self, held: A_contra, worker: object) -> bool:
        """Is ``worker`` (the one that asked) still ``held``'s worker?"""
        ...

    def answer(self, held: A_contra, worker: object, answer: ClaimAnswer) -> None:
        """Tell ``worker`` what became of its claim."""
        ...


class ClaimCounts(Protocol):
    """What the core counts (a supervisor's metrics Counters has it too)."""

    message_claims_unconfirmed: int  # batch claims Kafka did not confirm within an HB


@dataclass
class BatchClaimCounters:
    """The core's counts when its driver keeps no metrics of its own."""

    message_claims_unconfirmed: int = 0


class BatchClaims(Generic[A]):
    """The batch claims of one member's at-most-once partitions."""

    def __init__(
        self, shell: ClaimsShell[A], heartbeat_s: float, log: Log | None = None, counters: ClaimCounts | None = None
    ) -> None:
        """``heartbeat_s``: the HB, which the leases are counted in and a write must be confirmed within."""
        self.shell = shell
        self.heartbeat_s = heartbeat_s
        self.heartbeat_ms = round(heartbeat_s * 1000)
        self.log: Log = Quiet() if log is None else log
        self.counters: ClaimCounts = BatchClaimCounters() if counters is None else counters
        self.writes = 0
        self._claims: ClaimBatching[Asked[A]] = ClaimBatching()  # asked while a claim write is in flight wait for it

    def ask(self, held: A, end: int, worker: object = None) -> None:
        """``worker`` (``held``'s) asks to claim every message of its partition before ``end``: written with the
        next write (:meth:`step`, or when the write in flight is decided)."""
        self._claims.ask((held, worker, end))

    def step(self) -> None:
        """Write the claims asked since the last write, unless a write is in flight (they wait for it)."""
        self._write_held()

    # ---------------------------------------------------------- the writes

    def _write_held(self) -> None:
        """Write the held claims of the workers still there; refuse those of partitions no longer ours."""
        shell = self.shell
        asked: list[Asked[A]] = []
        for held, worker, end in self._claims.take():
            if not shell.current(held, worker):
                continue  # that worker is gone: its successor asks for itself
            if held.lost:
                shell.answer(held, worker, ClaimAnswer.REFUSED)  # not ours: refused without asking the log
            else:
                asked.append((held, worker, end))
        if not asked:
            return
        written_ms = shell.lease_clock_ms()  # before the write: the lease errs short
        topics = [held.key[0] for held, _, _ in asked]
        chunks = topic_chunks(topics)
        fields = shell.fields()
        records: list[codec.Record] = [
            codec.MessageClaims(
                **fields,
                topic=topics[chunk[0]],
                claims=tuple(codec.MessageClaim(partition=asked[i][0].key[1], offset=asked[i][2]) for i in chunk),
            )
            for chunk in chunks
        ]
        self._claims.writing()
        self.writes += 1

        def decided(verdicts: list[Any]) -> None:
            self._after(asked, entry_verdicts(chunks, verdicts, len(asked)), written_ms)

        # Fail fast: a worker waits on this.  Told so, it asks again (the log keeps the highest claim).
        shell.submit(
            "message claim", records, decided, lambda exc: self._failed(asked, written_ms, exc), within=self.heartbeat_s
        )

    def _after(self, asked: list[Asked[A]], verdicts: Sequence[bool | None], written_ms: int) -> None:
        """Answer the workers whose claims were decided: claimed (handle it), refused (not ours: stop) or not
        confirmed (ask again).  Then write the claims held meanwhile."""
        shell = self.shell
        for (held, worker, end), verdict in zip(asked, verdicts):
            answer = answer_of(verdict)
            if answer is ClaimAnswer.CLAIMED:
                held.claimed_end = max(held.claimed_end, end)
                extend_lease(held, written_ms, self.heartbeat_ms)
            elif answer is ClaimAnswer.UNCONFIRMED:
                self.counters.message_claims_unconfirmed += 1
            if shell.current(held, worker):  # not a worker that has since been replaced
                shell.answer(held, worker, answer)
        self._decided()

    def _failed(self, asked: list[Asked[A]], written_ms: int, exc: Exception) -> None:
        """Kafka did not confirm the claims in time: those workers ask again (or stop, if asked to)."""
        for held, _, end in asked:
            self.log.warning(
                "%s[%d]: claim of the messages before offset %d: %s; its worker asks again", *held.key, end, exc
            )
        self._after(asked, [None] * len(asked), written_ms)

    def _decided(self) -> None:
        """The message-claim write in flight is decided: the next one carries the claims held meanwhile."""
        self._claims.decided()
        self._write_held()


def answer_of(verdict: bool | None) -> ClaimAnswer:
    """What a claim's verdict means for its worker: the fold accepted it (handle the batch), refused it (the
    partition is not ours, or our lease lapsed: handle nothing), or the write was not confirmed (None: handle
    nothing yet, ask again)."""
    if verdict is None:
        return ClaimAnswer.UNCONFIRMED
    return ClaimAnswer.CLAIMED if verdict else ClaimAnswer.REFUSED
