"""The one-call loop (at least once, one message per call: runtime/worker/one_call_loop.py) against a fake link and a
fake clock, in one process: no broker, no fork.  What a user relies on: progress (what the heartbeat carries) never
passes a message that is not done, a stop reports done exactly what was handled, and nothing is begun on a lapsed
lease."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples
from worker_fakes import TOPIC, DeadLetters, FakeAlarm, FakeClock, FakeLink, admission_on, failures_on, records

from marshal_workers import App, Message
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.runtime.worker.instrumentation import LatencySampling
from marshal_workers.runtime.worker.one_call_loop import OneCallLoop

RETRIES = 2
CALL_S = 0.001  # each call takes a millisecond of the fake clock


class Script:
    """A handler that fails each offset a given number of times, and may ask for a stop during one call."""

    def __init__(self, clock: FakeClock, fails: dict[int, int], stop_in: int | None = None) -> None:
        self.clock, self.fails, self.stop_in = clock, fails, stop_in
        self.link: FakeLink | None = None
        self.tries: dict[int, int] = {}
        self.calls: list[tuple[float, int]] = []  # (when it began, offset)
        self.handled: set[int] = set()

    def handle(self, msg: Message) -> None:
        offset = msg.offset
        self.calls.append((self.clock(), offset))
        self.clock.advance(CALL_S)
        if offset == self.stop_in and self.link is not None:
            self.link.request_stop()  # SIGTERM during the call
        self.tries[offset] = self.tries.get(offset, 0) + 1
        if self.tries[offset] <= self.fails.get(offset, 0):
            raise ValueError(f"try {self.tries[offset]} of {offset} failed")
        self.handled.add(offset)


def run_loop(
    link: FakeLink, script: Script, clock: FakeClock
) -> tuple[WorkerExit, DeadLetters, list[tuple[int, set[int]]]]:
    """Run the loop as worker.py builds it; every progress store with what was done (handled or dead-lettered)
    at that moment."""
    app = App("billing")
    app.handler(TOPIC, retries=RETRIES, retry_backoff=0.01, retry_jitter=False)(script.handle)
    dead = DeadLetters()
    stores: list[tuple[int, set[int]]] = []
    link.fields.on_progress = lambda offset: stores.append((offset, script.handled | set(dead.offsets)))
    script.link = link
    failures = failures_on(link, dead)
    loop = OneCallLoop(
        link, failures, admission_on(link, failures), LatencySampling(app.handler_in_worker(TOPIC)), FakeAlarm(clock)
    )
    return loop.run(), dead, stores


offsets_strategy = st.lists(st.integers(1, 3), min_size=1, max_size=40).map(
    lambda gaps: [sum(gaps[: i + 1]) for i in range(len(gaps))]  # increasing, with gaps (compaction)
)


@settings(max_examples=examples(150), deadline=None)
@given(offsets=offsets_strategy, data=st.data())
def test_progress_never_passes_a_message_not_done_and_a_stop_reports_exactly_what_was_handled(
    offsets: list[int], data: Any
) -> None:
    fails = data.draw(st.dictionaries(st.sampled_from(offsets), st.integers(0, RETRIES + 1)), label="fails")
    stop_in = data.draw(st.none() | st.sampled_from(offsets), label="stop_in")
    clock = FakeClock()
    link = FakeLink(
        clock, [(0.0, r) for r in records(offsets)], start_offset=1, stop_when=lambda link: link.handled >= len(offsets)
    )
    script = Script(clock, fails, stop_in)

    code, dead, stores = run_loop(link, script, clock)

    assert code is WorkerExit.STOPPED
    for progress, done in stores:
        assert all(o in done for o in offsets if o < progress), (progress, sorted(done))
    done = script.handled | set(dead.offsets)
    assert done == {o for o in offsets if o < link.next_offset}, "reported done is exactly what was done"
    assert set(dead.offsets) == {o for o, n in fails.items() if n > RETRIES and o in done}
    if stop_in is None:
        assert done == set(offsets) and link.next_offset == offsets[-1] + 1
    else:
        assert max(o for _, o in script.calls) == stop_in, "nothing is begun after a stop"


@settings(max_examples=examples(150), deadline=None)
@given(
    offsets=offsets_strategy,
    lease_calls=st.integers(0, 45),
    late=st.integers(0, 40),
    late_by=st.floats(0.0, 0.3),
)
def test_nothing_is_begun_on_a_lapsed_lease(offsets: list[int], lease_calls: int, late: int, late_by: float) -> None:
    """The lease ends after ``lease_calls`` calls' time; the records from index ``late`` on arrive ``late_by``
    seconds later (a fetch waits for them, and the lease may end meanwhile)."""
    clock = FakeClock()
    start = clock()
    arrivals = [(start if i < late else start + late_by, r) for i, r in enumerate(records(offsets))]
    lease_end = start + lease_calls * CALL_S + CALL_S / 2
    link = FakeLink(
        clock,
        arrivals,
        start_offset=1,
        lease_end=lease_end,
        stop_when=lambda link: link.handled >= len(offsets) or link.lapsed_waits > 0,
    )
    script = Script(clock, {})

    code, _dead, stores = run_loop(link, script, clock)

    assert code is WorkerExit.STOPPED
    assert all(began < lease_end for began, _ in script.calls), "no call begins once the lease has ended"
    assert all(progress <= max(script.handled, default=0) + 1 for progress, _ in stores), "progress only for calls"
    if len(script.calls) < len(offsets):
        assert link.lapsed_waits, "the rest waits for the lease"


@settings(max_examples=examples(150), deadline=None)
@given(offsets=offsets_strategy, lease_calls=st.integers(0, 20), data=st.data())
def test_no_retry_begins_on_a_lapsed_lease(offsets: list[int], lease_calls: int, data: Any) -> None:
    """Failed messages are retried after a backoff (10 ms of the fake clock): a retry whose backoff ends past the
    lease's end waits for the lease like any call (the supervisor, frozen meanwhile, may have lost the partition)."""
    fails = data.draw(st.dictionaries(st.sampled_from(offsets), st.integers(1, RETRIES + 1)), label="fails")
    clock = FakeClock()
    lease_end = clock() + lease_calls * CALL_S + CALL_S / 2
    link = FakeLink(
        clock,
        [(clock(), r) for r in records(offsets)],
        start_offset=1,
        lease_end=lease_end,
        stop_when=lambda link: link.handled >= len(offsets) or link.lapsed_waits > 0,
    )
    script = Script(clock, fails)

    code, dead, _stores = run_loop(link, script, clock)

    assert code is WorkerExit.STOPPED
    assert all(began < lease_end for began, _ in script.calls), "no call, first or retry, begins past the lease"
    done = script.handled | set(dead.offsets)
    assert done == {o for o in offsets if o < link.next_offset}, "reported done is exactly what was done"


def test_a_message_that_keeps_failing_is_dead_lettered_and_progress_moves_past_it() -> None:
    clock = FakeClock()
    link = FakeLink(
        clock, [(0.0, r) for r in records([5, 6, 7])], start_offset=5, stop_when=lambda link: link.handled >= 3
    )
    script = Script(clock, {6: RETRIES + 1})

    code, dead, _ = run_loop(link, script, clock)

    assert code is WorkerExit.STOPPED
    assert dead.offsets == [6] and script.handled == {5, 7} and link.next_offset == 8
    assert [o for _, o in script.calls] == [5, 6, 6, 6, 7], "the first call and its retries, then the next message"
