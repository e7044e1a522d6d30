"""A partition's worker (runtime/worker/worker.py: the shell that loads the app, opens the reader and picks the
loop) in the test's process: its slot is real shared memory, its pipe a real pipe, its partition messages in
memory (worker_fakes.FakeConsumer).  The loops themselves have their own tests (test_one_call_loop.py,
test_batch_loop.py, test_lane_runner.py); here, what the shell adds: the loop each handler gets, where it starts,
its hooks, and how it ends.

A stop comes as the supervisor's SIGTERM does (the link's request_stop), once the worker has read its partition
to the end, found nothing more, and (``done``) its handler was called for what it had to handle: a loop on lanes
reads ahead of its calls, and a stop begins no new call.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from worker_fakes import TOPIC, DeadLetters, FakeConsumer, RecordingHandler, edges_for

from marshal_workers import App
from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.runtime.channel import Field, Slot, WorkerSpec, monotonic_ms
from marshal_workers.runtime.worker.worker import Worker

PARTITION = 0


@dataclass
class Run:
    """One worker of ``app``'s handler of TOPIC on partition 0, holding ``offsets``, from ``start``."""

    app: App
    offsets: Sequence[int]
    start: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # the WorkerSpec's other fields
    settings: Settings = field(default_factory=lambda: Settings(group="billing"))
    done: Callable[[], bool] = lambda: True

    def __post_init__(self) -> None:
        self.supervisor, self.theirs = multiprocessing.Pipe(duplex=True)
        self.slot = Slot.create(multiprocessing.get_context("fork"), self.start)
        self.slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() + 3_600_000)  # the supervisor's claim holds
        self.consumer = FakeConsumer(TOPIC, {PARTITION: self.offsets}, self._stop_at_the_end)
        self.dead = DeadLetters()
        spec = WorkerSpec("tests:app", TOPIC, PARTITION, self.start, self.settings, **self.options)
        self.worker = Worker(spec, self.slot, self.theirs, edges=edges_for(self.app, self.consumer, self.dead))

    def _stop_at_the_end(self, consumer: FakeConsumer) -> None:
        """A fetch at the partition's end that found nothing: everything before was handed to the loop."""
        at_end = consumer.at is not None and consumer.at[1] >= consumer.end(PARTITION) and consumer.last_got == 0
        if at_end and self.done():
            self.worker.link.request_stop()

    def run(self) -> WorkerExit:
        return self.worker.run()

    @property
    def progress(self) -> int:
        """The next offset the worker reported (what the supervisor heartbeats and releases with)."""
        return self.slot.get(Field.NEXT_OFFSET)

    def close(self) -> None:
        self.supervisor.close()
        self.theirs.close()


def start(to_close: list[Any], app: App, offsets: Sequence[int], **options: Any) -> Run:
    run = Run(app, offsets, **options)
    to_close.append(run)
    return run


def app_for(handler: RecordingHandler, **options: Any) -> App:
    app = App("billing")
    function = handler.handle_batch if options.get("batch") else handler.handle
    app.handler(TOPIC, retries=0, **options)(function)
    return app


@pytest.mark.parametrize(
    "options", [{}, {"batch": True, "batch_size": 4}, {"concurrency": 3}], ids=["one call", "batches", "lanes"]
)
def test_each_loop_handles_every_message_from_the_start_offset_and_reports_it_done(
    to_close: list[Any], options: dict[str, Any]
) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler, **options), range(20), start=5, done=lambda: len(handler.calls) >= 15)

    assert run.run() is WorkerExit.STOPPED

    assert sorted(handler.handled) == list(range(5, 20)) and len(handler.handled) == 15
    assert run.progress == 20
    assert run.consumer.closed


def test_offsets_a_previous_owner_did_out_of_order_are_not_handled_again(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    skip = {"skip": ((8, 11), (15, 16))}
    run = start(to_close, app_for(handler), range(20), start=5, options=skip, done=lambda: len(handler.calls) >= 11)

    assert run.run() is WorkerExit.STOPPED

    assert sorted(handler.handled) == [5, 6, 7, 11, 12, 13, 14, 16, 17, 18, 19]
    assert run.progress == 20


def test_a_message_that_fails_is_dead_lettered_and_progress_goes_past_it(to_close: list[Any]) -> None:
    handler = RecordingHandler(failing=[3])
    run = start(to_close, app_for(handler), range(6))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == [0, 1, 2, 4, 5] and run.dead.offsets == [3] and run.progress == 6


def test_the_partition_hooks_run_once_each_around_the_messages_and_the_stop_hooks_last(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    app = app_for(handler)
    events: list[Any] = []
    app.on_worker_start(lambda: events.append("worker start"))
    app.on_partition_claimed(lambda topic, partition: events.append(("claimed", topic, partition, handler.calls[:])))
    app.on_partition_released(lambda topic, partition: events.append(("released", topic, partition, handler.calls[:])))
    app.on_worker_stop(lambda: events.append("worker stop"))
    run = start(to_close, app, range(3))

    assert run.run() is WorkerExit.STOPPED

    assert events == ["worker start", ("claimed", TOPIC, 0, []), ("released", TOPIC, 0, [0, 1, 2]), "worker stop"]


def test_a_stop_asked_before_the_worker_started_handles_nothing(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(5), start=2)
    run.slot.set(Field.STOP_REQUESTED, 1)  # asked while the fork server's child was still ignoring SIGTERM

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls == [] and run.progress == 2


def test_a_worker_that_reaches_its_message_limit_exits_for_a_fresh_one_where_it_stopped(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    settings = replace(Settings(group="billing"), max_messages_per_worker=4)
    run = start(to_close, app_for(handler), range(10), settings=settings)

    assert run.run() is WorkerExit.RECYCLE

    assert handler.handled == [0, 1, 2, 3] and run.progress == 4


def test_a_worker_whose_app_cannot_start_exits_with_a_boot_error_before_reading(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    app = app_for(handler)
    app.on_worker_start(lambda: 1 / 0)
    run = start(to_close, app, range(5))

    assert run.run() is WorkerExit.BOOT_ERROR

    assert run.consumer.fetches == 0 and handler.calls == [] and run.progress == 0


def test_a_worker_whose_supervisor_is_gone_exits_and_closes_its_reader(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(5))
    run.supervisor.close()

    assert run.run() is WorkerExit.SUPERVISOR_GONE

    assert run.consumer.closed
