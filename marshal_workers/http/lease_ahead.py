"""When a served topic leases its next ranges: before the held ones run dry while readers read, never for nobody.

A server leases ranges only while it has readers (they wait, or read lately), and then as soon as fewer messages
wait to be handed out than its readers take in LEASE_AHEAD_S at their recent rate (:class:`HandOutRate`): the
next ranges' claims and first fetches (10 to 30 ms) overlap the reads of the held ones.  The ranges are the
configured size (``--range-size``) or, for readers fast enough to empty one in RANGE_SPAN_S, larger
(:func:`range_size`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Readers that read this recently count as readers still: the loop leases the next ranges before the held ones run
# dry (a read answered at once waits for nothing, so counting only the reads that wait claimed every range after its
# readers found nothing: each range's first reads waited a loop pass, a claim and a fetch, 10 to 30 ms).
READERS_RECENT_S = 1.0
# Messages at hand for this long at the readers' recent rate: the next ranges are leased when fewer wait (a loop pass,
# a claim's write and a fetch of the range take 10 to 30 ms; at 64 clients half a range lasted 10).
LEASE_AHEAD_S = 0.05
HAND_OUT_WINDOW_S = 0.25  # the readers' rate is measured over windows this long
# A range leased lasts the readers at least this long at their recent rate: fast readers get fewer, larger ranges.
# Each range costs the loop a claim, a fetch and a settlement, in passes 10 to 30 ms apart: readers of 100 messages a
# request emptied a range of 100 each, and waited for the next passes (8 clients, max=100: read p50 40 to 80 ms,
# 10,000 msgs/s; in ranges of 1,000, 12 ms and 27,000 msgs/s, same sitting).
RANGE_SPAN_S = 0.1
MOST_RANGE = 2000  # offsets: read_ahead.MOST_KEPT, what the read-ahead keeps of a partition for the next range
MAX_HELD = 64  # ranges held at once, whatever is pending in them (bounds what a server keeps)


@dataclass
class HandOutRate:
    """Messages handed out per second in the last full window of HAND_OUT_WINDOW_S: ``count`` is raised as they go
    (under the ServedTopic's lock), ``per_second`` asked by the serve loop."""

    count: int = 0
    _since: float | None = None  # monotonic: the start of the current window
    _counted: int = 0  # ``count`` at that start
    _rate: float = 0.0

    def per_second(self, now: float) -> float:
        if self._since is None:
            self._since, self._counted = now, self.count
        elif now - self._since >= HAND_OUT_WINDOW_S:
            self._rate = (self.count - self._counted) / (now - self._since)
            self._since, self._counted = now, self.count
        return self._rate


def ranges_wanted(held: int, active: int, available: int, rate: float, size: int, max_leases: int) -> int:
    """Ranges of ``size`` to claim now, for readers, holding ``held`` ranges of which ``active`` have messages still
    to hand out, ``available`` messages at hand, readers taking ``rate`` a second: when fewer wait than the readers
    take in LEASE_AHEAD_S (at least half a range), enough ranges to make that up.  Ranges whose every message is
    out with clients do not count against ``max_leases`` (they only wait for acks), up to MAX_HELD in all."""
    reserve = max(1, size // 2, math.ceil(rate * LEASE_AHEAD_S))
    if held >= MAX_HELD or active >= max_leases or available >= reserve:
        return 0
    wanted = max(1 if active else 2, math.ceil((reserve - available) / size))
    return min(wanted, max_leases - active, MAX_HELD - held)


def range_size(rate: float, least: int) -> int:
    """Offsets of the next ranges to lease for readers taking ``rate`` a second: enough for RANGE_SPAN_S of their
    reads, at least ``least`` (the configured size) and at most MOST_RANGE (unless the configured size is more)."""
    return max(least, min(MOST_RANGE, math.ceil(rate * RANGE_SPAN_S)))
