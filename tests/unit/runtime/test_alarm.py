"""alarm.Alarm: the flag the ALO loop reads instead of the clock."""

from __future__ import annotations

import time

from polling import poll_until

from marshal_workers.runtime.worker.alarm import EARLY_S, Alarm


def test_the_flag_rises_shortly_before_the_time_set_and_not_long_before() -> None:
    alarm = Alarm()
    at = time.monotonic() + 0.3
    alarm.set(at)
    assert not alarm.due[0]
    poll_until(lambda: alarm.due[0], timeout=10, interval=0.001, what="the alarm")
    assert time.monotonic() >= at - EARLY_S - 0.005, "raised too early"


def test_a_time_moved_later_delays_the_flag_and_an_earlier_one_brings_it_forward() -> None:
    alarm = Alarm()
    alarm.set(time.monotonic() + 0.2)
    alarm.set(time.monotonic() + 60)  # the lease was extended
    time.sleep(0.4)
    assert not alarm.due[0], "the earlier time no longer counts"
    alarm.set(time.monotonic() + 0.1)
    poll_until(lambda: alarm.due[0], timeout=10, interval=0.001, what="the alarm brought forward")


def test_a_time_too_close_and_a_stop_raise_the_flag_at_once() -> None:
    alarm = Alarm()
    alarm.set(time.monotonic() + EARLY_S)
    assert alarm.due[0]
    alarm.set(time.monotonic() + 60)
    assert not alarm.due[0]
    alarm.raise_now()
    assert alarm.due[0]
