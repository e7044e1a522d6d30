"""Durations and sizes as settings and handler options give them: ``250ms``, ``5s``, ``2m``; ``512MB``, ``1GB``.

Pure functions over the value given; a value they refuse is a ConfigError that says what was expected.
"""

from __future__ import annotations

import math
import re
from typing import Any

from marshal_workers.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string such as ``250ms``, ``5s``, ``2m``, ``1h``, ``7d``."""
    if isinstance(value, bool):
        raise ConfigError(f"expected a duration such as 5s or 250ms, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(f"expected a duration such as 5s, 250ms, 2m or 1h, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ConfigError(f"a duration must be at least 1ms, got {value!r}")
    return seconds


# The least heartbeat interval.  A member writes one heartbeats record per topic every HB/2 (more often only if its
# writes are confirmed faster), and every member of every group on the coordination topic reads and folds them
# all, and reads again those since the last checkpoint at each start-up: 8 records/s per member and topic at
# 250ms, but up to one per write round trip (some 1,000/s) at 1ms.  Below it a claim (stale after 2 HB) also
# lapses within two passes of the supervisor's loop (100 ms each) plus one slow write.  docs/operations.md.
MIN_HEARTBEAT_INTERVAL_S = 0.25


def parse_heartbeat_interval(value: Any) -> float:
    """A duration of at least MIN_HEARTBEAT_INTERVAL_S."""
    seconds = parse_duration(value)
    if seconds < MIN_HEARTBEAT_INTERVAL_S:
        raise ConfigError(
            f"{value!r} is below the least heartbeat interval, 250ms: every member writes a record per topic every "
            "HB/2, which every member of every group on the coordination topic reads, so a shorter one slows them "
            "all (docs/operations.md); give 250ms or more (default 5s)"
        )
    return seconds


def parse_limit(value: Any) -> float:
    """A duration, or 0 for "no limit"."""
    if not isinstance(value, bool) and value in (0, "0"):
        return 0.0
    return parse_duration(value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_UNIT_BYTES = {None: 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20}
_UNIT_BYTES |= {"g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_size(value: Any) -> int:
    """Bytes from a number or a string such as ``512MB`` or ``1GB`` (binary units: 1MB = 2**20 bytes); 0: no limit."""
    if isinstance(value, bool):
        raise ConfigError(f"expected a size such as 512MB, got {value!r}")
    match = _SIZE.match(str(value))
    if not match:
        raise ConfigError(f"expected a size such as 512MB or 2GB, got {value!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return int(float(match.group(1)) * _UNIT_BYTES[unit])


def parse_memory_limit(value: Any) -> int:
    """A size of at least 1MB, or 0 for "no limit": a number without a unit is bytes, so ``512`` is refused."""
    size = parse_size(value)
    if 0 < size < 2**20:
        text = str(value).strip()
        hint = f"did you mean {text}MB?" if text.isdigit() else "give at least 1MB"
        raise ConfigError(
            f"{text} is {size} bytes, less than the least useful limit of 1MB; {hint} (a size without a unit is "
            "bytes; 0 means no limit)"
        )
    return size
