"""Fold repeated log lines: the first of a kind is logged, the repeats within a window are counted, and the next
line of that kind after the window says how many there were.

librdkafka logs every failed connection attempt: with the broker gone, each client of a supervisor and of its
workers wrote "Connect to ... failed: Connection refused" about 20 times a second (6,800 lines in a minute for one
supervisor with four workers), whatever its reconnect backoff.  A line's kind is its level and its text without
numbers (timings, counts and ports differ from one attempt to the next; what failed and why do not).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

_NUMBERS = re.compile(r"\d+")
MAX_KINDS = 1000  # kinds remembered at once: a flood of different lines cannot grow it without bound


@dataclass
class _Kind:
    window_ends: float  # repeats before this are counted, not logged
    repeats: int = 0


class RepeatedLines(logging.Filter):
    """A logging filter that logs the first line of a kind, then at most one per ``window_s`` seconds, which
    says how many of that kind were held back.  ``clock``: seconds, monotonic (injected for tests)."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._kinds: dict[tuple[int, str], _Kind] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        key = (record.levelno, _NUMBERS.sub("#", record.getMessage()))
        kind = self._kinds.get(key)
        if kind is not None and now < kind.window_ends:
            kind.repeats += 1
            return False
        held_back = kind.repeats if kind is not None else 0
        if kind is None and len(self._kinds) >= MAX_KINDS:
            self._forget_ended(now)
        self._kinds[key] = _Kind(window_ends=now + self.window_s)
        if held_back:
            record.msg = f"{record.getMessage()} (and {held_back} more like it in the last {self.window_s:g}s)"
            record.args = None
        return True

    def kinds_remembered(self) -> int:
        """How many kinds of line it remembers now (at most MAX_KINDS)."""
        return len(self._kinds)

    def _forget_ended(self, now: float) -> None:
        """Make room: drop the kinds whose window has ended (their held-back count is lost), else the oldest."""
        ended = [key for key, kind in self._kinds.items() if kind.window_ends <= now]
        for key in ended or list(self._kinds)[: MAX_KINDS // 10]:
            del self._kinds[key]
