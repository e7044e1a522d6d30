"""LoopHandoff: write verdicts reach the event loop with their outcome, many per wake-up."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.http.loop_handoff import LoopHandoff


def test_verdicts_settled_together_reach_every_request_with_one_wakeup_per_batch() -> None:
    async def main() -> tuple[list[list[bool]], int]:
        handoff = LoopHandoff(asyncio.get_running_loop())
        pending: list[Future[list[bool]]] = [Future() for _ in range(50)]
        waiting = [handoff.watch(done) for done in pending]

        def writer() -> None:  # one group commit's write settles all of them, on its own thread
            for n, done in enumerate(pending):
                done.set_result([n % 2 == 0])

        thread = threading.Thread(target=writer)
        thread.start()
        thread.join()
        results = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        return results, handoff.wakeups

    results, wakeups = asyncio.run(main())
    assert results == [[n % 2 == 0] for n in range(50)]
    assert wakeups == 1  # settled before the loop ran: one flush carried all 50


def test_a_failed_write_reaches_the_request_as_its_exception() -> None:
    async def main() -> None:
        handoff = LoopHandoff(asyncio.get_running_loop())
        done: Future[list[bool]] = Future()
        waiting = handoff.watch(done)
        threading.Thread(target=done.set_exception, args=(CoordinationWriteError("not confirmed"),)).start()
        with pytest.raises(CoordinationWriteError, match="not confirmed"):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(main())


def test_an_outcome_known_already_needs_no_wakeup_and_a_request_that_gave_up_is_skipped() -> None:
    async def main() -> None:
        handoff = LoopHandoff(asyncio.get_running_loop())
        known: Future[int] = Future()
        known.set_result(7)
        assert await handoff.watch(known) == 7
        assert handoff.wakeups == 0
        late: Future[int] = Future()
        gave_up = handoff.watch(late)
        gave_up.cancel()  # the request's timeout
        after: Future[int] = Future()
        waiting = handoff.watch(after)
        threading.Thread(target=lambda: (late.set_result(1), after.set_result(2))).start()
        assert await asyncio.wait_for(waiting, 10) == 2

    asyncio.run(main())


def test_a_verdict_that_does_not_come_in_time_fails_its_request_with_a_timeout_and_no_other() -> None:
    async def main() -> None:
        handoff = LoopHandoff(asyncio.get_running_loop(), within_s=0.2)
        answered: Future[int] = Future()
        never: Future[int] = Future()  # a writer stuck past the verdict wait
        quick, stuck = handoff.watch(answered), handoff.watch(never)
        threading.Thread(target=answered.set_result, args=(1,)).start()
        assert await asyncio.wait_for(quick, 10) == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stuck, 10)
        later: Future[int] = Future()  # a watch after the timer fired gets a deadline of its own
        again = handoff.watch(later)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(again, 10)
        never.set_result(2)  # a verdict after the request gave up changes nothing
        late: Future[int] = Future()
        waiting = handoff.watch(late)
        threading.Thread(target=late.set_result, args=(3,)).start()
        assert await asyncio.wait_for(waiting, 10) == 3

    asyncio.run(main())
