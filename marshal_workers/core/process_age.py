"""How long ago this process started, for the start-up line's account of where a start-up's time went."""

from __future__ import annotations

import os
import time

_STARTTIME_FIELD = 19  # /proc/<pid>/stat's 22nd field, counted from the state after the ")" that ends the name


def process_age() -> float | None:
    """Seconds since this process was started, or None where the system does not say (only Linux's /proc does).

    The interpreter's start and every import happen before any of our code can read a clock, so this is the only
    way to tell how much of a start-up they took."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        started = int(fields[_STARTTIME_FIELD]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, or no CLOCK_BOOTTIME (not Linux)
        return None
