"""A shared worker (runtime/worker/shared_worker.py) in the test's process: the test is its supervisor on a real
pipe, its partitions are messages in memory (worker_fakes.FakeConsumer), its range slot real shared memory.  What
it is told (RangeLeased, Renewed, Stop) and what it answers (Started, RangeProgress, Settled, Abandoned, Returned) are the
messages of runtime/messages.py; a test asserts which messages were handled and what the supervisor heard.

Deadlines are on the real monotonic clock: far ahead for a lease that holds, already past for one that does not;
no test waits for time to pass but one, whose handler waits past a deadline its lease began with (half a second).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from worker_fakes import TOPIC, DeadLetters, FakeConsumer, RecordingHandler, edges_for

from marshal_workers import App
from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.handlers.signals import Reject
from marshal_workers.runtime.channel import RangeSlot, monotonic_ms
from marshal_workers.runtime.messages import (
    Abandoned,
    Outcomes,
    RangeLeased,
    RangeProgress,
    Renewed,
    Returned,
    Settled,
    Started,
    Stop,
)
from marshal_workers.runtime.worker.shared_worker import SharedWorker, SharedWorkerSpec

HOUR_MS = 3_600_000


def holds() -> int:
    """A deadline the test never reaches."""
    return monotonic_ms() + HOUR_MS


def lapsed() -> int:
    """A deadline already past."""
    return monotonic_ms() - 1


class Run:
    """One shared worker of ``app``'s handler of TOPIC over partition 0 holding ``offsets``; the test's end of the
    pipe is ``supervisor``."""

    def __init__(self, app: App, offsets: Sequence[int], stop_when: Callable[[FakeConsumer], bool]) -> None:
        self.supervisor, theirs = multiprocessing.Pipe(duplex=True)
        self.stop_sent = False

        def on_fetch(consumer: FakeConsumer) -> None:
            if not self.stop_sent and stop_when(consumer):
                self.stop_sent = True
                self.supervisor.send(Stop())  # read by the worker right after this fetch

        self.consumer = FakeConsumer(TOPIC, {0: offsets}, on_fetch)
        self.dead = DeadLetters()
        self.slot = RangeSlot.create(multiprocessing.get_context("fork"))
        spec = SharedWorkerSpec("tests:app", TOPIC, 0, Settings(group="billing"))
        edges = edges_for(app, self.consumer, self.dead)
        self.worker = SharedWorker(spec, theirs, range_slot=self.slot.array, edges=edges)
        self._theirs = theirs

    def tell(self, *messages: Any) -> None:
        for message in messages:
            self.supervisor.send(message)

    def run(self) -> WorkerExit:
        return self.worker.run()

    def heard(self) -> list[Any]:
        """What the worker said, with busy_ms (a measured time) left out of Settled."""
        found = []
        while self.supervisor.poll(0):
            message = self.supervisor.recv()
            if isinstance(message, Settled):
                message = Settled(
                    message.partition,
                    message.start,
                    message.end,
                    message.failed,
                    message.dead,
                    message.handled,
                    message.high,
                )
            found.append(message)
        return found

    def close(self) -> None:
        self.supervisor.close()
        self._theirs.close()


def at_end(consumer: FakeConsumer) -> bool:
    """The consumer has read partition 0 to its end."""
    return consumer.at is not None and consumer.at[1] >= consumer.end(0)


def first_fetch(consumer: FakeConsumer) -> bool:
    return True


def app_for(handler: RecordingHandler, **options: Any) -> App:
    app = App("billing")
    options = {"retries": 1, "retry_backoff": 0.001, "retry_jitter": False, **options}
    app.handler(TOPIC, shared=True, **options)(handler.handle)
    return app


def start(to_close: list[Any], app: App, offsets: Sequence[int], stop_when: Callable[[FakeConsumer], bool]) -> Run:
    run = Run(app, offsets, stop_when)
    to_close.append(run)
    return run


def test_every_message_of_each_range_is_handled_once_and_the_range_reported_settled(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(20), at_end)
    run.tell(RangeLeased(0, 0, 10, holds(), 0), RangeLeased(0, 10, 20, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == list(range(20))
    assert run.heard() == [
        Started(0, 0),
        Settled(0, 0, 10, (), (), handled=10, high=20),
        Started(0, 10),
        Settled(0, 10, 20, (), (), handled=10, high=20),
    ]
    assert run.slot.read() == (0, 10, 20), "its position: a crash now would repeat nothing"
    assert run.consumer.closed and run.dead.offsets == []


def test_a_message_that_keeps_failing_is_told_at_once_and_left_to_be_delivered_again(to_close: list[Any]) -> None:
    handler = RecordingHandler(failing=[4])
    run = start(to_close, app_for(handler), range(20), at_end)
    run.tell(RangeLeased(0, 0, 10, holds(), 0), RangeLeased(0, 10, 20, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls.count(4) == 2, "retried once"
    assert handler.handled == [o for o in range(20) if o != 4]
    heard = run.heard()
    assert RangeProgress(0, 0, 5, failed=(4,), dead=()) in heard, "the supervisor knows before the position passes it"
    assert Settled(0, 0, 10, failed=(4,), dead=(), handled=9, high=20) in heard
    assert run.dead.offsets == []


def test_a_stop_cuts_the_retries_short_the_next_delivery_tries_again(to_close: list[Any]) -> None:
    handler = RecordingHandler(failing=[4])
    run = start(to_close, app_for(handler, retries=5), range(10), at_end)  # the stop comes with the range's one fetch
    run.tell(RangeLeased(0, 0, 10, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls.count(4) == 1
    assert run.heard()[-1] == Settled(0, 0, 10, failed=(4,), dead=(), handled=9, high=10)


def test_at_most_once_a_message_that_fails_is_dead_lettered_never_delivered_again(to_close: list[Any]) -> None:
    handler = RecordingHandler(failing=[4])
    run = start(to_close, app_for(handler, mode="amo"), range(10), at_end)
    run.tell(RangeLeased(0, 0, 10, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert run.dead.offsets == [4]
    assert run.heard()[-1] == Settled(0, 0, 10, failed=(), dead=(4,), handled=9, high=10)


def test_a_rejected_message_is_dead_lettered_without_a_retry(to_close: list[Any]) -> None:
    handler = RecordingHandler(failing=[2], error=lambda: Reject("malformed"))
    run = start(to_close, app_for(handler), range(5), at_end)
    run.tell(RangeLeased(0, 0, 5, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls.count(2) == 1 and run.dead.offsets == [2]
    heard = run.heard()
    assert heard[-1] == Settled(0, 0, 5, failed=(), dead=(2,), handled=4, high=5)
    outcomes = [m.counts for m in heard if isinstance(m, Outcomes)]
    assert [c["rejected"] for c in outcomes] == [1], "for the metrics, before the range is reported settled"


def test_a_range_delivered_max_deliveries_times_is_dead_lettered_without_a_call(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler, max_deliveries=3), range(5), at_end)
    run.tell(RangeLeased(0, 0, 5, holds(), tries=3))

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls == [] and run.dead.offsets == [0, 1, 2, 3, 4]
    assert run.heard()[-1] == Settled(0, 0, 5, failed=(), dead=(0, 1, 2, 3, 4), handled=0, high=5)


def test_a_range_whose_lease_ran_out_is_abandoned_untouched_and_the_next_is_handled(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(10), at_end)
    run.tell(RangeLeased(0, 0, 5, lapsed(), 0), RangeLeased(0, 5, 10, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.calls == [5, 6, 7, 8, 9], "nothing of the lapsed range: another worker may hold it now"
    assert run.heard() == [
        Started(0, 0),
        Abandoned(0, 0, 5),
        Started(0, 5),
        Settled(0, 5, 10, (), (), handled=5, high=10),
    ]


def test_a_renewal_that_comes_before_the_range_begins_keeps_it(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(5), at_end)
    run.tell(RangeLeased(0, 0, 5, lapsed(), 0), Renewed(0, 0, holds()))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == [0, 1, 2, 3, 4]
    assert run.heard()[-1] == Settled(0, 0, 5, (), (), handled=5, high=5)


class RenewedInHand(RecordingHandler):
    """Once the worker is up (its first message), tells it a lease on [1, 10) whose deadline is half a second away;
    at that range's first message, renews the lease (as its supervisor does, on the pipe) and waits past that
    deadline: the rest of the range's one fetch is handled past the deadline the range began with."""

    def __init__(self) -> None:
        super().__init__()
        self.run: Run | None = None
        self.deadline_ms = 0

    def handle(self, msg: Any) -> None:
        super().handle(msg)
        assert self.run is not None
        if msg.offset == 0:
            self.deadline_ms = monotonic_ms() + 500
            self.run.tell(RangeLeased(0, 1, 10, self.deadline_ms, 0))
        elif msg.offset == 1:
            self.run.tell(Renewed(0, 1, holds()))
            time.sleep((self.deadline_ms - monotonic_ms() + 20) / 1000)


@pytest.mark.parametrize("options", [{}, {"max_age": "3650d"}], ids=["plain messages", "with an age limit"])
def test_a_renewal_that_comes_while_a_fetch_is_handled_keeps_the_range(
    to_close: list[Any], options: dict[str, Any]
) -> None:
    """A fetch's messages are handled without a look at the pipe: a slow handler's fetch may outlast the deadline
    its range began with, while the supervisor renews the lease.  The worker reads the renewal before it gives the
    range up (it used to abandon it: the lease lapsed, and what was handled since the last progress record was
    handled again by the next holder)."""
    handler = RenewedInHand()
    run = start(to_close, app_for(handler, **options), range(10), at_end)
    handler.run = run
    run.tell(RangeLeased(0, 0, 1, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == list(range(10)), "the renewed range handled to its end"
    heard = run.heard()
    assert not any(isinstance(message, Abandoned) for message in heard), heard
    assert heard[-1] == Settled(0, 1, 10, (), (), handled=9, high=10)


def test_a_stop_finishes_the_range_in_hand_and_gives_back_the_ranges_not_begun(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(30), first_fetch)
    run.tell(RangeLeased(0, 0, 10, holds(), 0), RangeLeased(0, 10, 20, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == list(range(10))
    assert run.heard() == [Started(0, 0), Settled(0, 0, 10, (), (), handled=10, high=30), Returned(0, 10, 20)]


def test_at_the_partitions_end_a_range_is_settled_as_far_as_the_messages_go_and_the_next_given_back(
    to_close: list[Any],
) -> None:
    """Rather than wait for messages that may not come while another range waits."""
    handler = RecordingHandler()
    run = start(to_close, app_for(handler), range(15), at_end)
    run.tell(RangeLeased(0, 0, 100, holds(), 0), RangeLeased(0, 100, 200, holds(), 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == list(range(15))
    assert run.heard() == [Started(0, 0), Settled(0, 0, 15, (), (), handled=15, high=15), Returned(0, 100, 200)]


def test_a_range_after_offsets_without_a_message_is_read_from_its_start(to_close: list[Any]) -> None:
    """Transaction markers or compaction leave offsets without a message: a fetch of as many messages as the range
    has offsets left reads past its end.  The next range, which starts at that end, still gets its messages (it
    used to read on from where that fetch left the consumer, miss them, and wait until its lease ran out)."""
    handler = RecordingHandler()

    def read_again_or_stuck(consumer: FakeConsumer) -> bool:
        return consumer.fetched.count(12) == 2 or consumer.fetches > 100

    run = start(to_close, app_for(handler), [0, 1, 2, 7, 12], read_again_or_stuck)
    run.tell(RangeLeased(0, 0, 10, holds(), 0), RangeLeased(0, 10, 13, monotonic_ms() + 2000, 0))

    assert run.run() is WorkerExit.STOPPED

    assert handler.handled == [0, 1, 2, 7, 12]
    heard = run.heard()
    assert Settled(0, 0, 10, (), (), handled=4, high=13) in heard
    assert heard[-1] == Settled(0, 10, 13, (), (), handled=1, high=13)


def test_a_worker_whose_supervisor_is_gone_exits_and_closes_its_reader(to_close: list[Any]) -> None:
    run = start(to_close, app_for(RecordingHandler()), range(5), at_end)
    run.supervisor.close()

    assert run.run() is WorkerExit.SUPERVISOR_GONE
    assert run.consumer.closed


def test_a_worker_whose_app_cannot_start_exits_with_a_boot_error_before_reading(to_close: list[Any]) -> None:
    handler = RecordingHandler()
    app = app_for(handler)

    @app.on_worker_start
    def fail() -> None:
        raise RuntimeError("no database")

    run = start(to_close, app, range(5), at_end)
    run.tell(RangeLeased(0, 0, 5, holds(), 0))

    assert run.run() is WorkerExit.BOOT_ERROR
    assert run.consumer.fetched == [] and handler.calls == [] and run.heard() == []
