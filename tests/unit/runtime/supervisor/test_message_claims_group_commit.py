"""The supervisor's AMO claims: one message-claim write in flight, the claims asked meanwhile go together next.

MessageClaims runs here over real pipes and slots, with the coordination writes recorded instead of
produced (what a write does with Kafka is tested in tests/integration and tests/e2e); the verdicts are
given by the test, as InFlightWrites.collect() would.
"""

from __future__ import annotations

import logging
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

import pytest
from supervisor_fakes import RecordedWrites, new_slot, settings

from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.observe.metrics import Counters
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.messages import ClaimBatch
from marshal_workers.runtime.supervisor.assignments import Assignment, Table
from marshal_workers.runtime.supervisor.message_claims import MessageClaims


class Claims:
    """A MessageClaims component with a table of workers' pipes, and its writes recorded."""

    def __init__(self) -> None:
        self.table = Table()
        self.counters = Counters()
        self.writes = RecordedWrites()
        coordinator = Coordinator(settings(), instance="i")  # not started: it only builds the records
        self.component = MessageClaims(
            self.table,
            coordinator,
            self.writes,
            settings(),
            self.counters,  # type: ignore[arg-type]
            logging.getLogger("test"),
        )

    @property
    def assignments(self) -> dict[Any, Assignment]:
        return self.table.assignments

    @property
    def recorded(self) -> RecordedWrites:
        return self.writes

    def worker(self, partition: int) -> Connection:
        """A partition of ours with a worker: the worker's end of its pipe."""
        ours, theirs = multiprocessing.Pipe(duplex=True)
        assignment = Assignment("t", partition, new_slot(0), connection=ours)
        self.assignments[assignment.key] = assignment
        return theirs

    def pass_of_the_loop(self) -> None:
        """What the loop's wait would find readable, then the claim step."""
        self.table.ready = {a.connection for a in self.assignments.values() if a.connection and a.connection.poll(0)}
        self.component.step(0.0)


def answer(worker: Connection) -> ClaimAnswer | None:
    """The supervisor's answer to a worker's claim, if it came within a second."""
    return worker.recv().answer if worker.poll(1) else None


def one_in_flight_one_held(claims: Claims) -> tuple[Connection, Connection]:
    """Partition 0's worker claims up to 500 (written, in flight), then partition 1's up to 700 (held)."""
    first, second = claims.worker(0), claims.worker(1)
    first.send(ClaimBatch(500))
    claims.pass_of_the_loop()
    second.send(ClaimBatch(700))
    claims.pass_of_the_loop()
    return first, second


@pytest.fixture
def claims() -> Claims:
    return Claims()


def test_claims_asked_while_a_write_is_in_flight_go_together_in_the_next_write(claims: Claims) -> None:
    first, second, third = claims.worker(0), claims.worker(1), claims.worker(2)
    first.send(ClaimBatch(500))
    claims.pass_of_the_loop()
    assert [w.claims for w in claims.recorded.writes] == [[("t", 0, 500)]]
    second.send(ClaimBatch(700))
    claims.pass_of_the_loop()
    third.send(ClaimBatch(900))
    claims.pass_of_the_loop()
    assert len(claims.recorded.writes) == 1, "held while the first write is in flight"
    assert not second.poll(0.05) and not third.poll(0), "no answer before their claims are written"

    claims.recorded.writes[0].on_verdicts([True])
    assert answer(first) is ClaimAnswer.CLAIMED
    assert claims.assignments[("t", 0)].claimed_end == 500
    assert claims.assignments[("t", 0)].slot.get(Field.LEASE_UNTIL_MS) > 0, "an accepted claim extends the lease"
    assert [w.claims for w in claims.recorded.writes[1:]] == [[("t", 1, 700), ("t", 2, 900)]], "one write for both"

    claims.recorded.writes[1].on_verdicts([True])
    assert (answer(second), answer(third)) == (ClaimAnswer.CLAIMED, ClaimAnswer.CLAIMED)


def test_a_write_that_fails_answers_unconfirmed_and_the_held_claims_are_written_after_it(claims: Claims) -> None:
    first, _second = one_in_flight_one_held(claims)
    claims.recorded.writes[0].on_failure(TimeoutError("not confirmed in time"))
    assert answer(first) is ClaimAnswer.UNCONFIRMED
    assert claims.counters.message_claims_unconfirmed == 1
    assert [w.claims for w in claims.recorded.writes[1:]] == [[("t", 1, 700)]]


def test_a_held_claim_of_a_worker_since_replaced_is_not_written(claims: Claims) -> None:
    _first, _second = one_in_flight_one_held(claims)
    replacement, _ = multiprocessing.Pipe(duplex=True)
    claims.assignments[("t", 1)].connection = replacement  # that worker died and another was started
    claims.recorded.writes[0].on_verdicts([True])
    assert len(claims.recorded.writes) == 1, "the dead worker's claim is not written: its successor asks anew"


def test_a_held_claim_of_a_partition_lost_meanwhile_is_refused_without_a_write(claims: Claims) -> None:
    _first, second = one_in_flight_one_held(claims)
    claims.assignments[("t", 1)].lost = True
    claims.recorded.writes[0].on_verdicts([True])
    assert answer(second) is ClaimAnswer.REFUSED
    assert len(claims.recorded.writes) == 1


def test_a_refused_claim_is_answered_refused_and_does_not_move_the_claimed_end(claims: Claims) -> None:
    first = claims.worker(0)
    first.send(ClaimBatch(500))
    claims.pass_of_the_loop()
    claims.recorded.writes[0].on_verdicts([False])
    assert answer(first) is ClaimAnswer.REFUSED
    assert claims.assignments[("t", 0)].claimed_end == -1
