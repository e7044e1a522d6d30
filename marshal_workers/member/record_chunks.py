"""How a member splits the entries of one write (heartbeats, batch claims) into records, and maps the records'
verdicts back to the entries.

One multi-partition record per topic, split where it would be large: at ``MAX_ENTRIES_PER_RECORD`` entries, or
where its estimated size would pass ``MAX_RECORD_BYTES``, so a record stays well below Kafka's default 1 MB
message limit whatever the done sets.  The supervisor's coordinator (kafka/coordination_writer.py) and the simulator's
members (simulation/member.py) both split here, so the simulated log holds the records a real fleet writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import per_entry

MAX_ENTRIES_PER_RECORD = 4096
MAX_RECORD_BYTES = 256 * 1024


def topic_chunks(topics: Sequence[str], sizes: Sequence[int] | None = None) -> list[list[int]]:
    """Indices of entries grouped by topic (topics in order of first appearance), split where a record would
    be large (``sizes``: each entry's estimated bytes): one multi-partition record per list."""
    by_topic: dict[str, list[int]] = {}
    for i, topic in enumerate(topics):
        by_topic.setdefault(topic, []).append(i)
    chunks: list[list[int]] = []
    for indices in by_topic.values():
        chunk: list[int] = []
        size = 0
        for i in indices:
            estimate = 100 if sizes is None else sizes[i]
            if chunk and (len(chunk) >= MAX_ENTRIES_PER_RECORD or size + estimate > MAX_RECORD_BYTES):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(i)
            size += estimate
        chunks.append(chunk)
    return chunks


def entry_verdicts(chunks: list[list[int]], verdicts: Sequence[Any], count: int) -> list[bool]:
    """The verdicts of the records written for ``chunks`` (of :func:`topic_chunks`), as one per entry."""
    result = [False] * count
    for chunk, verdict in zip(chunks, verdicts):
        for i, accepted in zip(chunk, per_entry(verdict, len(chunk))):
            result[i] = bool(accepted)
    return result


def beat_chunks(topics: Sequence[str], done_runs: Sequence[int]) -> list[list[int]]:
    """:func:`topic_chunks` for heartbeats: ``done_runs``, the numbers in each beat's done set, make it larger
    (generous: their digits and commas)."""
    return topic_chunks(topics, [100 + 21 * runs for runs in done_runs])


def heartbeat_records(
    common: dict[str, Any], topics: Sequence[str], beats: Sequence[codec.Beat], chunks: list[list[int]]
) -> list[codec.Record]:
    """One Heartbeats record per chunk (of :func:`beat_chunks`), the beats in their order (``topics[i]`` is
    ``beats[i]``'s topic)."""
    return [
        codec.Heartbeats(**common, topic=topics[chunk[0]], beats=tuple(beats[i] for i in chunk)) for chunk in chunks
    ]
