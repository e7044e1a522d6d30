"""Every Kafka client's settings, by profile: how each client of the project talks to Kafka, and why.

A profile is a pure function from the Settings (and what only its caller has: a callback, a purpose) to the
librdkafka configuration of one kind of client; the caller makes the client.  Each starts from
:func:`client_config`: the brokers, our client id, librdkafka's log into Python logging, and the user's passthrough
for that kind of client (Settings.kafka_for).  The profile's own settings come last and win over the passthrough:
the protocol depends on them (a writer that is idempotent, a reader that never commits).  docs/brokers.md
("Kafka clients") has the table: each profile, who uses it, its key settings and why.

tests/unit/kafka/test_client_profiles.py checks each profile and that every client the package makes takes its
settings from here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from marshal_workers.core.config import Settings
from marshal_workers.core.repeated_lines import RepeatedLines

librdkafka_log = logging.getLogger("marshal_workers.librdkafka")
# With the broker gone librdkafka logs every reconnect attempt, about 20 a second per client: one line of a kind per
# 10 s, saying how many more there were (core/repeated_lines.py).
librdkafka_log.addFilter(RepeatedLines(window_s=10.0))

# librdkafka's statistics of the coordination writer (batches and records sent): often enough for a scrape's rate,
# rare enough that parsing them costs nothing.
STATISTICS_INTERVAL_MS = 5000


def client_config(settings: Settings, role: str, **overrides: Any) -> dict[str, Any]:
    """The librdkafka settings of a ``consumer``, ``producer`` or ``admin`` client: brokers, client id, the user's
    passthrough for that kind of client (Settings.kafka_for), then overrides."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.brokers,
        "client.id": f"marshal-workers-{settings.client_id}",
        # librdkafka's own log lines go to Python logging instead of raw stderr.
        "logger": librdkafka_log,
        # Connection errors are reported by our own deadlines, with a message that says what to do.
        "error_cb": _log_client_error,
    }
    config.update(settings.kafka_for(role))
    config.update(overrides)
    return config


def _log_client_error(error: KafkaError) -> None:
    librdkafka_log.debug("kafka client error: %s", error)


# ------------------------------------------------------------------ the coordination log (docs/protocol.md)


def coordination_writer(settings: Settings, on_statistics: Callable[[str], None]) -> dict[str, Any]:
    """The coordinator's producer of coordination records; ``on_statistics`` gets librdkafka's statistics."""
    return _idempotent_producer(settings) | {
        # A record leaves at once: a claim or heartbeat waits for its own confirmation (docs/protocol.md), and the
        # records of one pass of the loop are produced together anyway (in_flight.py).
        "linger.ms": 0,
        # A write that cannot be delivered fails within the write timeout instead of retrying forever.
        "message.timeout.ms": int(settings.write_timeout * 1000),
        # The records, batches and produce requests it sent: the coordination traffic metrics.
        "statistics.interval.ms": STATISTICS_INTERVAL_MS,
        "stats_cb": on_statistics,
    }


def coordination_reader(settings: Settings, purpose: str) -> dict[str, Any]:
    """A reader of the coordination log (a member's tail, ``status``, ``log``, the dashboard): ``purpose`` names
    its throwaway group."""
    return _reader(settings, purpose.replace(" ", "-")) | tail_tuning(settings)


def tail_tuning(settings: Settings) -> dict[str, Any]:
    """How a coordination log reader fetches (librdkafka settings; measured by bench_coordination_tail.py)."""
    return {
        # Kafka answers a waiting fetch as soon as a record arrives: there the wait costs no latency, and the
        # longer it is the fewer empty fetches an idle member makes.  Tansu lists the partitions again after half
        # of the remaining wait (0, W/2, 3W/4, ...) until a record is there or the wait is over: another member's
        # record is seen at most W/2 late, and an idle member costs it a listing per halving, 5 or more per wait.
        # At the default 50 ms an idle supervisor costs the embedded broker 0.05 CPU-s a second, against 0.10 at
        # 5 ms (bench_idle_member.py, docs/brokers.md), and a partition can hold ten times more batches before its
        # listing runs out of time (guarded_consumer.py).  A member's own records are folded from their delivery reports
        # once the tail has read what came before them, so only another member's record just before one of ours
        # can hold up a verdict.
        "fetch.wait.max.ms": max(1, round(settings.coordination_fetch_wait * 1000)),
        # After a fetch that brought records the next waits 5 ms (one record queued, not yet folded, is enough to
        # hold it back): a log written hundreds of times a second is fetched about 200 times a second, in fetches
        # of several records, not once per record. On the embedded broker each fetch cost about 0.4 ms of its CPU
        # and slowed the writes beside it (docs/http-service.md, "Performance").
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": 5,
    }


# ------------------------------------------------------------------ the readers of users' topics


def worker_consumer(settings: Settings) -> dict[str, Any]:
    """A worker's reader of its one partition, from its start offset on (runtime/worker/worker.py)."""
    return client_config(
        settings,
        "consumer",
        **{
            # The user's group: the committed offsets the supervisor keeps as a backup are its.  Never joined.
            "group.id": settings.require_group(),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Where to go if the resume offset is gone (retention deleted it): the user's choice, not
            # librdkafka's default ("latest"), which would skip a whole backlog.
            "auto.offset.reset": settings.auto_offset_reset,
            # librdkafka waits fetch.queue.backoff.ms (1000 ms by default in 2.x) before refilling its queue
            # once queued.min.messages is reached, which caps a fast consumer near 20k msgs/s.
            "fetch.queue.backoff.ms": 10,
            "fetch.wait.max.ms": 100,
            # One partition per consumer: 64 MB of read-ahead (the default) is memory, not speed.
            "queued.max.messages.kbytes": 16384,
        },
    )


def shared_consumer(settings: Settings) -> dict[str, Any]:
    """A shared worker's reader of the ranges it is handed, here and there in the topic's partitions
    (runtime/worker/shared_worker.py, docs/shared-partitions.md).  It differs from a worker's where a range reader
    differs from a partition reader: the end of a range, the wait at a new place, the read-ahead."""
    return client_config(
        settings,
        "consumer",
        **{
            "group.id": settings.require_group(),  # never joined: ranges are assigned by hand
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,  # a range that ends in offsets with no message (markers) ends there
            # A leased offset that retention deleted: go on from the oldest.  Not the user's auto_offset_reset:
            # a lease is offsets to handle, and "latest" would skip the rest of the partition, not of the range.
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10,  # as a worker's (worker_consumer)
            # A worker moves from range to range: a fetch in flight at the old position delays the first fetch
            # at the new one by up to this (100 ms made a range switch cost 105 ms; 10 ms, 15 ms).  An idle
            # worker unassigns, so only workers with ranges to read poll the broker this often.
            "fetch.wait.max.ms": 10,
            # A worker reads short ranges here and there: a small read-ahead, not 64 MB of it.  1 MB, not 4: a worker
            # that moves waits for the first fetch at its new place, and that took twice as long at 4 MB (10,000
            # messages read after an assign in 9-33 ms against 33-158 ms, embedded broker), while reading on ran as
            # fast (1.8M messages/s, without a handler).
            "queued.max.messages.kbytes": 1024,
        },
    )


def served_topic_consumer(settings: Settings) -> dict[str, Any]:
    """The HTTP service's reader of a served topic's leased ranges (http/range_reader.py): a shared worker's, for
    the same reasons (it reads ranges, assigned by hand, and needs to know where a range ends in no message)."""
    return shared_consumer(settings)


def split_reader(settings: Settings) -> dict[str, Any]:
    """A Spark task's reader of one split of a topic, from its start to its planned end (spark/split_reader.py)."""
    # Partition-end events tell a split whose last offsets are gone; offsets deleted by retention since
    # the plan start it at what is left (it counts fewer records).
    return _reader(settings, "split") | {
        # As a worker's (worker_consumer): librdkafka's defaults throttle a fast consumer.
        "fetch.queue.backoff.ms": 10,
        "fetch.wait.max.ms": 100,
        # librdkafka's default read-ahead, not a worker's 16 MB: a split is read once, start to end, by a task that
        # holds nothing else, and lives only as long as that read.  (Not measured against 16 MB yet:
        # tests/benchmarks has no Spark read benchmark.)
        "queued.max.messages.kbytes": 65536,
    }


def position_reader(settings: Settings) -> dict[str, Any]:
    """A look-up of positions (kafka/partition_positions.py: bounds, offsets for a time, first records)."""
    # Its reader catches up first (guarded_consumer.catch_up_wait_ms), reading only records that are there; once it
    # tails, the embedded broker holds a fetch that finds nothing for its whole wait, so a probe past a partition's
    # end costs that wait: a short one.
    return _reader(settings, "positions") | {"fetch.wait.max.ms": 10}


def demo_view(settings: Settings) -> dict[str, Any]:
    """The demo's view of its topic's ends, from fetch responses at the end (ops/demo.py)."""
    return _reader(settings, "demo-view")


def _reader(settings: Settings, purpose: str) -> dict[str, Any]:
    """A consumer that only assign()s and reads: a private group id (never joined, never committed, so reading
    moves nobody's position), partition-end events on, and the log's start where an asked-for offset is gone."""
    return client_config(
        settings,
        "consumer",
        **{
            "group.id": f"marshal-workers-{purpose}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        },
    )


# ------------------------------------------------------------------ committed offsets


def offset_keeper(settings: Settings, on_commit: Callable[[KafkaError | None, list[Any]], None]) -> dict[str, Any]:
    """The supervisor's client of the group's committed offsets (kafka/committed_offsets.py): it reads them (where a partition
    never claimed starts) and commits progress as a backup of the coordination log; ``on_commit`` hears how each
    commit went."""
    return client_config(
        settings,
        "consumer",
        **{
            # The user's group, so that Kafka's tools show its progress; never joined (no subscribe), only commits.
            "group.id": settings.require_group(),
            "enable.auto.commit": False,  # it commits what the coordination log says is done, nothing else
            "enable.auto.offset.store": False,
            "on_commit": on_commit,
        },
    )


# ------------------------------------------------------------------ producers of users' topics


def output_producer(settings: Settings) -> dict[str, Any]:
    """A worker's producer of what its handlers send (``app.send``, kafka/outbox.py)."""
    return _idempotent_producer(settings)


def dead_letter_producer(settings: Settings) -> dict[str, Any]:
    """A worker's producer of dead letters (kafka/dead_letter_writer.py)."""
    return _idempotent_producer(settings)


def redrive_producer(settings: Settings) -> dict[str, Any]:
    """``dlq redrive``'s producer, which sends dead letters back to their topics (ops/dlq.py)."""
    return _idempotent_producer(settings)


def _idempotent_producer(settings: Settings) -> dict[str, Any]:
    """A producer whose every confirmed record is on all in-sync replicas (``acks=all``), once and in order, even
    when librdkafka retries (idempotence): a message handled is reported done only once what it sent is confirmed,
    and a retried send must not write it twice nor out of order."""
    return client_config(settings, "producer", **{"acks": "all", "enable.idempotence": True})


def demo_producer(settings: Settings) -> dict[str, Any]:
    """The demo's producer of its steady stream of orders (ops/demo.py): a user's producer, not one of ours."""
    # A few ms of batching, as a real producer of a steady stream would: fewer, fuller batches for the broker.
    return client_config(settings, "producer", **{"linger.ms": 20})


# ------------------------------------------------------------------ admin


def admin(settings: Settings) -> dict[str, Any]:
    """An admin client (metadata, topic creation, ListOffsets; kafka/kafka_clients.py, kafka/committed_offsets.py)."""
    return client_config(settings, "admin")


def broker_probe(bootstrap: str) -> dict[str, Any]:
    """The embedded broker's readiness probe (kafka/embedded_broker.py): before any Settings, only its address."""
    return {"bootstrap.servers": bootstrap, "logger": librdkafka_log}
