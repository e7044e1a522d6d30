"""WorkerPool without a fork: what a worker's exit means (restart, back off, dead-letter a poison message, release,
forget), decided against fake processes the test makes exit, with the releases it asks for recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from supervisor_fakes import FakeProcess, FakeStarter, new_slot, settings

from marshal_workers.core.exit_codes import ExitCode, WorkerExit
from marshal_workers.handlers.app import App
from marshal_workers.observe.metrics import Counters
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.supervisor.assignments import Assignment, Table
from marshal_workers.runtime.supervisor.worker_pool import WorkerPool


@dataclass
class RecordedReleases:
    """The partition claims' side, as the pool sees it."""

    table: Table
    released: list[tuple[tuple[str, int], bool]] = field(default_factory=list)
    handed_over: list[tuple[str, int]] = field(default_factory=list)
    forgotten: list[tuple[str, int]] = field(default_factory=list)
    ours: bool = True

    def release(self, assignment: Assignment, sick: bool = False) -> None:
        self.released.append((assignment.key, sick))
        self.table.assignments.pop(assignment.key, None)

    def release_handed_over(self, assignment: Assignment) -> None:
        self.handed_over.append(assignment.key)
        self.table.assignments.pop(assignment.key, None)

    def forget(self, assignment: Assignment) -> None:
        self.forgotten.append(assignment.key)
        self.table.assignments.pop(assignment.key, None)

    def owns(self, assignment: Assignment) -> bool:
        return self.ours


class Pool:
    """A WorkerPool for one topic "t", its processes fake, its releases recorded."""

    def __init__(self, crash_limit: int = 3, **handler: Any) -> None:
        app = App(group="g")
        app.handler("t", **handler)(lambda msg: None)
        self.table = Table()
        self.releases = RecordedReleases(self.table)
        self.starter = FakeStarter()
        self.counters = Counters()
        self.failures: list[int] = []
        self.pool = WorkerPool(
            self.table,
            self.releases,
            app,
            "m:app",
            settings(crash_limit=crash_limit),
            {"t": (0.0, 0.0)},
            self.counters,
            logging.getLogger("test"),
            start_process=self.starter,
            fail=self.failures.append,
        )

    def claimed(self, partition: int = 0, offset: int = 0) -> Assignment:
        """A partition just claimed, queued for its worker, as PartitionClaims leaves it."""
        assignment = Assignment("t", partition, new_slot(offset), started_offset=offset)
        self.table.assignments[assignment.key] = assignment
        self.table.to_start.append(assignment)
        return assignment

    def worker(self, assignment: Assignment) -> FakeProcess:
        assert isinstance(assignment.process, FakeProcess)
        return assignment.process

    def exits(self, assignment: Assignment, code: int, at: float = 0.0) -> None:
        """Its worker exits with ``code``; a pass of the loop at ``at`` sees it."""
        process = self.worker(assignment)
        process.exitcode = code
        self.table.ready = {process.sentinel}
        self.pool.step(at)
        self.table.ready = set()


def test_a_claimed_partition_gets_a_worker_at_its_offset() -> None:
    pool = Pool()
    assignment = pool.claimed(offset=42)
    pool.pool.step(0.0)
    assert [p.spec.start_offset for p in pool.starter.started] == [42]
    assert pool.pool.waitables() == [pool.worker(assignment).sentinel]
    assert assignment.connection is not None and not pool.table.to_start


def test_a_worker_that_crashed_after_progress_restarts_after_a_backoff() -> None:
    pool = Pool()
    assignment = pool.claimed()
    pool.pool.step(0.0)
    assignment.slot.set(Field.NEXT_OFFSET, 10)  # it handled messages before it died
    pool.exits(assignment, -9)
    assert assignment.process is None and assignment.restart_at is not None and assignment.crashes_in_a_row == 1
    pool.pool.step(assignment.restart_at - 0.001)
    assert len(pool.starter.started) == 1, "not before its backoff"
    pool.pool.step(assignment.restart_at)
    assert len(pool.starter.started) == 2 and pool.starter.started[1].spec.start_offset == 10
    assert pool.counters.worker_restarts["crash"] == 1


def test_a_worker_that_keeps_crashing_without_progress_gets_its_partition_released_as_sick() -> None:
    pool = Pool(crash_limit=2, on_error="release")
    assignment = pool.claimed()
    pool.pool.step(0.0)
    pool.exits(assignment, 1)
    assert assignment.restart_at is not None
    pool.pool.step(assignment.restart_at)
    pool.exits(assignment, 1, at=assignment.restart_at)
    assert pool.releases.released == [(("t", 0), True)]


def test_a_message_a_worker_keeps_dying_on_is_dead_lettered_not_the_partition_released() -> None:
    pool = Pool(crash_limit=2)  # at least once, on_error="dlq": a poison message is given up on
    assignment = pool.claimed(offset=5)
    pool.pool.step(0.0)
    pool.exits(assignment, -9)
    pool.pool.step(assignment.restart_at or 0.0)
    pool.exits(assignment, -9, at=assignment.restart_at or 0.0)
    assert pool.releases.released == []
    assert (assignment.give_up_on, assignment.give_up_reason, assignment.restart_reason) == (
        (5, 6),
        "worker_lost",
        "poison",
    )
    pool.pool.step(assignment.restart_at or 0.0)
    assert pool.starter.started[-1].spec.give_up_on == (5, 6), "the next worker applies on_error to it, uncalled"


@pytest.mark.parametrize(
    ("code", "mark", "expected"),
    [
        (WorkerExit.RELEASE, None, "released sick"),
        (WorkerExit.STOPPED, "unhealthy", "released sick"),
        (WorkerExit.STOPPED, "handing_over", "handed over"),
        (-9, "lost", "forgotten"),
    ],
)
def test_what_an_exit_means(code: int, mark: str | None, expected: str) -> None:
    pool = Pool()
    assignment = pool.claimed()
    pool.pool.step(0.0)
    if mark is not None:
        setattr(assignment, mark, True)
    pool.exits(assignment, code)
    outcome = {
        "released sick": pool.releases.released == [(("t", 0), True)],
        "handed over": pool.releases.handed_over == [("t", 0)],
        "forgotten": pool.releases.forgotten == [("t", 0)],
    }
    assert [what for what, happened in outcome.items() if happened] == [expected]
    assert len(pool.starter.started) == 1, "no restart"


def test_a_worker_that_cannot_start_stops_the_supervisor() -> None:
    pool = Pool()
    assignment = pool.claimed()
    pool.pool.step(0.0)
    pool.exits(assignment, WorkerExit.BOOT_ERROR)
    assert pool.releases.released == [(("t", 0), False)]
    assert pool.failures == [ExitCode.WORKER_BOOT_ERROR]


def test_during_a_graceful_stop_a_worker_that_finished_gets_its_partition_released() -> None:
    # (Asking the workers to finish, and releasing the partitions without one, is the partition claims' begin_stop:
    # test_partition_claims.py.)
    pool = Pool()
    running = pool.claimed(0)
    pool.pool.step(0.0)
    pool.table.phase = pool.table.phase.STOPPING
    pool.pool.begin_stop()
    assert pool.releases.released == [] and not pool.pool.stopped()
    pool.exits(running, WorkerExit.STOPPED)
    assert pool.releases.released[-1] == (("t", 0), False) and pool.pool.stopped()
