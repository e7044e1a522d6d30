"""A partition's end, as every reader of the project takes it: the larger of what ListOffsets lists and what a
fetch response carried (docs/brokers.md, "The embedded broker").

On Kafka the two agree (a fetch's high watermark may only be older).  The embedded broker (Tansu) lists the base
offset of the partition's last batch plus one: the end, less the last batch's other records.  The high watermark of
a fetch response is right on both.  So the end is the larger; either may be unknown (-1: not listed, or no fetch
came back yet).  Pure: the readers give it the two numbers (GuardedConsumer.fetched_end reads the fetched one).
"""

from __future__ import annotations


def partition_end(listed: int, fetched: int) -> int:
    """The end of a partition from its ``listed`` end (ListOffsets) and its ``fetched`` one (a fetch response's
    high watermark, or an end that holders' fetches saw); -1 if neither is known."""
    return max(listed, fetched, -1)
