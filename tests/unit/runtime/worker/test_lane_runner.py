"""The lanes loop (concurrency: runtime/worker/lane_runner.py) against a fake link and a fake clock, in one process:
the real executor's threads, no broker, no fork.  Calls finish in random orders and fail at random; what the
heartbeat carries (progress and the done set above it) never covers a message that is not done, a stop reports
done exactly what was done, and nothing is begun on a lapsed lease."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples
from worker_fakes import TOPIC, DeadLetters, FakeClock, FakeLink, failures_on, records

from marshal_workers import App, Message
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.protocol import done_set
from marshal_workers.runtime.worker.lane_runner import LaneRunner

RETRIES = 2


class Script:
    """A handler that takes a random (real) while, so calls finish out of order, and fails each offset a given
    number of times."""

    def __init__(self, clock: FakeClock, fails: dict[int, int], seed: int) -> None:
        self.clock, self.fails = clock, fails
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.tries: dict[int, int] = {}
        self.calls: list[tuple[float, int]] = []  # (when it began, offset)
        self.handled: set[int] = set()

    def handle(self, msg: Message) -> None:
        offset = msg.offset
        with self.lock:
            self.calls.append((self.clock(), offset))
            self.tries[offset] = self.tries.get(offset, 0) + 1
            failing = self.tries[offset] <= self.fails.get(offset, 0)
            pause = self.random.random() * 0.002
        time.sleep(pause)
        if failing:
            raise ValueError(f"try {self.tries[offset]} of {offset} failed")
        self.handled.add(offset)


def run_lanes(
    link: FakeLink, script: Script, clock: FakeClock, concurrency: int, ordering: str = "key"
) -> tuple[WorkerExit, DeadLetters, list[tuple[int, set[int]]]]:
    """Run the lanes as worker.py builds them; every progress store and every published done set, each with what
    was done (handled or dead-lettered) at that moment."""
    app = App("billing")
    app.handler(
        TOPIC, retries=RETRIES, retry_backoff=0.01, retry_jitter=False, concurrency=concurrency, ordering=ordering
    )(script.handle)
    dead = DeadLetters()
    reports: list[tuple[int, set[int]]] = []  # (an offset reported done, what was done then)

    def on_progress(offset: int) -> None:
        reports.append((offset - 1, script.handled | set(dead.offsets)))  # everything below it

    def on_publish(progress: int, runs: list[int]) -> None:
        done_then = script.handled | set(dead.offsets)
        on_progress(progress)
        reports.extend((o, done_then) for start, stop in done_set.decode(progress, runs) for o in range(start, stop))
        published(progress, runs)

    published = link.publish_done
    link.fields.on_progress = on_progress
    link.publish_done = on_publish  # type: ignore[method-assign]
    runner = LaneRunner(link, failures_on(link, dead), app.handler_in_worker(TOPIC), clock=clock)  # type: ignore[arg-type]
    return runner.run(), dead, reports


def keys_for(offsets: list[int], data: Any) -> list[bytes | None]:
    return data.draw(
        st.lists(st.sampled_from([b"a", b"b", b"c", None]), min_size=len(offsets), max_size=len(offsets)), label="keys"
    )


offsets_strategy = st.lists(st.integers(1, 3), min_size=1, max_size=30).map(
    lambda gaps: [sum(gaps[: i + 1]) for i in range(len(gaps))]  # increasing, with gaps (compaction)
)


@settings(max_examples=examples(60), deadline=None)
@given(
    offsets=offsets_strategy,
    concurrency=st.integers(2, 4),
    ordering=st.sampled_from(["key", "none"]),  # "partition" is one at a time: the one-call loop
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_progress_and_the_done_set_never_cover_a_message_not_done_and_a_stop_reports_exactly_what_was_done(
    offsets: list[int], concurrency: int, ordering: str, seed: int, data: Any
) -> None:
    fails = data.draw(st.dictionaries(st.sampled_from(offsets), st.integers(0, RETRIES + 1)), label="fails")
    stop_after = data.draw(st.none() | st.integers(0, len(offsets)), label="stop_after")
    clock = FakeClock()
    arrivals = [(clock(), r) for r in records(offsets, keys_for(offsets, data))]
    enough = len(offsets) if stop_after is None else stop_after
    link = FakeLink(clock, arrivals, start_offset=1, stop_when=lambda link: link.handled >= enough)
    script = Script(clock, fails, seed)

    code, dead, reports = run_lanes(link, script, clock, concurrency, ordering)

    assert code is WorkerExit.STOPPED
    for offset, done in reports:
        assert offset not in offsets or offset in done, f"offset {offset} reported done before it was"
    done = script.handled | set(dead.offsets)
    assert {o for o in link.reported_done() if o in offsets} == done, "the last position says exactly what was done"
    assert set(dead.offsets) == {o for o, n in fails.items() if n > RETRIES} & done
    if stop_after is None:
        assert done == set(offsets)


@settings(max_examples=examples(60), deadline=None)
@given(
    offsets=offsets_strategy,
    concurrency=st.integers(2, 4),
    lease_s=st.floats(0.0, 0.5),
    late=st.integers(0, 30),
    late_by=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**32),
)
def test_nothing_is_begun_on_a_lapsed_lease(
    offsets: list[int], concurrency: int, lease_s: float, late: int, late_by: float, seed: int
) -> None:
    """The records from index ``late`` on arrive ``late_by`` seconds after the others (a fetch waits for them);
    the lease ends ``lease_s`` seconds in."""
    clock = FakeClock()
    start = clock()
    arrivals = [(start if i < late else start + late_by, r) for i, r in enumerate(records(offsets))]
    link = FakeLink(
        clock,
        arrivals,
        start_offset=1,
        lease_end=start + lease_s,
        stop_when=lambda link: link.handled >= len(offsets) or link.lapsed_waits > 0,
    )
    script = Script(clock, {}, seed)

    code, _dead, reports = run_lanes(link, script, clock, concurrency)

    assert code is WorkerExit.STOPPED
    assert all(began < start + lease_s for began, _ in script.calls), "no call begins once the lease has ended"
    assert all(offset not in offsets or offset in script.handled for offset, _ in reports)


def test_a_message_that_keeps_failing_holds_progress_until_it_is_dead_lettered_while_others_go_on() -> None:
    clock = FakeClock()
    link = FakeLink(
        clock,
        [(clock(), r) for r in records([1, 2, 3, 4], [b"a", b"b", b"b", b"a"])],
        start_offset=1,
        stop_when=lambda link: link.handled >= 4,
    )
    script = Script(clock, {1: RETRIES + 1}, seed=7)

    code, dead, _ = run_lanes(link, script, clock, concurrency=2)

    assert code is WorkerExit.STOPPED
    assert dead.offsets == [1] and script.handled == {2, 3, 4} and link.next_offset == 5
    assert [o for _, o in script.calls].count(1) == RETRIES + 1
