"""InFlightWrites (kafka/in_flight.py) on a fake clock, over a coordinator whose writes the test decides: each
write's callbacks run once, when it is decided, failed or overdue, and never block the loop meanwhile.

How the writes of a pass are batched into produce calls is test_coordination_batches.py's, against the real
Coordinator; here the coordinator is reduced to its three calls (prepare, send, collect) so that the test, not
Kafka, says when a write is confirmed or fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.kafka.coordination_writer import PendingWrite
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.protocol import codec

WRITE_TIMEOUT_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class DecidedCoordinator:
    """Coordinator's prepare / send / collect: a write is confirmed or fails when the test says, and fails as
    the real one does once the write timeout has passed."""

    clock: FakeClock
    produced: list[list[codec.Record]] = field(default_factory=list)  # every send(), the records of its writes
    refuse: bool = False  # the producer refuses what it is given
    _records: dict[int, list[codec.Record]] = field(default_factory=dict)
    _verdicts: dict[int, list[bool]] = field(default_factory=dict)
    _failures: dict[int, CoordinationWriteError] = field(default_factory=dict)

    def prepare(self, records: Sequence[codec.Record], partitions: Sequence[int] | None = None) -> PendingWrite:
        pending = PendingWrite(deadline=self.clock() + WRITE_TIMEOUT_S, submitted_at=self.clock())
        self._records[id(pending)] = list(records)
        return pending

    def send(self, writes: Sequence[PendingWrite]) -> list[CoordinationWriteError | None]:
        self.produced.append([r for pending in writes for r in self._records[id(pending)]])
        return [CoordinationWriteError("refused") if self.refuse else None for _ in writes]

    def collect(self, pending: PendingWrite) -> list[bool] | None:
        if id(pending) in self._failures:
            raise self._failures[id(pending)]
        if id(pending) in self._verdicts:
            return self._verdicts[id(pending)]
        if self.clock() > pending.deadline:
            raise CoordinationWriteError("not confirmed within the write timeout")
        return None

    def confirm(self, record: codec.Record, verdict: bool = True) -> None:
        """The write that carries ``record`` is delivered and folded: one verdict per record."""
        key = self._key_of(record)
        self._verdicts[key] = [verdict] * len(self._records[key])

    def fail(self, record: codec.Record) -> None:
        """The write that carries ``record`` was not delivered."""
        self._failures[self._key_of(record)] = CoordinationWriteError("delivery failed")

    def _key_of(self, record: codec.Record) -> int:
        return next(key for key, records in self._records.items() if record in records)


@dataclass
class Outcome:
    """What became of one write: every verdict and every failure its callbacks were given."""

    verdicts: list[list[bool]] = field(default_factory=list)
    failures: list[CoordinationWriteError] = field(default_factory=list)

    def on_verdicts(self, verdicts: list[bool]) -> None:
        self.verdicts.append(verdicts)

    def on_failure(self, exc: CoordinationWriteError) -> None:
        self.failures.append(exc)


def claim(partition: int) -> codec.Claim:
    return codec.Claim(v=codec.VERSION, ts=1, group="g", client="c", instance="i", topic="t", partition=partition)


def setup() -> tuple[FakeClock, DecidedCoordinator, InFlightWrites]:
    clock = FakeClock()
    coordinator = DecidedCoordinator(clock)
    return clock, coordinator, InFlightWrites(coordinator, clock=clock)  # type: ignore[arg-type]


def submit(writes: InFlightWrites, *records: codec.Record, what: str = "claim", **options: Any) -> Outcome:
    outcome = Outcome()
    writes.submit(what, list(records), outcome.on_verdicts, outcome.on_failure, **options)
    return outcome


def test_each_write_hears_its_verdicts_once_when_decided_and_an_undecided_one_waits() -> None:
    clock, coordinator, writes = setup()
    first, second = submit(writes, claim(0), claim(1)), submit(writes, claim(2))
    assert coordinator.produced == [[claim(0), claim(1)], [claim(2)]], "outside a pass: each produced at once"
    coordinator.confirm(claim(2), verdict=False)
    clock.now += 0.2

    writes.collect()

    assert (first.verdicts, second.verdicts) == ([], [[False]]), "decided out of order: only the second is told"
    assert writes.counts() == {"claim": 1} and writes.last_confirmed == clock.now
    coordinator.confirm(claim(0))
    writes.collect()
    writes.collect()
    assert first.verdicts == [[True, True]] and second.verdicts == [[False]], "each told once"
    assert writes.counts() == {}


def test_a_write_that_fails_runs_its_failure_callback_once_and_counts_for_health() -> None:
    clock, coordinator, writes = setup()
    lost = submit(writes, claim(0))
    coordinator.fail(claim(0))
    clock.now += 1.0

    writes.collect()
    writes.collect()

    assert len(lost.failures) == 1 and "delivery failed" in str(lost.failures[0]) and lost.verdicts == []
    assert (writes.last_failed, writes.last_confirmed) == (clock.now, 0.0)
    assert writes.counts() == {}


def test_a_write_not_confirmed_within_its_limit_fails_then_and_its_late_verdict_is_ignored() -> None:
    clock, coordinator, writes = setup()
    hurried = submit(writes, claim(0), within=1.0)
    patient = submit(writes, claim(1))
    clock.now += 0.9
    writes.collect()
    assert hurried.failures == [], "still within its second"

    clock.now += 0.6
    writes.collect()

    assert len(hurried.failures) == 1 and "not confirmed within 1.5s" in str(hurried.failures[0])
    assert patient.failures == [], "the write timeout (5 s) still holds for a write without a limit of its own"
    coordinator.confirm(claim(0))
    coordinator.confirm(claim(1))
    writes.collect()
    assert hurried.verdicts == [] and patient.verdicts == [[True]]


def test_a_write_past_the_write_timeout_fails_even_without_a_limit_of_its_own() -> None:
    clock, _coordinator, writes = setup()
    outcome = submit(writes, claim(0))
    clock.now += WRITE_TIMEOUT_S + 0.1

    writes.collect()

    assert len(outcome.failures) == 1 and writes.last_failed == clock.now


def test_a_refused_write_fails_at_once_and_is_not_collected() -> None:
    _clock, coordinator, writes = setup()
    coordinator.refuse = True
    outcome = submit(writes, claim(0))
    assert len(outcome.failures) == 1 and writes.counts() == {}
    writes.collect()
    assert len(outcome.failures) == 1 and outcome.verdicts == []


def test_the_state_dump_counts_writes_in_flight_by_kind_staged_ones_included() -> None:
    _clock, _coordinator, writes = setup()
    submit(writes, claim(0))
    writes.begin_pass()
    submit(writes, claim(1), what="heartbeat")
    submit(writes, claim(2), what="heartbeat")
    assert writes.counts() == {"claim": 1, "heartbeat": 2}


def test_a_write_submitted_from_a_verdict_goes_out_at_once_and_is_decided_in_a_later_collect() -> None:
    """A renewal chain: each verdict submits the next write, which is produced at once and heard of later."""
    _clock, coordinator, writes = setup()
    follow_up = Outcome()

    def write_next(verdicts: list[bool]) -> None:
        writes.submit("renewal", [claim(1)], follow_up.on_verdicts, follow_up.on_failure)

    writes.submit("claim", [claim(0)], write_next, lambda exc: None)
    coordinator.confirm(claim(0))
    writes.collect()
    assert coordinator.produced[-1] == [claim(1)] and writes.counts() == {"renewal": 1}
    coordinator.confirm(claim(1))
    writes.collect()
    assert follow_up.verdicts == [[True]]
