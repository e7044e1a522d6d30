"""Cluster metadata asked again now and then, without blocking the loop that wants it.

A metadata request waits for a broker that does not answer (up to the connect timeout), so each is made on a
thread of its own and its answer taken by the loop's next pass.  The supervisor's topic watch follows the handlers'
partition counts with it, and ``serve`` its topic's: a topic may gain partitions, or be deleted and created again.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from confluent_kafka.admin import AdminClient

from marshal_workers.core.config import Settings
from marshal_workers.kafka.kafka_clients import cluster_metadata


def refresh_interval(settings: Settings) -> float:
    """Seconds between two looks: a change is seen within two heartbeats, and a quiet cluster asked rarely."""
    return max(2 * settings.heartbeat_interval, 5.0)


class MetadataRefresh:
    """``poll(now)`` asks for the cluster's metadata when a look is due and returns an answer once it has come
    (ClusterMetadata), else None.  A failed look is logged and tried again at the next one."""

    def __init__(
        self, admin: AdminClient, settings: Settings, log: logging.Logger | logging.LoggerAdapter[Any]
    ) -> None:
        self.admin = admin
        self.settings = settings
        self.interval = refresh_interval(settings)
        self.log = log
        self._next = 0.0  # monotonic
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata")
        self._asked: concurrent.futures.Future[Any] | None = None  # a look under way

    def poll(self, now: float) -> Any | None:
        """The answer of the latest look if it came since the last poll; asks again when due (``now``:
        monotonic; the first look at once)."""
        if now >= self._next:
            self._next = now + self.interval
            if self._asked is None:
                self._asked = self._pool.submit(cluster_metadata, self.admin, self.settings)
        if self._asked is None or not self._asked.done():
            return None
        future, self._asked = self._asked, None
        try:
            return future.result()
        except Exception as exc:  # noqa: BLE001 - KafkaUnavailable or a client error: the next look tries again
            self.log.warning("could not refresh topic metadata: %s", exc)
            return None

    def close(self) -> None:
        """A look under way is abandoned (its thread ends when the request does)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def followed_partition_count(
    metadata: Any, topic: str, known: int, log: logging.Logger | logging.LoggerAdapter[Any]
) -> int:
    """``topic``'s partition count in ``metadata`` (an answer of MetadataRefresh.poll), a change from ``known``
    logged; ``known`` if the topic is missing (logged: nothing to serve until it is created again)."""
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        log.error("%s has disappeared from the cluster: nothing to serve until it is created again", topic)
        return known
    count = len(found.partitions)
    if count != known:
        change = "" if count > known else ": it was deleted and created again"
        log.warning("%s now has %d partitions (was %d)%s", topic, count, known, change)
    return count
