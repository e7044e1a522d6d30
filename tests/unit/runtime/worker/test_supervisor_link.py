"""The real SupervisorLink (runtime/worker/link.py) on a real slot and a real pipe, in one process: no broker, no
fork.  The supervisor's end is this test: it writes the lease and the stop flag into the slot and answers claims."""

from __future__ import annotations

import logging
import multiprocessing
import time
from multiprocessing.connection import Connection

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import Message as KafkaMessage

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import partition_log
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.runtime.channel import Field, Slot, WorkerSpec, monotonic_ms
from marshal_workers.runtime.messages import ClaimBatch, ClaimVerdict, Outcomes
from marshal_workers.runtime.worker.link import SupervisorGone, SupervisorLink


def a_link(**settings: object) -> tuple[SupervisorLink, Connection]:
    spec = WorkerSpec("app:app", "orders", 3, 10, Settings(group="billing", **settings))  # type: ignore[arg-type]
    slot = Slot.create(multiprocessing.get_context("fork"), spec.start_offset)
    supervisor_end, worker_end = multiprocessing.Pipe(duplex=True)
    log = partition_log(logging.getLogger("tests.link"), "billing", "orders", 3)
    return SupervisorLink(spec, slot, worker_end, log, Outbox(spec.settings)), supervisor_end


def test_the_lease_is_what_the_supervisor_last_wrote_in_the_slot() -> None:
    link, _supervisor = a_link()
    now = time.monotonic()
    assert not link.lease_valid(now)
    link.slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() + 60_000)
    assert link.lease_valid(now) and link.lease_holds() and link.wait_for_lease()
    link.slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() - 1)  # taken back
    assert not link.lease_valid(now + 61)
    link.stopping = True
    assert not link.wait_for_lease(), "a lapsed lease is waited for until a stop"


def test_an_amo_claim_is_asked_again_until_claimed_and_a_refusal_ends_the_worker_as_lost() -> None:
    link, supervisor = a_link()
    link.slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() + 60_000)
    supervisor.send(ClaimVerdict(ClaimAnswer.UNCONFIRMED))
    supervisor.send(ClaimVerdict(ClaimAnswer.CLAIMED))
    assert link.claim_batch(500) is None
    assert [supervisor.recv(), supervisor.recv()] == [ClaimBatch(500)] * 2, "the same end, asked twice"
    supervisor.send(ClaimVerdict(ClaimAnswer.REFUSED))
    assert link.claim_batch(900) is WorkerExit.LOST


def test_a_closed_pipe_means_the_supervisor_is_gone() -> None:
    link, supervisor = a_link()
    supervisor.close()
    with pytest.raises(SupervisorGone):
        link.check_supervisor()
    with pytest.raises(SupervisorGone):
        link.ask_to_claim(10)


def test_the_stop_flag_and_max_messages_per_worker_stop_the_worker() -> None:
    link, _supervisor = a_link(max_messages_per_worker=5)
    assert link.fetch_size(500) == 5, "a batch never runs past the limit"
    link.count_handled(3)
    assert not link.stopping and link.fetch_size(500) == 2
    link.count_handled(2)
    assert link.stopping and link.recycle_reason == "handled 5 messages (max_messages_per_worker)"
    other, _ = a_link()
    other.slot.set(Field.STOP_REQUESTED, 1)
    other.check_stop_flag()
    assert other.stopping


def test_outcomes_go_to_the_supervisor_only_when_there_are_some() -> None:
    link, supervisor = a_link()
    link.send_outcomes()
    assert not supervisor.poll(0)
    link.outcomes.retries += 2
    link.send_outcomes()
    message = supervisor.recv()
    assert isinstance(message, Outcomes) and message.counts["retries"] == 2


class _Reader:
    """A consumer whose fetches return ``batch`` once: poll the first record, consume the rest."""

    def __init__(self, batch: list[KafkaMessage]) -> None:
        self.batch = batch

    def poll(self, _timeout: float) -> KafkaMessage | None:
        return self.batch.pop(0) if self.batch else None

    def consume(self, most: int, _timeout: float) -> list[KafkaMessage]:
        taken, self.batch = self.batch[:most], self.batch[most:]
        return taken

    def fetched_end(self, _topic: str, _partition: int) -> int:
        return 12


def test_a_fetch_with_an_error_among_its_messages_returns_the_messages() -> None:
    # A fetch error in a batch (here the partition's end) is left out; it must not stop the worker: comparing a
    # KafkaError with None (list.count(None)) raises.
    link, _supervisor = a_link()
    end = KafkaError(KafkaError._PARTITION_EOF)
    link.consumer = _Reader(
        [
            KafkaMessage(topic="orders", partition=3, offset=10, value=b"a"),  # type: ignore[assignment]
            KafkaMessage(topic="orders", partition=3, offset=11, value=b"b"),
            KafkaMessage(topic="orders", partition=3, offset=12, error=end),
        ]
    )

    fetched = link.fetch(10, 0)

    assert [record.offset() for record in fetched] == [10, 11]
