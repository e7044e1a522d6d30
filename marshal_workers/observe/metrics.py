"""What a supervisor counts and reports for its metrics (``--metrics-port``), as plain data.

The supervisor hands the metrics server (metrics_server.py) a function that returns a :class:`Snapshot`: its
:class:`Counters` and, per partition, what the worker's slot and the health monitor say.  Kept apart from the server
so that a supervisor without a metrics port (the default) never imports prometheus_client or http.server: with the
other modules only a metrics port needs, 37 ms of the CPU its imports took (215 -> 178 ms, median of 15).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """Events counted by the supervisor's main loop (the only writer)."""

    claims_accepted: int = 0
    claims_refused: int = 0
    asks: int = 0  # balance: claims of another member's partition, to be seen asking (refused)
    releases: collections.Counter[str] = field(default_factory=collections.Counter)  # by reason
    heartbeat_failures: int = 0  # heartbeat writes not confirmed
    # release writes not confirmed: the partition goes to the next owner when its lease runs out (2*HB), from its
    # last confirmed position, so what was handled since is handled again
    release_failures: int = 0
    partitions_lost: int = 0  # taken over by another member while we held them
    # Workers restarted, by reason: crash, lifecycle (a limit), time_limit, poison (a message dead-lettered as
    # WorkerLost), lost_claim.
    worker_restarts: collections.Counter[str] = field(default_factory=collections.Counter)
    time_limit_kills: int = 0
    message_claims_unconfirmed: int = 0  # AMO batch claims Kafka did not confirm within an HB
    # What became of failed handler calls, as workers report it (handler_outcomes.py).
    handler_errors: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # topic, type
    handler_retries: collections.Counter[str] = field(default_factory=collections.Counter)  # by topic
    handler_outcomes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # topic, what

    def add_outcomes(self, topic: str, counts: dict[str, Any]) -> None:
        """A worker's report of its failed calls (handler_outcomes.OutcomeCounts.take); anything malformed is
        dropped (it comes from a process running user code)."""
        try:
            errors = {str(name): int(n) for name, n in dict(counts.get("errors", {})).items()}
            retries, ignored, rejected, too_old, other_group = (
                int(counts.get(k, 0)) for k in ("retries", "ignored", "rejected", "too_old", "other_group")
            )
        except (TypeError, ValueError, AttributeError):
            return
        for name, n in errors.items():
            self.handler_errors[(topic, name)] += max(n, 0)
        self.handler_retries[topic] += max(retries, 0)
        self.handler_outcomes[(topic, "ignored")] += max(ignored, 0)
        self.handler_outcomes[(topic, "rejected")] += max(rejected, 0)
        if too_old:  # only handlers with max_age have this outcome
            self.handler_outcomes[(topic, "too_old")] += max(too_old, 0)
        if other_group:  # only topics with messages redriven for another group (dlq redrive) have this one
            self.handler_outcomes[(topic, "other_group")] += max(other_group, 0)


@dataclass(frozen=True)
class PartitionStats:
    topic: str
    partition: int
    next_offset: int
    high_watermark: int | None
    lag: int | None  # None while the end is not known
    messages_per_second: float | None
    handled: int
    dead_lettered: int
    latency_counts: list[int]  # per bucket of LATENCY_BOUNDS, then +Inf; not cumulative
    latency_sum_s: float
    in_flight: int = 0  # handler calls running now (one at most without concurrency)
    window_used: int = 0  # offsets from the lowest unfinished message to the furthest fetched one
    call_age_s: float = 0.0  # how long the oldest handler call in flight has been running (0: none)
    fetch_stalls: int = 0  # times the worker's fetches stalled and were read again with a longer wait


@dataclass(frozen=True)
class SharedStats:
    """One shared handler's topic (shared_pool): what this supervisor's workers did, and the log's view."""

    topic: str
    leases_held: int
    workers: int
    ranges: dict[str, int]  # by result: claimed, refused, acked, ack_refused, cancelled, abandoned
    messages: dict[str, int]  # by outcome: handled, failed, dead_lettered
    worker_restarts: int
    low_water_marks: dict[int, int]  # partition -> low-water mark in the log
    lost: dict[int, int]  # partition -> offsets lost (at most once) in the log


@dataclass(frozen=True)
class Snapshot:
    group: str
    partitions: list[PartitionStats]
    counters: Counters
    garbage_records: int  # coordination records that did not decode
    shared: list[SharedStats] = field(default_factory=list)
    coordination_fetch_stalls: int = 0  # times the log's reader stalled and read again with a longer wait
    # What the coordinator's producer sent (librdkafka's statistics, Coordinator.traffic): coordination records,
    # the produce batches that carried them, and the produce requests that carried those.
    coordination_records: int = 0
    coordination_batches: int = 0
    coordination_produce_requests: int = 0


@dataclass(frozen=True)
class Probes:
    """What the probes answer (the supervisor's methods; called from the server's threads, so they only read).

    ``health`` and ``ready`` return (ok, details); ``state`` the SIGUSR1 document.  None of them touches Kafka.
    """

    health: Callable[[], tuple[bool, dict[str, Any]]]
    ready: Callable[[], tuple[bool, dict[str, Any]]]
    state: Callable[[], dict[str, Any]]
