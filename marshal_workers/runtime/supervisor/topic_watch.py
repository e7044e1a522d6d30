"""The handlers' topics as the cluster tells them: their partition counts, and the coordination topic's.

At start-up the metadata is read in the loop's thread (a topic missing stops
the start-up with UnknownTopicError); later, every max(2*HB, 5s), on a thread
of its own, since a metadata request waits for a broker that does not answer
(kafka/metadata_refresh.py).
New partitions of a topic go in the Table's partition counts, where the
claims find them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.core.stopping import ShouldStop, never
from marshal_workers.errors import UnknownTopicError
from marshal_workers.handlers.app import App, OnError
from marshal_workers.kafka.kafka_clients import cluster_metadata, ensure_topic
from marshal_workers.kafka.metadata_refresh import MetadataRefresh
from marshal_workers.runtime.supervisor.assignments import Table


class TopicWatch:
    """The supervisor's component that keeps the handlers' partition counts up to date (component.py's interface)."""

    def __init__(
        self,
        table: Table,
        app: App,
        settings: Settings,
        admin: AdminClient,
        coordination_partitions: int,
        log: Any,
        fail: Callable[[int], None],
        should_stop: ShouldStop = never,
    ) -> None:
        """``coordination_partitions``: the coordination topic's partition count when we started;
        ``fail(exit_code)``: stop the supervisor with that code."""
        self.table = table
        self.app = app
        self.settings = settings
        self.admin = admin
        self.coordination_partitions = coordination_partitions
        self.log = log
        self._fail = fail
        self._should_stop = should_stop
        self._refresh = MetadataRefresh(admin, settings, log)

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        metadata = self._refresh.poll(now)
        if metadata is not None:
            self.apply(metadata)

    def begin_stop(self) -> None:
        """Nothing: counts still change as the cluster says, but nothing more is claimed."""

    def stopped(self) -> bool:
        return True  # a refresh under way is abandoned at close()

    def first_look(self, metadata: Any = None) -> None:
        """At start-up, in the loop's thread: every handler's topic must exist (UnknownTopicError), and each DLQ
        topic is created if missing.  ``metadata``: the cluster's, asked for moments ago (by the coordinator's reader:
        Coordinator.take_first_metadata), which saves a round trip; asked again if a handler's topic is not in it (made
        since, or really missing)."""
        if metadata is None or any(topic not in metadata.topics for topic in self.app.topics):
            metadata = cluster_metadata(self.admin, self.settings, self._should_stop)
        self.apply(metadata, first=True)

    def close(self) -> None:
        self._refresh.close()

    def apply(self, metadata: Any, first: bool = False) -> None:
        """Take the partition counts from ``metadata`` (ClusterMetadata); stop if the coordination topic's changed."""
        self._check_coordination_partitions(metadata)
        for topic in self.app.topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                if first:
                    raise UnknownTopicError(
                        f"handler topic {topic!r} does not exist on {self.settings.brokers}; create it "
                        "(marshal-workers topics create MODULE:APP --partitions N), or remove its handler"
                    )
                self.log.error("topic %s has disappeared from the cluster", topic)
                continue
            count = len(found.partitions)
            shared = self.app.handlers[topic].shared
            counts = self.table.shared_partition_counts if shared else self.table.partition_counts
            if topic in counts and count != counts[topic]:
                self.log.info("topic %s now has %d partitions (was %d)", topic, count, counts[topic])
            counts[topic] = count
            if first and self.app.handlers[topic].on_error is OnError.DLQ:
                dlq_topic = self.app.handlers[topic].dlq_topic
                ensure_topic(
                    self.admin, self.settings, dlq_topic, count, should_stop=self._should_stop, metadata=metadata
                )

    def _check_coordination_partitions(self, metadata: Any) -> None:
        """Routing is md5(topic) mod the coordination topic's partition count: if the count changed, members
        started before and after the change write about a topic to different logs.  Stop rather than split."""
        found = metadata.topics.get(self.settings.coordination_topic)
        count = None if found is None or found.error is not None else len(found.partitions)
        if count is None or count == self.coordination_partitions or not self.table.running:
            return
        self.log.error(
            "the coordination topic %s now has %d partitions (it had %d when we started): members would route "
            "records differently; stopping. Restart every member of the group together.",
            self.settings.coordination_topic,
            count,
            self.coordination_partitions,
        )
        self._fail(ExitCode.COORDINATION_ERROR)
