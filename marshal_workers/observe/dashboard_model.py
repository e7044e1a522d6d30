"""The live dashboard's document: pure functions over a WorldState, ``now`` and what the shell polled.

The shell (``dashboard.py``, or the supervisor's metrics server) reads the log and Kafka and calls
:func:`advance` about once a second; everything here is plain data in, plain data out, so the rules
(rates never negative, a hand-over only when the live owner changes, the gap it left) are unit- and
property-tested without a broker.  The document is JSON-able: the page renders it as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marshal_workers.observe.status import status_document
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import Liveness

Key = tuple[str, int]
MAX_HAND_OVERS = 50  # the page shows the recent ones; older ones are in the coordination log (``log``, ``audit``)
# A partition is owned "live" while its owner may still act on it: the states in which nobody else may claim it.
LIVE = frozenset({Liveness.FRESH.value, Liveness.UNKNOWN.value})


@dataclass(frozen=True)
class HandOver:
    """A partition moved from one live owner to another; ``gap_ms``: how long it had no live owner between."""

    topic: str
    partition: int
    from_owner: str  # client/instance
    to_owner: str
    at_ms: int  # when the new owner was first seen
    gap_ms: int


@dataclass(frozen=True)
class HandOverTracker:
    """Fed successive maps of live owners with their times, it emits hand-overs.

    Times are those of the observations, so a gap is measured to the update interval (about a second).  The
    first observation only sets the baseline: a dashboard started after a hand-over does not invent one.
    """

    last_owner: Mapping[Key, str] = field(default_factory=dict)  # the last live owner seen, kept while ownerless
    ownerless_since: Mapping[Key, int] = field(default_factory=dict)  # first observation without a live owner
    recent: tuple[HandOver, ...] = ()  # newest first, at most MAX_HAND_OVERS
    started: bool = False

    def observe(self, owners: Mapping[Key, str | None], now_ms: int) -> HandOverTracker:
        """The tracker after seeing ``owners`` (partition -> live owner, or None) at ``now_ms``."""
        last = dict(self.last_owner)
        since = dict(self.ownerless_since)
        new: list[HandOver] = []
        for key in sorted(owners):
            owner, previous = owners[key], last.get(key)
            if owner is None:
                if previous is not None:
                    since.setdefault(key, now_ms)
                continue
            if self.started and previous is not None and owner != previous:
                gap = max(0, now_ms - since.get(key, now_ms))
                new.append(HandOver(key[0], key[1], previous, owner, now_ms, gap))
            last[key] = owner
            since.pop(key, None)
        recent = (tuple(reversed(new)) + self.recent)[:MAX_HAND_OVERS]
        return HandOverTracker(last, since, recent, started=True)


def live_owners(document: Mapping[str, Any]) -> dict[Key, str | None]:
    """partition -> its live owner (client/instance) in a status document's rows, or None."""
    return {
        (row["topic"], row["partition"]): f"{row['client']}/{row['instance']}" if row["state"] in LIVE else None
        for row in document["partitions"]
    }


@dataclass(frozen=True)
class Dashboard:
    """The model's state between updates: the last document (for rates) and the hand-over tracker."""

    document: Mapping[str, Any] | None = None
    hand_overs: HandOverTracker = field(default_factory=HandOverTracker)


def advance(
    dashboard: Dashboard,
    state: WorldState,
    now_ms: int,
    high_watermarks: Mapping[Key, int] | None = None,
    topic_partitions: Mapping[str, int] | None = None,
    dead_letters: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    dead_letters_at_ms: int | None = None,
) -> Dashboard:
    """The next dashboard: a new document built from ``state`` at ``now_ms``.

    ``high_watermarks``: each partition's end as last polled (lag is end minus offset; without it, the lag
    the owner put in its heartbeat).  ``topic_partitions``: partition counts, so partitions no record
    mentions show as unclaimed.  ``dead_letters``: ``dead_letter_reader.summary`` rows by dead-letter topic, polled less
    often than this is called.
    """
    status = _status(state, now_ms, topic_partitions or {})
    tracker = dashboard.hand_overs.observe(live_owners(status), now_ms)
    previous = dashboard.document
    previous_rows = {} if previous is None else {(r["topic"], r["partition"]): r for r in previous["partitions"]}
    rows = [
        _partition_row(row, state, high_watermarks or {}, previous_rows.get((row["topic"], row["partition"])))
        for row in status["partitions"]
    ]
    document = {
        "group": state.group,
        "now_ms": now_ms,
        "heartbeat_ms": state.heartbeat_ms,
        "partitions": rows,
        "members": members(state, now_ms),
        "hand_overs": [dataclasses.asdict(h) for h in tracker.recent],
        "pauses": pauses(state, status),
        "shared": [_shared_row(row, high_watermarks or {}) for row in status.get("shared", [])],
        "dead_letters": {
            "as_of_ms": dead_letters_at_ms,
            "topics": {topic: list(found) for topic, found in sorted((dead_letters or {}).items())},
        },
        "totals": _totals(rows),
    }
    return Dashboard(document, tracker)


def _status(state: WorldState, now_ms: int, topic_partitions: Mapping[str, int]) -> dict[str, Any]:
    """The ``status`` document over every topic, with the unclaimed partitions of the topics we know the size of."""
    document = status_document(state, now_ms)
    listed = {(r["topic"], r["partition"]) for r in document["partitions"]}
    listed |= {(s["topic"], s["partition"]) for s in document.get("shared", [])}
    for topic, count in sorted(topic_partitions.items()):
        rows = status_document(state, now_ms, topic, count)["partitions"]
        document["partitions"] += [r for r in rows if (r["topic"], r["partition"]) not in listed]
    document["partitions"].sort(key=lambda r: (r["topic"], r["partition"]))
    return document


def _partition_row(
    row: Mapping[str, Any], state: WorldState, highs: Mapping[Key, int], previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    key = (row["topic"], row["partition"])
    found = state.get(*key)
    offset = row["offset"]
    offset_at = None if found is None or offset is None else found.last_ts  # the record that last set it
    high = highs.get(key)
    # The end was polled at another moment than the offset was reported: never show a negative lag.
    lag = row["lag"] if high is None or offset is None else max(0, high - offset)
    return {
        "topic": row["topic"],
        "partition": row["partition"],
        "state": row["state"],
        "owner": None if row["client"] is None else f"{row['client']}/{row['instance']}",
        "client": row["client"],
        "instance": row["instance"],
        "offset": offset,
        "offset_at_ms": offset_at,
        "high_watermark": high,
        "lag": lag,
        "rate": rate(offset, offset_at, row["state"], previous),
        "heartbeat_age_s": row["heartbeat_age_s"],
    }


def _shared_row(row: Mapping[str, Any], highs: Mapping[Key, int]) -> dict[str, Any]:
    """A shared partition as ``status`` shows it, with its end as last polled (``end`` is as its holders saw it)."""
    return {**row, "high_watermark": highs.get((row["topic"], row["partition"]))}


def rate(offset: int | None, offset_at: int | None, liveness: str, previous: Mapping[str, Any] | None) -> float | None:
    """Messages/s between the offsets of two heartbeats (their record times), never negative.

    Offsets change only at heartbeats (every HB/2), not at each update: between two, the last rate stands
    while the partition is owned live.  An offset that went back (``admin set-position``) gives no rate.
    """
    if offset is None or offset_at is None or previous is None:
        return None
    before, before_at = previous.get("offset"), previous.get("offset_at_ms")
    if before is None or before_at is None:
        return None
    if offset_at == before_at:
        return previous.get("rate") if liveness in LIVE else None
    elapsed_ms = offset_at - before_at
    if elapsed_ms <= 0 or offset < before:
        return None
    return round((offset - before) * 1000 / elapsed_ms, 1)


def members(state: WorldState, now_ms: int) -> list[dict[str, Any]]:
    """The live members: what each holds and when it was last heard from (its latest heartbeat or claim)."""
    holdings = state.holdings(now_ms)
    drained = state.drained_clients()
    rows = []
    for owner in sorted(state.live_members(now_ms)):
        held = holdings.get(owner, [])
        heard = [state.partitions[key].last_ts for key in held]
        if owner.instance in state.last_claim:
            heard.append(state.last_claim[owner.instance])
        rows.append(
            {
                "client": owner.client,
                "instance": owner.instance,
                "partitions": len(held),
                "heartbeat_age_s": round((now_ms - max(heard)) / 1000, 3) if heard else None,
                "drained": owner.client in drained,
            }
        )
    return rows


def pauses(state: WorldState, status: Mapping[str, Any]) -> dict[str, Any]:
    """The group pause, the paused topics (topic -> until, ms) and the drained clients, as ``status`` shows them."""
    return {
        "group_paused_until": status["paused_until"],
        "topics": {entry["topic"]: entry["until"] for entry in status.get("paused_topics", [])},
        "drained": [entry["client"] for entry in status.get("drained", [])],
    }


def _totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    counts = {liveness.value: 0 for liveness in Liveness}
    for row in rows:
        counts[row["state"]] += 1
    return {
        "states": counts,
        "lag": sum(row["lag"] for row in rows if row["lag"] is not None),
        "rate": round(sum(row["rate"] for row in rows if row["rate"] is not None), 1),
    }
