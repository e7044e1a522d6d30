"""The writes of one pass of the supervisor's loop leave together: one produce_batch per coordination partition.

InFlightWrites stages what is submitted between begin_pass() and end_pass(); Coordinator.send() produces the
staged writes with one produce_batch per coordination partition (in_flight.py, coordination_writer.py).  Here the producer
is a fake that records each produce_batch call and answers as librdkafka does (a full queue refuses the tail of a
batch; a fatal producer refuses all of it), and the log gives each delivered record a verdict naming where it was
written, so a test sees which verdicts reached which write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError

from marshal_workers.core.config import Settings
from marshal_workers.errors import CoordinationWriteError
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.protocol import codec

PARTITIONS = 4


@dataclass
class _Sent:
    """A record's delivery report, as librdkafka hands it to the callback."""

    _partition: int
    _offset: int

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (2, 1_000)  # LogAppendTime


@dataclass
class FakeProducer:
    """produce_batch() as librdkafka answers it; delivery reports only when the test calls deliver()."""

    room: int | None = None  # messages the local queue takes before it is full (until the next poll)
    fatal_partitions: set[int] = field(default_factory=set)  # partitions whose batches are refused (fatal state)
    calls: list[tuple[int, list[bytes]]] = field(default_factory=list)  # (partition, values queued) per call
    queued: list[tuple[int, Any]] = field(default_factory=list)  # (partition, callback) not yet reported
    ends: dict[int, int] = field(default_factory=dict)  # the next offset of each partition
    purged: bool = False

    def produce_batch(self, topic: str, messages: list[dict[str, Any]], partition: int = -1) -> int:
        accepted = []
        for message in messages:
            if partition in self.fatal_partitions:
                message["_error"] = KafkaError(KafkaError._FATAL)
            elif self.room is not None and len(accepted) >= self.room:
                message["_error"] = KafkaError(KafkaError._QUEUE_FULL)  # and every message after it, as librdkafka
            else:
                accepted.append(message)
        if self.room is not None:
            self.room -= len(accepted)
        self.calls.append((partition, [m["value"] for m in accepted]))
        self.queued += [(partition, m["callback"]) for m in accepted]
        return len(accepted)

    def poll(self, timeout: float = 0) -> int:
        self.room = None  # deliveries drained: the queue has room again
        return 0

    def deliver(self) -> None:
        for partition, callback in self.queued:
            offset = self.ends.get(partition, 0)
            self.ends[partition] = offset + 1
            callback(None, _Sent(partition, offset))
        self.queued = []

    def purge(self) -> None:
        self.purged = True

    def flush(self, timeout: float = 0) -> int:
        return 0


class _Log:
    """The coordination log's reader, reduced to what collect() asks: each record's verdict is where it was
    written, so a write's verdicts say which records were its own."""

    def fold_delivered(self, partition: int, offset: int, value: bytes, timestamp: tuple[int, int]) -> None:
        pass

    def take_verdict(self, partition: int, offset: int) -> tuple[int, int]:
        return (partition, offset)

    def notify_own_folds(self) -> None:
        pass


class OfflineCoordinator(Coordinator):
    """A Coordinator with fake producers (a new one for each replacement) and the log above; never started."""

    def __init__(self) -> None:
        # A fixed clock: a record carries the time it was made, and the tests compare records made apart.
        super().__init__(Settings(group="g", client_id="c", write_timeout=5.0), instance="i", clock=lambda: 1.7e9)
        self.partition_count = PARTITIONS
        self.producers = [FakeProducer()]
        self._producer = self.producers[0]  # type: ignore[assignment]
        self._log = _Log()  # type: ignore[assignment]

    def _new_producer(self) -> Any:
        self.producers.append(FakeProducer())
        return self.producers[-1]

    @property
    def producer(self) -> FakeProducer:
        return self.producers[-1]


def topic_on(partition: int, prefix: str = "t") -> str:
    """A topic whose records go to coordination partition ``partition``."""
    return next(
        f"{prefix}{n}" for n in range(1000) if codec.coordination_partition(f"{prefix}{n}", PARTITIONS) == partition
    )


@dataclass
class Outcome:
    """What became of one write: its verdicts, or its failure."""

    verdicts: list[Any] | None = None
    failure: CoordinationWriteError | None = None

    def on_verdicts(self, verdicts: list[Any]) -> None:
        self.verdicts = verdicts

    def on_failure(self, exc: CoordinationWriteError) -> None:
        self.failure = exc


@pytest.fixture
def coordinator() -> OfflineCoordinator:
    return OfflineCoordinator()


@pytest.fixture
def writes(coordinator: OfflineCoordinator) -> InFlightWrites:
    return InFlightWrites(coordinator)


def claims(coordinator: Coordinator, topic: str, *partitions: int) -> list[codec.Record]:
    return [coordinator.claim_record(topic, p) for p in partitions]


def submit(writes: InFlightWrites, records: list[codec.Record], **options: Any) -> Outcome:
    outcome = Outcome()
    writes.submit("claim", records, outcome.on_verdicts, outcome.on_failure, **options)
    return outcome


def values(records: list[codec.Record]) -> list[bytes]:
    return [codec.encode(record) for record in records]


def test_the_writes_of_a_pass_leave_at_its_end_one_produce_batch_per_partition_in_the_order_submitted(
    coordinator: OfflineCoordinator, writes: InFlightWrites
) -> None:
    first, second, third = (
        claims(coordinator, topic_on(0), 0, 1),
        claims(coordinator, topic_on(1), 0),
        claims(coordinator, topic_on(0, "u"), 5),
    )
    writes.begin_pass()
    for records in (first, second, third):
        submit(writes, records)
    assert coordinator.producer.calls == []  # staged: nothing produced during the pass
    assert writes.counts() == {"claim": 3}

    writes.end_pass()

    # Partition 0 carries the first write's records then the third's, as submitted; partition 1 the second's.
    assert coordinator.producer.calls == [(0, values(first + third)), (1, values(second))]


def test_each_write_gets_the_verdicts_of_its_own_records(
    coordinator: OfflineCoordinator, writes: InFlightWrites
) -> None:
    writes.begin_pass()
    first = submit(writes, claims(coordinator, topic_on(0), 0, 1))
    second = submit(writes, claims(coordinator, topic_on(1), 0))
    third = submit(writes, claims(coordinator, topic_on(0, "u"), 5))
    writes.collect()  # during the pass (WriteVerdicts' step): a staged write is not decided
    assert (first.verdicts, first.failure) == (None, None)
    writes.end_pass()
    coordinator.producer.deliver()

    writes.collect()

    assert first.verdicts == [(0, 0), (0, 1)]
    assert second.verdicts == [(1, 0)]
    assert third.verdicts == [(0, 2)]
    assert writes.counts() == {}


def test_a_write_outside_a_pass_goes_out_at_once(coordinator: OfflineCoordinator, writes: InFlightWrites) -> None:
    records = claims(coordinator, topic_on(2), 0, 1, 2)

    outcome = submit(writes, records)

    assert coordinator.producer.calls == [(2, values(records))]  # one produce_batch call for the whole write
    coordinator.producer.deliver()
    writes.collect()
    assert outcome.verdicts == [(2, 0), (2, 1), (2, 2)]


def test_a_multi_record_write_is_one_produce_batch_call_per_partition(coordinator: OfflineCoordinator) -> None:
    """Coordinator.write and write_everywhere: one call per coordination partition (confluent-kafka ignores a
    message's own partition in produce_batch, so a call cannot span partitions)."""
    releases = [codec.ReleasePartition(**coordinator.record_fields(), topic=topic_on(3), partition=p) for p in range(3)]
    coordinator.submit(releases)
    pause = codec.ReleaseGroup(**coordinator.record_fields(), expires=1)
    coordinator.submit([pause] * PARTITIONS, partitions=range(PARTITIONS))

    assert coordinator.producer.calls == [(3, values(releases))] + [(p, values([pause])) for p in range(PARTITIONS)]


def test_a_full_queue_sends_the_rest_of_the_batch_in_order_once_deliveries_drain(
    coordinator: OfflineCoordinator, writes: InFlightWrites
) -> None:
    coordinator.producer.room = 2
    first, second = claims(coordinator, topic_on(0), 0, 1), claims(coordinator, topic_on(0, "u"), 2, 3)
    writes.begin_pass()
    outcomes = [submit(writes, first), submit(writes, second)]

    writes.end_pass()

    assert coordinator.producer.calls == [(0, values(first)), (0, values(second))]  # the tail after a poll
    coordinator.producer.deliver()
    writes.collect()
    assert [o.verdicts for o in outcomes] == [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    assert len(coordinator.producers) == 1  # a full queue is no failure: the producer stays


def test_a_refused_batch_fails_only_the_writes_in_it(coordinator: OfflineCoordinator, writes: InFlightWrites) -> None:
    coordinator.producer.fatal_partitions = {1}
    writes.begin_pass()
    refused = submit(writes, claims(coordinator, topic_on(1), 0))
    passed = submit(writes, claims(coordinator, topic_on(2), 0))

    writes.end_pass()

    assert refused.failure is not None and "refused" in str(refused.failure)  # at once, at the end of the pass
    assert passed.failure is None
    assert len(coordinator.producers) == 2  # as a refused produce() always did: a new producer
    assert coordinator.producer.calls == [(2, values(claims(coordinator, topic_on(2), 0)))]
    coordinator.producer.deliver()
    writes.collect()
    assert passed.verdicts == [(2, 0)] and refused.verdicts is None


def test_a_refusal_fails_the_writes_its_producer_had_queued_as_purged_and_nothing_else(
    coordinator: OfflineCoordinator, writes: InFlightWrites
) -> None:
    """The writes queued by the producer a refusal replaces fail at collect(), as purged (as before batches); the
    refused write fails at once; the writes produced after it go through the new producer."""
    old = coordinator.producer
    old.fatal_partitions = {1}
    writes.begin_pass()
    queued = submit(writes, claims(coordinator, topic_on(0), 0))
    refused = submit(writes, claims(coordinator, topic_on(1), 0))
    later = submit(writes, claims(coordinator, topic_on(2), 0))

    writes.end_pass()

    assert old.purged and refused.failure is not None
    assert (queued.failure, later.failure) == (None, None)
    coordinator.producer.deliver()
    old.deliver()  # a purged record's late report changes nothing: it failed already
    writes.collect()
    assert queued.failure is not None and "coordination write failed" in str(queued.failure)
    assert later.verdicts == [(2, 0)]


def test_a_write_submitted_by_a_failure_callback_at_the_end_of_a_pass_goes_out_at_once(
    coordinator: OfflineCoordinator, writes: InFlightWrites
) -> None:
    coordinator.producer.fatal_partitions = {1}
    again = Outcome()
    retry = claims(coordinator, topic_on(2), 9)  # made once: a record carries the time it was made

    def write_again(exc: CoordinationWriteError) -> None:
        writes.submit("claim", retry, again.on_verdicts, again.on_failure)

    writes.begin_pass()
    writes.submit("claim", claims(coordinator, topic_on(1), 0), lambda verdicts: None, write_again)
    writes.end_pass()

    assert coordinator.producer.calls == [(2, values(retry))]
    coordinator.producer.deliver()
    writes.collect()
    assert again.verdicts == [(2, 0)]


def test_a_staged_write_keeps_its_deadline_from_its_submit(
    coordinator: OfflineCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("marshal_workers.kafka.coordination_writer.time.monotonic", lambda: clock[0])
    writes = InFlightWrites(coordinator, clock=lambda: clock[0])
    writes.begin_pass()
    outcome = submit(writes, claims(coordinator, topic_on(0), 0), within=1.0)
    clock[0] += 0.8  # a slow pass
    writes.end_pass()
    clock[0] += 0.3  # 1.1 s after the submit, 0.3 s after it was produced: past its deadline

    writes.collect()

    assert outcome.failure is not None and "not confirmed" in str(outcome.failure)
