"""The ``status`` report: a group's world state as a document and as a table.

Pure functions over a WorldState and ``now``; reading the log is the CLI's job.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from marshal_workers.world_state import Liveness, WorldState


def status_document(
    state: WorldState, now_ms: int, topic: str | None = None, topic_partitions: int | None = None
) -> dict[str, Any]:
    """The JSON document of DESIGN.md section 9.

    With ``topic``, only that topic is listed, and with ``topic_partitions``
    (its partition count) every partition the log never mentions is listed
    as unclaimed.
    """
    keys = {key for key in state.partitions if topic is None or key[0] == topic}
    if topic is not None and topic_partitions is not None:
        keys.update((topic, p) for p in range(topic_partitions))
    rows = [_partition_row(state, t, p, now_ms) for t, p in sorted(keys)]
    pause = state.paused_until()
    return {
        "group": state.group,
        "paused_until": pause if pause is not None and pause > now_ms else None,
        "partitions": rows,
    }


def _partition_row(state: WorldState, topic: str, partition: int, now_ms: int) -> dict[str, Any]:
    found = state.get(topic, partition)
    owner = None if found is None else found.owner
    return {
        "topic": topic,
        "partition": partition,
        "state": state.liveness(topic, partition, now_ms).value,
        "client": None if owner is None else owner.client,
        "instance": None if owner is None else owner.instance,
        "offset": None if found is None else found.resume_offset,
        "heartbeat_age_s": None if owner is None or found is None else round((now_ms - found.last_ts) / 1000, 3),
        # Reported by the owner in its last heartbeat (optional extras; None when it sent none).
        "lag": None if found is None else found.lag,
        "rate": None if found is None else found.rate,
        "in_flight": None if found is None else found.in_flight,
        "window_used": None if found is None else found.window_used,
    }


_COLUMNS = ("TOPIC", "PARTITION", "STATE", "OWNER", "OFFSET", "HEARTBEAT AGE", "LAG", "MSGS/S", "IN FLIGHT", "WINDOW")


def render_table(document: dict[str, Any], now_ms: int) -> str:
    """A table for people: one line per partition, aligned columns."""
    paused = document["paused_until"]
    header = f"group {document['group']}   as of {utc_text(now_ms)}"
    header += f"   PAUSED until {utc_text(paused)}" if paused is not None else ""
    rows = [
        (
            row["topic"],
            str(row["partition"]),
            row["state"],
            "-" if row["client"] is None else f"{row['client']}/{row['instance']}",
            "-" if row["offset"] is None else str(row["offset"]),
            "-" if row["heartbeat_age_s"] is None else f"{row['heartbeat_age_s']:.1f}s",
            "-" if row["lag"] is None else f"{row['lag']:.0f}",
            "-" if row["rate"] is None else f"{row['rate']:.0f}",
            "-" if row["in_flight"] is None else f"{row['in_flight']:.0f}",
            "-" if row["window_used"] is None else f"{row['window_used']:.0f}",
        )
        for row in document["partitions"]
    ]
    if not rows:
        return f"{header}\n(no partitions: the coordination log holds no record of this group)"
    widths = [max(len(cell) for cell in column) for column in zip(_COLUMNS, *rows)]
    lines = [header] + ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (_COLUMNS, *rows)]
    counts = _count_states(document)
    lines.append(", ".join(f"{n} {name}" for name, n in counts.items() if n))
    return "\n".join(lines)


def _count_states(document: dict[str, Any]) -> dict[str, int]:
    counts = {liveness.value: 0 for liveness in Liveness}
    for row in document["partitions"]:
        counts[row["state"]] += 1
    return counts


def utc_text(ms: int) -> str:
    """A time (ms since epoch) for people: ``2026-11-22 10:00:00 UTC``."""
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):  # any int is valid on the wire, not every int is a date
        return f"{ms} ms since epoch"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_iso(ms: int) -> str:
    """A time (ms since epoch) as ISO 8601 with milliseconds: ``2026-11-22T10:00:00.123Z``."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"
    except (ValueError, OverflowError, OSError):  # any int >= 0 is valid on the wire, not every one is a date
        return f"{ms}ms"
