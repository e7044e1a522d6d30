"""Instrumented handler calls: the soft time limit, the call in progress, the latency histogram."""

from __future__ import annotations

import multiprocessing
import signal
import time
from dataclasses import dataclass
from typing import Any

import pytest

from marshal_workers.errors import SoftTimeLimitExceeded
from marshal_workers.runtime.channel import LATENCY_BOUNDS, Field, Slot, monotonic_ms
from marshal_workers.runtime.worker.instrumentation import Instruments, instrument


@dataclass
class FakeMessage:  # only .offset is read, as on marshal_workers.Message
    offset: int


def new_slot() -> Slot:
    return Slot.create(multiprocessing.get_context("spawn"), next_offset=0)


def test_nothing_switched_on_leaves_the_handler_as_it_is() -> None:
    def handler(msg: Any) -> None: ...

    assert instrument(handler, False, new_slot(), Instruments()) is handler


def test_past_the_soft_limit_the_handler_gets_an_exception_it_can_catch() -> None:
    caught = []

    def slow(msg: Any) -> str:
        try:
            time.sleep(5)
        except SoftTimeLimitExceeded as exc:
            caught.append(exc)
            return "cleaned up"
        return "finished"

    call = instrument(slow, False, new_slot(), Instruments(soft_time_limit=0.05))
    started = time.monotonic()
    assert call(FakeMessage(7)) == "cleaned up"
    assert time.monotonic() - started < 4 and len(caught) == 1


def test_an_escaping_soft_limit_fails_the_call_and_fast_calls_never_see_it() -> None:
    slot = new_slot()
    call = instrument(lambda msg: time.sleep(5), False, slot, Instruments(soft_time_limit=0.05))
    with pytest.raises(SoftTimeLimitExceeded):
        call(FakeMessage(1))
    fast = instrument(lambda msg: msg.offset, False, slot, Instruments(soft_time_limit=0.05))
    assert [fast(FakeMessage(n)) for n in range(3)] == [0, 1, 2]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), "the timer is disarmed between calls"


def test_the_call_in_progress_is_published_for_the_hard_limit() -> None:
    slot = new_slot()
    seen = []

    def handler(msgs: Any) -> None:
        seen.append((slot.get(Field.CALL_STARTED_MS), slot.get(Field.CALL_END_OFFSET)))

    before = monotonic_ms()
    instrument(handler, True, slot, Instruments(track_calls=True))([FakeMessage(10), FakeMessage(11)])
    [(started, end)] = seen
    assert before <= started <= monotonic_ms() and end == 12
    assert slot.get(Field.CALL_STARTED_MS) == 0, "between calls nothing is in progress"


def test_latency_lands_in_the_right_buckets() -> None:
    slot = new_slot()
    call = instrument(lambda msg: time.sleep(msg.offset / 1000), False, slot, Instruments(latency=True))
    for delay_ms in (0, 0, 30):
        call(FakeMessage(delay_ms))
    counts = slot.latency_counts()
    assert len(counts) == len(LATENCY_BOUNDS) + 1 and sum(counts) == 3
    over_25ms = sum(n for bound, n in zip(LATENCY_BOUNDS, counts) if bound > 0.025) + counts[-1]
    assert over_25ms == 1
    assert 0.03 <= slot.get(Field.LATENCY_SUM_NS) / 1e9 < 1.0


def test_an_instrumented_handler_keeps_its_name_for_logs_and_dead_letters() -> None:
    def on_order(msg: object) -> None: ...

    wrapped = instrument(on_order, False, new_slot(), Instruments(track_calls=True))
    assert wrapped is not on_order
    assert (wrapped.__module__, wrapped.__qualname__) == (on_order.__module__, on_order.__qualname__)
