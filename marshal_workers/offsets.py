"""The group's committed Kafka offsets (a backup of the coordination log) and watermarks.

The supervisor commits every partition's progress on each heartbeat, so a
short retention on the coordination topic loses nothing: a partition the
log has forgotten resumes at its committed offset.  Workers never commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from marshal_workers.config import Settings
from marshal_workers.kafka_clients import client_config
from marshal_workers.logs import group_log

_log = logging.getLogger(__name__)


class OffsetLookupError(Exception):
    """Kafka did not tell where a partition stands (the caller retries later)."""


class OffsetStore:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.group = settings.require_group()
        self.log = group_log(_log, self.group)
        self._consumer = Consumer(
            client_config(
                settings,
                **{
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "on_commit": self._on_commit,
                },
            )
        )
        self._commit_failures_logged = False

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset for a partition, or None if it has none.

        Raises OffsetLookupError when Kafka does not say: "none" and "unknown" must not be confused,
        or a partition would restart from auto_offset_reset instead of its backup.
        """
        try:
            [found] = self._consumer.committed([TopicPartition(topic, partition)], timeout=self.settings.connect_timeout)
        except KafkaException as exc:
            raise OffsetLookupError(f"could not read the committed offset of {topic}[{partition}]: {exc}") from None
        if found.error is not None:
            raise OffsetLookupError(f"could not read the committed offset of {topic}[{partition}]: {found.error}")
        return found.offset if found.offset >= 0 else None

    def reset_offset(self, topic: str, partition: int) -> int:
        """Where a partition with no known position starts, per auto_offset_reset."""
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.settings.connect_timeout, cached=False
            )
        except KafkaException as exc:
            raise OffsetLookupError(f"could not read the watermarks of {topic}[{partition}]: {exc}") from None
        return int(low if self.settings.auto_offset_reset == "earliest" else high)

    def commit(self, progress: Sequence[tuple[str, int, int]]) -> None:
        """Commit (topic, partition, next offset) asynchronously; failures are logged once."""
        if not progress:
            return
        try:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for t, p, o in progress], asynchronous=True)
        except KafkaException as exc:
            self._commit_failed(exc.args[0])

    def poll(self) -> None:
        """Serve commit callbacks."""
        self._consumer.poll(0)

    def _on_commit(self, error: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        if error is not None:
            self._commit_failed(error)

    def _commit_failed(self, error: object) -> None:
        if not self._commit_failures_logged:
            self.log.warning("could not commit offsets as a backup (the coordination log still has them): %s", error)
            self._commit_failures_logged = True

    def close(self) -> None:
        self._consumer.close()
