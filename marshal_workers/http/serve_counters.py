"""What a served topic counts (``marshal-workers serve``): the numbers of /metrics and of the log at exit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServeCounters:
    delivered: int = 0
    acked: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    refused: int = 0  # verdicts the fold refused after our checks passed (a race with a deadline or a lease)
    other_group: int = 0  # messages redriven for another group: never handed out, done
    ranges_claimed: int = 0
    ranges_refused: int = 0
    ranges_acked: int = 0
    ranges_cancelled: int = 0
    ranges_lost: int = 0  # our lease ran out before we settled it (it lapses in the log)
