"""The ``status`` report: a group's world state as a document and as a table.

Pure functions over a WorldState and ``now``; reading the log is the CLI's job.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import Liveness


def status_document(
    state: WorldState, now_ms: int, topic: str | None = None, topic_partitions: int | None = None
) -> dict[str, Any]:
    """The JSON document of ``status --json`` (docs/operations.md).

    With ``topic``, only that topic is listed, and with ``topic_partitions``
    (its partition count) every partition the log never mentions is listed
    as unclaimed.
    """
    keys = {key for key in state.partitions if topic is None or key[0] == topic}
    if topic is not None and topic_partitions is not None:
        keys.update((topic, p) for p in range(topic_partitions))
    shared_keys = {key for key in state.shared if topic is None or key[0] == topic}
    keys -= shared_keys  # a shared topic's partitions are never owned whole: listed with their leases instead
    rows = [_partition_row(state, t, p, now_ms) for t, p in sorted(keys)]
    pause = state.paused_until()
    document: dict[str, Any] = {
        "group": state.group,
        "paused_until": pause if pause is not None and pause > now_ms else None,
        "partitions": rows,
    }
    if shared_keys:  # an extension of the document, there only when the group shares partitions
        document["shared"] = [_shared_row(state, t, p, now_ms) for t, p in sorted(shared_keys)]
    # Operators' orders, there only when some are in force.
    drained = state.drained_clients()
    if drained:
        document["drained"] = [{"client": client, "since": at} for client, at in sorted(drained.items())]
    paused_topics = {t: until for t, until in state.paused_topics(now_ms).items() if topic is None or t == topic}
    if paused_topics:
        document["paused_topics"] = [{"topic": t, "until": until} for t, until in sorted(paused_topics.items())]
    return document


def _shared_row(state: WorldState, topic: str, partition: int, now_ms: int) -> dict[str, Any]:
    """A shared partition (docs/shared-partitions.md): its low-water mark, counts and the leases live at ``now_ms``."""
    shared = state.shared[(topic, partition)].as_of(now_ms)  # leases lapsed since the last record are lapsed
    leases = []
    for lease in shared.live_leases(now_ms):
        tries = shared.tries_in(lease.start, lease.end)
        leases.append(
            {
                "client": lease.holder.client,
                "instance": lease.holder.instance,
                "offset": lease.start,
                "end": lease.end,
                "age_s": round((now_ms - lease.claimed_at) / 1000, 3),
                "expires_in_s": round((lease.expires - now_ms) / 1000, 3),
                "deliveries": 1 + max((t.count for t in tries), default=0),
                "amo": lease.amo,
            }
        )
    return {
        "topic": topic,
        "partition": partition,
        "low_water_mark": shared.low,
        "end": shared.high or None,  # as the holders' fetches last saw it
        "done_above_low": sum(stop - start for start, stop in shared.done),
        "acked": shared.acked,
        "dead_letters": shared.dead_letters,
        "lost": shared.lost,
        "lapsed_leases": shared.lapsed,
        "to_retry": sum(t.end - t.start for t in shared.tries),
        "leases": leases,
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
        # The oldest call in flight, as old as it was at the heartbeat (add heartbeat_age_s for now, if it still runs).
        "call_age_s": None if found is None else found.call_age_s,
        "window_used": None if found is None else found.window_used,
    }


_COLUMNS = (
    "TOPIC",
    "PARTITION",
    "STATE",
    "OWNER",
    "OFFSET",
    "HEARTBEAT AGE",
    "LAG",
    "MSGS/S",
    "IN FLIGHT",
    "CALL AGE",
    "WINDOW",
)


def render_table(document: dict[str, Any], now_ms: int) -> str:
    """A table for people: one line per partition, aligned columns."""
    paused = document["paused_until"]
    header = f"group {document['group']}   as of {utc_text(now_ms)}"
    header += f"   PAUSED until {utc_text(paused)}" if paused is not None else ""
    for entry in document.get("paused_topics", []):
        until = "`admin resume --topic`" if entry["until"] >= 2**63 - 1 else utc_text(entry["until"])
        header += f"\ntopic {entry['topic']} PAUSED until {until}"
    for entry in document.get("drained", []):
        header += f"\nclient {entry['client']} DRAINED since {utc_text(entry['since'])}"
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
            "-" if row["call_age_s"] is None else f"{row['call_age_s']:.1f}s",
            "-" if row["window_used"] is None else f"{row['window_used']:.0f}",
        )
        for row in document["partitions"]
    ]
    shared = document.get("shared", [])
    if not rows and not shared:
        return f"{header}\n(no partitions: the coordination log holds no record of this group)"
    lines = [header]
    if rows:
        lines += aligned(_COLUMNS, rows)
        counts = _count_states(document)
        lines.append(", ".join(f"{n} {name}" for name, n in counts.items() if n))
    if shared:
        lines += ["", "shared partitions (range leases)"] + aligned(_SHARED_COLUMNS, [_shared_cells(r) for r in shared])
        leases = [
            (
                row["topic"],
                str(row["partition"]),
                f"{lease['client']}/{lease['instance']}",
                f"{lease['offset']}..{lease['end'] - 1}",
                f"{lease['age_s']:.1f}s",
                f"{lease['expires_in_s']:.1f}s",
                str(lease["deliveries"]),
            )
            for row in shared
            for lease in row["leases"]
        ]
        if leases:
            lines += ["", "leases in flight"] + aligned(_LEASE_COLUMNS, leases)
    return "\n".join(lines)


_SHARED_COLUMNS = (
    "TOPIC",
    "PARTITION",
    "LOW-WATER",
    "END",
    "LEASES",
    "ACKED",
    "DEAD LETTERS",
    "LOST",
    "LAPSED",
    "TO RETRY",
)
_LEASE_COLUMNS = ("TOPIC", "PARTITION", "HOLDER", "OFFSETS", "AGE", "EXPIRES IN", "DELIVERY")


def _shared_cells(row: dict[str, Any]) -> tuple[str, ...]:
    return (
        row["topic"],
        str(row["partition"]),
        "-" if row["low_water_mark"] is None else str(row["low_water_mark"]),
        "-" if row["end"] is None else str(row["end"]),
        str(len(row["leases"])),
        str(row["acked"]),
        str(row["dead_letters"]),
        str(row["lost"]),
        str(row["lapsed_leases"]),
        str(row["to_retry"]),
    )


def aligned(columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A table's lines: the header ``columns`` and the ``rows``, each column as wide as its widest cell."""
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (columns, *rows)]


def _count_states(document: dict[str, Any]) -> dict[str, int]:
    counts = {liveness.value: 0 for liveness in Liveness}
    for row in document["partitions"]:
        counts[row["state"]] += 1
    return counts


def utc_text(ms: int) -> str:
    """A time (ms since epoch) for people: ``2026-11-22 10:00:00 UTC``."""
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (ValueError, OverflowError, OSError):  # any int is valid on the wire, not every int is a date
        return f"{ms} ms since epoch"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_iso(ms: int) -> str:
    """A time (ms since epoch) as ISO 8601 with milliseconds: ``2026-11-22T10:00:00.123Z``."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"
    except (ValueError, OverflowError, OSError):  # any int >= 0 is valid on the wire, not every one is a date
        return f"{ms}ms"
