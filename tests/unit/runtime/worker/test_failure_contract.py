"""The failure path's contract (handlers/failure_path.py), as arroyo runs one suite over all its strategies: the same
handler behaviours through every way of running a handler (the partition worker's one-call loop, batches, lanes of
threads and of an event loop, the shared worker, Spark replay's task, the testing harness), in one process on fakes,
with the same outcomes.  Where runners differ by design it is in what a final failure becomes (their Final: the
handler's on_error, a shared range's next delivery, a replay's stop), never in when it is final.

Here, beside the partition loops' fakes (worker_fakes.py), though it checks handlers/failure_path.py: every runner
needs them or less."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from worker_fakes import PARTITION, TOPIC, DeadLetters, FakeClock, FakeLink, run_partition_loop

from marshal_workers import App, Ignore, Message, Reject, SoftTimeLimitExceeded
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import partition_log
from marshal_workers.handlers.blocking_calls import blocking
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.runtime.worker.shared_failures import InRange, SharedFailures
from marshal_workers.spark.replay import handle_records, replay_handler
from marshal_workers.testing import FakeRecord, make_message, run_handler

RETRIES = 2


class Order(msgspec.Struct):
    id: int


class Script:
    """What each message's value asks its calls to do; the calls made, per offset."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}

    def act(self, msg: Message) -> None:
        self.calls[msg.offset] = self.calls.get(msg.offset, 0) + 1
        value = msg.value
        if value == b"flaky" and msg.attempt == 1:
            raise ConnectionError("the ledger hiccuped")
        if value == b"broken":
            raise ValueError("the ledger is down")
        if value == b"reject":
            raise Reject("an order without an amount")
        if value == b"ignore":
            raise Ignore()
        if value == b"slow":  # what the soft time limit raises inside a call that runs past it
            raise SoftTimeLimitExceeded("the handler ran past its soft time limit")


# What each runner makes of a message (by position): done, dead_letter, released, again (a shared range's next
# delivery), stopped (a replay's split stops there), not_handled (after a release or a stop); and the calls made.
Outcomes = tuple[list[str], list[int], OutcomeCounts | None]
Runner = Callable[[App, list[bytes], Script], Outcomes]


def _app(script: Script, typed: bool = False, asynchronous: bool = False, **options: Any) -> App:
    app = App("billing")
    options = {"retries": RETRIES, "retry_backoff": 0.001, "retry_jitter": False, **options}
    if typed and options.get("batch"):

        def on_orders(msgs: list[Message[Order]]) -> None:
            for msg in msgs:
                script.act(msg)

        app.handler(TOPIC, **options)(on_orders)
    elif typed:

        def on_order(msg: Message[Order]) -> None:
            script.act(msg)

        app.handler(TOPIC, **options)(on_order)
    elif asynchronous:

        async def on_message_async(msg: Message) -> None:
            script.act(msg)

        app.handler(TOPIC, **options)(on_message_async)
    elif options.get("batch"):

        def on_batch(msgs: list[Message]) -> None:
            for msg in msgs:
                script.act(msg)

        app.handler(TOPIC, **options)(on_batch)
    else:
        app.handler(TOPIC, **options)(script.act)
    return app


def _records(values: list[bytes]) -> list[Any]:
    return [FakeRecord(TOPIC, PARTITION, offset, b"k", value) for offset, value in enumerate(values, start=1)]


def _on_link(loop: str) -> Runner:
    def run(app: App, values: list[bytes], script: Script) -> Outcomes:
        clock = FakeClock()
        link = FakeLink(
            clock,
            [(clock(), r) for r in _records(values)],
            start_offset=1,
            stop_when=lambda link: link.next_offset > len(values),
        )
        dead = DeadLetters()
        code = run_partition_loop(loop, link, dead, app.handler_in_worker(TOPIC))
        outcomes = []
        for offset in range(1, len(values) + 1):
            if offset in dead.offsets:
                outcomes.append("dead_letter")
            elif offset < link.next_offset:
                outcomes.append("done")
            else:
                released = code is WorkerExit.RELEASE and offset == link.next_offset
                outcomes.append("released" if released else "not_handled")
        return outcomes, [script.calls.get(o, 0) for o in range(1, len(values) + 1)], link.outcomes

    return run


def _shared(app: App, values: list[bytes], script: Script) -> Outcomes:
    dead, counts = DeadLetters(), OutcomeCounts()
    log = partition_log(logging.getLogger("tests.failure_contract"), "billing", TOPIC, PARTITION)
    failures = SharedFailures(dead, counts, lambda _record: log, lambda: False, lambda: 0, lambda _s: None)  # type: ignore[arg-type]
    handler = blocking(app.handler_in_worker(TOPIC))  # as the shared worker takes it up
    failures.take_up(handler, app.hooks)
    fates = [failures.handle(handler, record, tries=0, deadline_ms=10**9) for record in _records(values)]
    names = {InRange.HANDLED: "done", InRange.DEAD: "dead_letter", InRange.FAILED: "again"}
    return [names[f] for f in fates], [script.calls.get(o, 0) for o in range(1, len(values) + 1)], counts


def _replay(app: App, values: list[bytes], script: Script) -> Outcomes:
    handler, records = replay_handler(app, TOPIC), _records(values)
    size = handler.batch_size if handler.batch else 1
    outcomes: list[str] = []
    for start in range(0, len(records), size):
        call = records[start : start + size]
        if "stopped" in outcomes:
            outcomes += ["not_handled"] * len(call)
            continue
        _handled, failure = handle_records(handler, call)
        failed = None if failure is None else failure[0]
        outcomes += ["stopped" if r.offset() == failed else "done" for r in call]
    return outcomes, [script.calls.get(o, 0) for o in range(1, len(values) + 1)], None


def _harness(app: App, values: list[bytes], script: Script) -> Outcomes:
    messages = [make_message(v, offset=0) for v in values]  # offsets all alike, as make_message's default
    results = run_handler(app, TOPIC, messages, lifecycle=False)
    names = {"ignored": "done"}
    return [names.get(r.outcome, r.outcome) for r in results], [r.attempts for r in results], None


RUNNERS: dict[str, Runner] = {
    "one call": _on_link("one call"),
    "batch": _on_link("batch"),
    "lanes": _on_link("lanes"),
    "shared": _shared,
    "replay": _replay,
    "harness": _harness,
}
OPTIONS: dict[str, dict[str, Any]] = {"batch": {"batch": True, "batch_size": 1}, "lanes": {"concurrency": 2}}
# What a final failure of the middle message becomes in each runner, and what follows it.
FINAL = {"shared": ("again", "done"), "replay": ("stopped", "not_handled")}


def _final(runner: str) -> tuple[str, str]:
    return FINAL.get(runner, ("dead_letter", "done"))


def _run(runner: str, values: list[bytes], **options: Any) -> tuple[Outcomes, Script]:
    script = Script()
    app = _app(script, **{**OPTIONS.get(runner, {}), **options})
    return RUNNERS[runner](app, values, script), script


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize(
    ("value", "calls", "final"),
    [
        (b"ok", 1, False),
        (b"flaky", 2, False),
        (b"ignore", 1, False),
        (b"broken", RETRIES + 1, True),
        (b"slow", RETRIES + 1, True),
        (b"reject", 1, True),
    ],
)
def test_each_behaviour_has_the_same_outcome_in_every_runner(
    runner: str, value: bytes, calls: int, final: bool
) -> None:
    (outcomes, attempts, counts), _ = _run(runner, [b"ok", value, b"ok"])

    failed_as, after = _final(runner) if final else ("done", "done")
    if value == b"reject" and runner == "shared":
        failed_as = "dead_letter"  # a Reject is never delivered again
    assert outcomes == ["done", failed_as, after]
    assert attempts[:2] == [1, calls], "the retries: as many in every runner"
    if counts is not None:
        taken = counts.take() or {}
        assert (taken.get("retries", 0), taken.get("ignored", 0)) == (calls - 1, int(value == b"ignore"))


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_typed_call_with_one_bad_payload_dead_letters_only_that_one(runner: str) -> None:
    """One message per call, or (where the runner takes batches) the three in one batch: the good ones are handled
    once, the bad one never retried."""
    batch = {"batch": True, "batch_size": 3} if runner in ("batch", "replay", "harness") else {}
    (outcomes, _attempts, _), script = _run(runner, [b'{"id": 1}', b'{"id": "x"}', b'{"id": 3}'], typed=True, **batch)

    failed_as = "stopped" if runner == "replay" else "dead_letter"
    after = "not_handled" if runner == "replay" and not batch else "done"
    assert outcomes == ["done", failed_as, after]
    if runner != "harness":
        assert script.calls == ({1: 1, 3: 1} if after == "done" else {1: 1}), "the good ones once, the bad none"


@pytest.mark.parametrize("runner", ["lanes", "shared", "replay", "harness"])  # async def runs on lanes in a worker
def test_an_async_handler_that_keeps_failing_is_retried_then_meets_its_final(runner: str) -> None:
    (outcomes, attempts, _), _script = _run(runner, [b"ok", b"broken", b"ok"], asynchronous=True)

    failed_as, after = _final(runner)
    assert outcomes == ["done", failed_as, after]
    assert attempts[:2] == [1, RETRIES + 1]
