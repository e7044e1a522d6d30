"""The batch loop (batch handlers, and at most once: runtime/worker/batch_loop.py) against a fake link and a fake
clock, in one process: no broker, no fork.  At most once, no message is handled before its batch is claimed, no batch
is begun on a lapsed lease, a refused claim handles nothing more, and a stop finishes the claimed batch and reports its end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples
from worker_fakes import TOPIC, DeadLetters, FakeAlarm, FakeClock, FakeLink, admission_on, failures_on, records

from marshal_workers import App, Message
from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.runtime.worker.batch_loop import BatchLoop
from marshal_workers.runtime.worker.instrumentation import LatencySampling

CALL_S = 0.001


def run_batches(link: FakeLink, handle: object, **options: object) -> tuple[WorkerExit, DeadLetters]:
    app = App("billing")
    app.handler(TOPIC, retry_backoff=0.01, retry_jitter=False, **options)(handle)  # type: ignore[arg-type]
    dead = DeadLetters()
    failures = failures_on(link, dead)
    loop = BatchLoop(link, failures, admission_on(link, failures), LatencySampling(app.handler_in_worker(TOPIC)))  # type: ignore[arg-type]
    FakeAlarm(link.clock)  # not used by this loop: its lease checks read the clock
    return loop.run(), dead


@settings(max_examples=examples(150), deadline=None)
@given(
    count=st.integers(1, 40),
    batch_size=st.integers(1, 8),
    refused_at=st.none() | st.integers(0, 10),
    lease_calls=st.none() | st.integers(0, 40),
    stop_in=st.none() | st.integers(1, 40),
)
def test_at_most_once_handles_only_claimed_messages_and_a_stop_finishes_the_claimed_batch(
    count: int, batch_size: int, refused_at: int | None, lease_calls: int | None, stop_in: int | None
) -> None:
    clock = FakeClock()
    offsets = list(range(1, count + 1))
    claims = [ClaimAnswer.CLAIMED] * (refused_at or 0) + ([ClaimAnswer.REFUSED] if refused_at is not None else [])
    lease_end = clock() + lease_calls * CALL_S + CALL_S / 2 if lease_calls is not None else float("inf")
    link = FakeLink(
        clock,
        [(clock(), r) for r in records(offsets)],
        start_offset=1,
        lease_end=lease_end,
        claims=claims,
        stop_when=lambda link: link.handled >= count or link.lapsed_waits > 0,
    )
    calls: list[tuple[int, int, float]] = []  # (offset, the highest claimed end when it was called, when)

    def handle(msg: Message) -> None:
        calls.append((msg.offset, max(link.claimed, default=0), clock()))
        clock.advance(CALL_S)
        if msg.offset == stop_in:
            link.request_stop()

    code, _ = run_batches(link, handle, mode="amo", batch_size=batch_size)

    assert all(offset < claimed for offset, claimed, _ in calls), "no message is handled before its batch is claimed"
    firsts = [when for i, (_, claimed, when) in enumerate(calls) if i == 0 or calls[i - 1][1] != claimed]
    assert all(when < lease_end for when in firsts), "no batch is begun once the lease has ended"
    assert len(link.claimed) <= (refused_at if refused_at is not None else len(link.claimed))
    handled = [offset for offset, _, _ in calls]
    assert handled == sorted(set(handled)), "each message at most once, in order"
    if code is WorkerExit.LOST:
        assert refused_at is not None and len(link.claimed) == refused_at
    if stop_in is not None and stop_in in handled and code is WorkerExit.STOPPED and not link.lapsed_waits:
        end = link.claimed[-1]
        assert handled[-1] == end - 1 and link.next_offset == end, "a stop finishes the claimed batch, reports its end"
    for _, progress in link.progress:
        assert progress in link.claimed and all(o in handled for o in offsets if o < progress), progress


def test_a_batch_handler_at_least_once_reports_progress_after_each_whole_batch() -> None:
    clock = FakeClock()
    link = FakeLink(
        clock, [(clock(), r) for r in records(range(1, 8))], start_offset=1, stop_when=lambda link: link.handled >= 7
    )
    batches: list[list[int]] = []
    stores_then: list[tuple[int, int]] = []  # (progress stored, messages handled by then)
    link.fields.on_progress = lambda offset: stores_then.append((offset, sum(map(len, batches))))

    def handle(msgs: list[Message]) -> None:
        batches.append([m.offset for m in msgs])

    code, _ = run_batches(link, handle, batch=True, batch_size=3)

    assert code is WorkerExit.STOPPED and batches == [[1, 2, 3], [4, 5, 6], [7]]
    assert stores_then == [(4, 3), (7, 6), (8, 7)], "progress moves to a batch's end once the batch is handled"
    assert link.claimed == [], "at least once claims nothing"
