"""The autoscaling signal (``GET /autoscale``, ``status --autoscale``): how many members a group's backlog needs.

Pure functions over plain data: a dashboard document (dashboard_model.advance: positions from the coordination
log, ends as polled, lag computed there), the positions seen before (a :class:`RateWindow`), the drain target and
``now``.  The shells (autoscale_meter.py) read the log and Kafka; nothing here does.  The answer is JSON that a
KEDA ``metrics-api`` scaler reads at a ``valueLocation`` path (docs/operations.md, "Autoscaling").

The rules, per topic:

- backlog: the messages behind the partitions' ends; whole partitions: end minus the position (the dashboard's
  lag), shared ones: end minus the low-water mark minus what is done above it;
- rate: messages/s the group handled, measured as the positions' progress over the window (a position that went
  back, ``admin set-position``, counts nothing);
- a whole-partition topic runs one process per partition a member holds, so what scales is the members:
  ``workers_wanted = ceil(backlog / (rate per member * target))``, at least 1, at most the partition count (a
  member beyond it would hold nothing);
- a shared topic runs ``processes`` workers per member over range leases, not capped by partitions:
  ``processes_wanted = ceil(backlog / (rate per process * target))`` and
  ``workers_wanted = ceil(processes_wanted / processes per member)``;
- no backlog: 0 wanted (idle; KEDA scales to zero only when its ``minReplicaCount`` is 0);
- a backlog but no measured rate (nobody works it yet, or the window is too short): the members there are now,
  at least 1, so somebody starts and a rate can be measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from marshal_workers.core.durations import parse_duration
from marshal_workers.errors import ConfigError
from marshal_workers.observe.dashboard_model import LIVE
from marshal_workers.observe.status import aligned

Key = tuple[str, int]
RATE_WINDOW_MS = 120_000  # the rate is measured over about this long, once there are samples that old
MIN_SAMPLE_GAP_MS = 1_000  # samples closer than this add nothing (each request samples: bound their number)
MIN_RATE = 1e-6  # messages/s a process or member: below it (one in 11 days) nothing is measured to scale on


class BadQuery(ValueError):
    """A query of ``/autoscale`` that cannot be answered: the 400 error's message."""


def drain_target_of(query: str, default_s: float) -> float:
    """The drain target in seconds: ``?drain_target=30s``, else ``default_s``; anything else is a BadQuery."""
    target = default_s
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise BadQuery(f"not a query string: {query!r}") from None
    for name, value in pairs:
        if name != "drain_target":
            raise BadQuery(f"unknown query parameter {name!r}: the only one is drain_target, e.g. ?drain_target=30s")
        try:
            target = parse_duration(value)
        except ConfigError as exc:
            raise BadQuery(f"drain_target: {exc}") from None
    return target


@dataclass(frozen=True)
class TopicLoad:
    """One topic at one moment: what the formula needs."""

    topic: str
    shared: bool
    partitions: int  # the topic's partitions listed (every one, when the partition count is known)
    backlog: int
    members: int  # members working it now: live owners (whole) or holders of live leases (shared)
    processes: int  # worker processes working it now: partitions owned live, or members * processes per member


@dataclass(frozen=True)
class Wanted:
    workers: int  # members
    processes: int | None  # worker processes in all (shared topics; whole partitions run one per partition)


def wanted(load: TopicLoad, rate: float | None, target_s: float, processes_per_member: int) -> Wanted:
    """How many members (and processes) drain ``load.backlog`` within ``target_s`` at ``rate`` messages/s."""
    if load.backlog <= 0:
        return Wanted(0, 0 if load.shared else None)
    if load.shared:
        processes = _needed(load.backlog, rate, load.processes, target_s)
        if processes is None:
            processes = max(1, load.members) * processes_per_member
        return Wanted(-(-processes // processes_per_member), processes)
    # Whole partitions: a member runs a process per partition it holds, so the member is what is measured.
    members = _needed(load.backlog, rate, load.members, target_s)
    if members is None:
        members = max(1, load.members)
    return Wanted(min(members, max(1, load.partitions)), None)


def _needed(backlog: int, rate: float | None, working: int, target_s: float) -> int | None:
    """How many of the ``working`` units at ``rate`` in all drain ``backlog`` within ``target_s``, at least 1;
    None when nothing measured a rate (none, nobody working, or slower than MIN_RATE: no progress to speak of)."""
    if rate is None or working <= 0 or rate / working < MIN_RATE:
        return None
    return max(1, math.ceil(backlog / (rate / working * target_s)))


def positions(document: Mapping[str, Any]) -> dict[Key, int]:
    """Every partition's position in a dashboard document: the offset of a whole partition, the low-water mark
    plus what is done above it of a shared one (how far the group got: the rate is its progress)."""
    found = {(r["topic"], r["partition"]): r["offset"] for r in document["partitions"] if r["offset"] is not None}
    for row in document.get("shared", []):
        if row["low_water_mark"] is not None:
            found[(row["topic"], row["partition"])] = row["low_water_mark"] + row["done_above_low"]
    return found


def topic_loads(document: Mapping[str, Any], processes_per_member: int) -> list[TopicLoad]:
    """Each topic of a dashboard document, with its backlog and who works it now."""
    loads = []
    whole = _by_topic(document["partitions"])
    for topic, rows in sorted(whole.items()):
        live = [r for r in rows if r["state"] in LIVE]
        backlog = sum(r["lag"] for r in rows if r["lag"] is not None)
        loads.append(TopicLoad(topic, False, len(rows), int(backlog), len({r["owner"] for r in live}), len(live)))
    for topic, rows in sorted(_by_topic(document.get("shared", [])).items()):
        holders = {(lease["client"], lease["instance"]) for r in rows for lease in r["leases"]}
        backlog = sum(_shared_backlog(r) for r in rows)
        loads.append(TopicLoad(topic, True, len(rows), backlog, len(holders), len(holders) * processes_per_member))
    return loads


def _shared_backlog(row: Mapping[str, Any]) -> int:
    """What is not done below a shared partition's end: the ends polled, else as its holders last saw it."""
    ends = [e for e in (row["end"], row.get("high_watermark")) if e is not None]
    if row["low_water_mark"] is None or not ends:
        return 0  # never claimed: the group starts where its first claim does, so nothing is behind yet
    return max(0, max(ends) - row["low_water_mark"] - row["done_above_low"])


def _by_topic(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        found.setdefault(row["topic"], []).append(row)
    return found


@dataclass(frozen=True)
class Sample:
    at_ms: int
    positions: Mapping[Key, int]


@dataclass(frozen=True)
class RateWindow:
    """Positions seen over about RATE_WINDOW_MS, oldest first: the rates are their progress."""

    samples: tuple[Sample, ...] = ()
    window_ms: int = RATE_WINDOW_MS
    min_span_ms: int = 0  # a span shorter than this measures no rate (whole partitions move at heartbeats: HB)

    def observe(self, now_ms: int, seen: Mapping[Key, int]) -> RateWindow:
        """The window with the positions ``seen`` at ``now_ms``; samples older than the window dropped, but the
        newest of those is kept, so the span reaches the window's length."""
        if self.samples and now_ms - self.samples[-1].at_ms < MIN_SAMPLE_GAP_MS:
            return self
        samples = [*self.samples, Sample(now_ms, dict(seen))]
        while len(samples) > 2 and samples[1].at_ms <= now_ms - self.window_ms:
            samples.pop(0)
        return RateWindow(tuple(samples), self.window_ms, self.min_span_ms)

    def rates(self) -> dict[str, float]:
        """Messages/s per topic: the sum of its partitions' progress from the oldest sample that holds each to
        the newest, over that span.  A partition seen for less than ``min_span_ms`` counts nothing yet; a topic
        none of whose partitions count has no rate."""
        if not self.samples:
            return {}
        last = self.samples[-1]
        found: dict[str, float] = {}
        for key, position in last.positions.items():
            first = next(s for s in self.samples if key in s.positions)  # the last sample holds it at least
            span_ms = last.at_ms - first.at_ms
            if span_ms > 0 and span_ms >= self.min_span_ms:
                # A position that went back (set-position) says nothing about the rate.
                moved = max(0, position - first.positions[key])
                found[key[0]] = found.get(key[0], 0.0) + moved * 1000 / span_ms
        return found


def answer(
    document: Mapping[str, Any], window: RateWindow, target_s: float, processes_per_member: int
) -> dict[str, Any]:
    """The ``/autoscale`` JSON: per topic its backlog, rate and wanted members; at the top the most any topic
    wants (every member runs every handler of the app)."""
    rates = window.rates()
    topics = {}
    for load in topic_loads(document, processes_per_member):
        rate = rates.get(load.topic)
        want = wanted(load, rate, target_s, processes_per_member)
        entry: dict[str, Any] = {
            "mode": "shared" if load.shared else "partitions",
            "partitions": load.partitions,
            "backlog": load.backlog,
            "rate": None if rate is None else round(rate, 1),
            "rate_per_process": None if not rate or not load.processes else round(rate / load.processes, 1),
            "members": load.members,
            "processes": load.processes,
            "workers_wanted": want.workers,
        }
        if load.shared:  # the processes of whole partitions follow the partitions: one per partition held
            entry["processes_per_member"] = processes_per_member
            entry["processes_wanted"] = want.processes
        topics[load.topic] = entry
    return {
        "group": document["group"],
        "as_of_ms": document["now_ms"],
        "drain_target_s": target_s,
        "backlog": sum(t["backlog"] for t in topics.values()),
        "workers_wanted": max((t["workers_wanted"] for t in topics.values()), default=0),
        "topics": topics,
    }


_COLUMNS = ("TOPIC", "MODE", "PARTITIONS", "BACKLOG", "MSGS/S", "MEMBERS", "PROCESSES", "WANTED", "PROCESSES WANTED")


def render_autoscale(found: Mapping[str, Any]) -> str:
    """``status --autoscale`` for people: a line per topic."""
    header = (
        f"group {found['group']}: {found['workers_wanted']} members wanted to drain {found['backlog']} messages "
        f"within {found['drain_target_s']:g}s"
    )
    rows = [
        (
            topic,
            entry["mode"],
            str(entry["partitions"]),
            str(entry["backlog"]),
            "-" if entry["rate"] is None else f"{entry['rate']:.1f}",
            str(entry["members"]),
            str(entry["processes"]),
            str(entry["workers_wanted"]),
            str(entry.get("processes_wanted", "-")),
        )
        for topic, entry in found["topics"].items()
    ]
    return "\n".join([header, *aligned(_COLUMNS, rows)])
