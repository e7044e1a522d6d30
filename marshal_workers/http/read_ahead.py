"""The HTTP service's read-ahead: messages its consumer read past every range it holds, kept for the next ranges.

The serve loop reads each held range's messages from Kafka, and its consumer reads on past the range's end (a
fetch returns what the broker has, and librdkafka prefetches).  Thrown away, those messages were read again
for the next range, after a re-assignment of the consumer that also dropped what librdkafka had prefetched: per
range of 100 messages the server parsed several hundred.  Kept here, the next range claimed there takes its
messages at once (no fetch before its first read) and the consumer reads on from where it was.

A partition's run is the offsets [start, end) read in order without a gap in the reading: every message there
was seen, so an offset of it without a message has none (a transaction marker, a compacted record).  Taking a
range's messages moves the start past them: a range given back and claimed again later is read from Kafka
again, never taken from a run that no longer has its messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MOST_KEPT = 2000  # messages kept per partition: past it the run is dropped (and read again when wanted)


@dataclass
class _Run:
    start: int
    end: int
    records: dict[int, Any] = field(default_factory=dict)  # offset -> message (None: not this group's to hand out)


class ReadAhead:
    def __init__(self, most_kept: int = MOST_KEPT) -> None:
        self._runs: dict[int, _Run] = {}
        self._most_kept = most_kept

    def note(self, partition: int, begin: int, reached: int, records: dict[int, Any]) -> None:
        """The consumer read ``partition`` from ``begin`` up to ``reached`` in order, past every held range:
        ``records`` (offset -> message, None for one not to hand out) are every message it saw there."""
        if reached <= begin:
            return
        run = self._runs.get(partition)
        if run is None or not run.start <= begin <= run.end:
            run = self._runs[partition] = _Run(begin, begin)  # not contiguous with what is kept: start over
        run.records.update((offset, record) for offset, record in records.items() if offset >= begin)
        run.end = max(run.end, reached)
        if len(run.records) > self._most_kept:
            del self._runs[partition]

    def take(self, partition: int, start: int, end: int) -> tuple[dict[int, Any], int] | None:
        """The messages of a range [start, end) claimed now, from the run, and the offset reading goes on from
        (its end, or the run's); None if the run does not begin at or before ``start``."""
        run = self._runs.get(partition)
        if run is None or not run.start <= start < run.end:
            return None
        upto = min(end, run.end)
        taken = {offset: run.records.pop(offset) for offset in range(start, upto) if offset in run.records}
        for offset in [o for o in run.records if o < upto]:
            del run.records[offset]  # below the range: never taken again (see the module's docstring)
        run.start = upto
        if run.start >= run.end:
            del self._runs[partition]
        return taken, upto

    def kept(self, partition: int) -> int:
        run = self._runs.get(partition)
        return 0 if run is None else len(run.records)
