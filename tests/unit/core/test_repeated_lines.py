"""RepeatedLines: librdkafka's reconnect attempts (about 20 a second per client with the broker gone) fold into one
line per window that says how many were held back."""

from __future__ import annotations

import logging

from marshal_workers.core.repeated_lines import MAX_KINDS, RepeatedLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def line(text: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("marshal_workers.librdkafka", level, __file__, 1, text, args, None)


def refused(after_ms: int) -> logging.LogRecord:
    return line(
        "FAIL [c#consumer-1]: Connect to ipv4#127.0.0.1:29094 failed: Connection refused (after %dms)", after_ms
    )


def test_repeats_of_a_kind_are_held_back_for_the_window_then_counted_in_the_next_line() -> None:
    clock = Clock()
    lines = RepeatedLines(window_s=10.0, clock=clock)
    first = refused(0)
    assert lines.filter(first) and first.getMessage().endswith("(after 0ms)"), "the first is logged as it is"
    held = []
    for step in range(1, 200):  # 20 a second for ten seconds: the timings differ, the kind does not
        clock.now = step * 0.05
        held.append(lines.filter(refused(step % 7)))
    assert not any(held)
    clock.now = 10.0
    after = refused(3)
    assert lines.filter(after)
    assert after.getMessage().endswith("(after 3ms) (and 199 more like it in the last 10s)")
    clock.now = 10.5
    assert not lines.filter(refused(0)), "a new window began with that line"


def test_other_kinds_and_levels_are_logged_apart() -> None:
    lines = RepeatedLines(window_s=10.0, clock=Clock())
    text = "FAIL [c#consumer-1]: Connect to ipv4#127.0.0.1:29094 failed: Connection refused (after %dms)"
    assert lines.filter(line(text, 0))
    assert lines.filter(line("FAIL: Disconnected: connection closed by peer")), "another text"
    assert lines.filter(line(text, 0, level=logging.INFO)), "another level"
    assert not lines.filter(line(text, 5)), "a repeat of the first"


def test_a_flood_of_different_lines_keeps_what_is_remembered_bounded() -> None:
    clock = Clock()
    lines = RepeatedLines(window_s=10.0, clock=clock)
    for n in range(3 * MAX_KINDS):
        assert lines.filter(line(f"line {chr(65 + n % 26)}{'x' * (n // 26)}"))
        clock.now += 0.001
    assert lines.kinds_remembered() <= MAX_KINDS
