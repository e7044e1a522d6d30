"""At most once: the batch claims AMO workers ask for on their pipes, the supervisor's shell of the member core's
BatchClaims (member/at_most_once.py).

A worker of a whole partition sends the end offset of the batch it is about to handle (ClaimBatch); the member
core writes the claims (group commit: while one message-claim write is in flight, the claims asked meanwhile wait
for it and then go together in the next one) and says what each verdict means; this component reads the pipes,
writes through InFlightWrites, and answers the workers (ClaimVerdict): claimed, refused (not ours), unconfirmed
(ask again).  Under load that is one write for most of the workers' claims instead of one each; the embedded
broker spent most of an AMO fleet's CPU on those writes.  The simulator drives the same core.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.member.at_most_once import BatchClaims, ClaimAnswer
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol import codec
from marshal_workers.runtime.channel import monotonic_ms
from marshal_workers.runtime.messages import ClaimBatch, ClaimVerdict, FromWorker, Outcomes
from marshal_workers.runtime.supervisor.assignments import Assignment, Table


class MessageClaims:
    """The supervisor's component that answers AMO workers' batch claims (component.py's interface), and the shell
    its member core drives."""

    def __init__(
        self,
        table: Table,
        coordinator: Coordinator,
        writes: InFlightWrites,
        settings: Settings,
        counters: Counters,
        log: Any,
    ) -> None:
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        self.counters = counters
        self.log = log
        self.core: BatchClaims[Assignment] = BatchClaims(self, settings.heartbeat_interval, log, counters)

    # --------------------------------------------------------- the component

    def waitables(self) -> list[object]:
        """The pipes of the workers running."""
        return [
            a.connection for a in self.table.assignments.values() if a.process is not None and a.connection is not None
        ]

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
        self.core.step()

    def begin_stop(self) -> None:
        """Nothing: workers that still ask are answered as before, until they exit."""

    def stopped(self) -> bool:
        return True  # a claim in flight is its worker's concern: the worker stops or exits either way

    # ------------------------------------------------------------- the pipe

    def _receive(self, assignment: Assignment, connection: Connection) -> None:
        """One message from a worker's pipe: a batch claim (ClaimBatch), or what became of failed calls (Outcomes)."""
        try:
            message: FromWorker = connection.recv()
            if isinstance(message, Outcomes):  # what became of failed calls
                if isinstance(message.counts, dict):
                    self.counters.add_outcomes(assignment.topic, message.counts)
                return
            if isinstance(message, ClaimBatch):
                self.core.ask(assignment, message.end, connection)
        except (EOFError, OSError):
            assignment.connection = None  # the worker is gone; reaping deals with it

    # ----------------------------------------------------- the core's shell

    def fields(self) -> dict[str, Any]:
        return self.coordinator.record_fields()

    def lease_clock_ms(self) -> int:
        return monotonic_ms()  # the workers' clock: a slot's lease is on it

    def submit(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None:
        self.writes.submit(what, records, on_verdicts, on_failure, within=within)

    def current(self, assignment: Assignment, worker: object) -> bool:
        return assignment.connection is worker

    def answer(self, assignment: Assignment, worker: object, answer: ClaimAnswer) -> None:
        if assignment.connection is not None:
            try:
                assignment.connection.send(ClaimVerdict(answer))
            except OSError:
                pass  # the worker is gone; reaping deals with it
