"""At most once: the batch claims AMO workers ask for on their pipes, written to the log and answered.

A worker of a whole partition sends the end offset of the batch it is about to
handle; the claim is written to the coordination log and the worker answered
(ClaimAnswer) once it is folded: claimed, refused (not ours), unconfirmed (ask
again).  Group commit: while one message-claim write is in flight, the claims
asked meanwhile wait for it and then go together in the next one.  Under load
that is one write for most of the workers' claims instead of one each; the
embedded broker spent most of an AMO fleet's CPU on those writes.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator, message_claim_verdicts
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol.claim_batching import ClaimBatching
from marshal_workers.runtime.channel import ClaimAnswer, monotonic_ms
from marshal_workers.runtime.messages import ClaimBatch as ClaimMessages
from marshal_workers.runtime.messages import ClaimVerdict, FromWorker, Outcomes
from marshal_workers.runtime.supervisor.assignments import Assignment, MessageClaim, Table


class MessageClaims:
    """The supervisor's component that answers AMO workers' batch claims (component.py's interface)."""

    def __init__(self, table: Table, coordinator: Coordinator, writes: InFlightWrites, settings: Settings,
                 counters: Counters, log: Any) -> None:  # fmt: skip
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        self.settings = settings
        self.counters = counters
        self.log = log
        self._claims: ClaimBatching[MessageClaim] = ClaimBatching()  # asked while a claim write is in flight wait for it

    # --------------------------------------------------------- the component

    def waitables(self) -> list[object]:
        """The pipes of the workers running."""
        return [a.connection for a in self.table.assignments.values() if a.process is not None and a.connection is not None]

    def step(self, now: float) -> None:
        """Write every claim the workers asked for since the last pass, all in one go, without waiting."""
        ready = self.table.ready
        for assignment in self.table.assignments.values():
            connection = assignment.connection
            # One message per pass, from the pipes the loop's wait found readable: a second one keeps its pipe
            # readable, so the next wait returns at once (Connection.poll would build a selector per call).
            if connection is None or connection not in ready:
                continue
            self._receive(assignment, connection)
        self._write_held_claims()

    def begin_stop(self) -> None:
        """Nothing: workers that still ask are answered as before, until they exit."""

    def stopped(self) -> bool:
        return True  # a claim in flight is its worker's concern: the worker stops or exits either way

    # ------------------------------------------------------------- the pipe

    def _receive(self, assignment: Assignment, connection: Connection) -> None:
        """One message from a worker's pipe: a batch claim (ClaimMessages), or what became of failed calls (Outcomes)."""
        try:
            message: FromWorker = connection.recv()
            if isinstance(message, Outcomes):  # what became of failed calls
                if isinstance(message.counts, dict):
                    self.counters.add_outcomes(assignment.topic, message.counts)
                return
            if isinstance(message, ClaimMessages):
                self._claims.ask((assignment, connection, message.end))
        except (EOFError, OSError):
            assignment.connection = None  # the worker is gone; reaping deals with it

    def _answer(self, assignment: Assignment, answer: ClaimAnswer) -> None:
        if assignment.connection is not None:
            try:
                assignment.connection.send(ClaimVerdict(answer))
            except OSError:
                pass  # the worker is gone; reaping deals with it

    # ---------------------------------------------------------- the writes

    def _write_held_claims(self) -> None:
        """Write the held claims of the workers still there; refuse those of partitions no longer ours."""
        asked: list[MessageClaim] = []
        for assignment, connection, end in self._claims.take():
            if assignment.connection is not connection:
                continue  # that worker is gone: its successor asks for itself
            if assignment.lost:
                self._answer(assignment, ClaimAnswer.REFUSED)  # not ours: refused without asking the log
            else:
                asked.append((assignment, connection, end))
        if not asked:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        claims = [(a.topic, a.partition, end) for a, _, end in asked]
        self._claims.writing()
        self.writes.submit(
            "message claim",
            self.coordinator.message_claims(claims),
            lambda verdicts: self._after_message_claims(asked, message_claim_verdicts(claims, verdicts), written_ms),
            lambda exc: self._message_claims_failed(asked, exc),
            # Fail fast: a worker waits on this.  Told so, it asks again (the log keeps the highest claim).
            within=self.settings.heartbeat_interval,
        )

    def _after_message_claims(self, asked: list[MessageClaim], verdicts: list[bool], written_ms: int) -> None:
        """Answer the workers whose claims have been folded: claimed (handle it) or refused (not ours: stop).
        Then write the claims held meanwhile."""
        for (assignment, connection, end), accepted in zip(asked, verdicts):
            if accepted:
                assignment.claimed_end = max(assignment.claimed_end, end)
                assignment.extend_lease(written_ms, self.settings.heartbeat_ms)
            if assignment.connection is connection:  # not a worker that has since been replaced
                self._answer(assignment, ClaimAnswer.CLAIMED if accepted else ClaimAnswer.REFUSED)
        self._message_claims_decided()

    def _message_claims_failed(self, asked: list[MessageClaim], exc: Exception) -> None:
        """Kafka did not confirm the claims in time: tell those workers, who ask again (or stop, if asked to).
        Then write the claims held meanwhile."""
        for assignment, connection, end in asked:
            self.counters.message_claims_unconfirmed += 1
            self.log.warning(
                "%s[%d]: claim of the messages before offset %d: %s; its worker asks again",
                assignment.topic, assignment.partition, end, exc,
            )  # fmt: skip
            if assignment.connection is connection:
                self._answer(assignment, ClaimAnswer.UNCONFIRMED)
        self._message_claims_decided()

    def _message_claims_decided(self) -> None:
        """The message-claim write in flight is decided: the next one carries the claims held meanwhile."""
        self._claims.decided()
        self._write_held_claims()
