"""When to restart a crashed worker, and when to give its partition up (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential backoff between restarts; past ``limit`` crashes in a row, the partition is sick.

    A crash "in a row" is one where the worker made no progress since it was
    (re)started: a worker that handled messages and then crashed starts a new count.
    """

    limit: int = 5
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay(self, crashes_in_a_row: int) -> float | None:
        """Seconds to wait before restarting after this many crashes in a row; None: release as sick."""
        if crashes_in_a_row < 1:
            raise ValueError(f"crashes_in_a_row must be >= 1, got {crashes_in_a_row}")
        if crashes_in_a_row >= self.limit:
            return None
        doublings = min(crashes_in_a_row - 1, 64)  # past 64 the cap has long been reached; 2**n would overflow a float
        return min(self.first_delay_s * 2.0**doublings, self.max_delay_s)
