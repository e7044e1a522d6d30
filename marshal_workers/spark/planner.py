"""Planning: offset ranges of a topic's partitions -> splits, each one Spark task.

Pure.  Like Spark's own Kafka source (KafkaOffsetRangeCalculator), a range
larger than the maximum split size is cut into the fewest pieces that fit,
of sizes that differ by at most one, so the tasks are even; empty ranges make
no task.  The end of every split comes from the plan, never from the broker at
read time: a split is a fixed, replayable piece of the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True, slots=True)
class Split:
    """Offsets ``start`` up to, not including, ``end`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"a split needs 0 <= start <= end, got {self}")

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"


def plan_splits(ranges: Iterable[Split], max_split: int) -> list[Split]:
    """Cut each range into ceil(size / max_split) splits of near-equal size, in (topic, partition, start) order."""
    if max_split < 1:
        raise ValueError(f"max_split must be >= 1, got {max_split}")
    splits: list[Split] = []
    for whole in sorted(ranges):
        pieces = -(-whole.size // max_split)  # ceil; 0 for an empty range
        if pieces == 0:
            continue
        base, longer = divmod(whole.size, pieces)
        start = whole.start
        for piece in range(pieces):
            end = start + base + (1 if piece < longer else 0)
            splits.append(Split(whole.topic, whole.partition, start, end))
            start = end
    return splits


def total_size(splits: Iterable[Split]) -> int:
    return sum(split.size for split in splits)
