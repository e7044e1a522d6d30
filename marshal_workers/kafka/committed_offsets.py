"""The group's committed Kafka offsets (a backup of the coordination log) and watermarks.

The supervisor commits every partition's progress on each heartbeat, so a
short retention on the coordination topic loses nothing: a partition the
log has forgotten resumes at its committed offset.  Workers never commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from marshal_workers.core.config import Settings
from marshal_workers.core.logs import group_log
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.kafka_clients import admin_client

_log = logging.getLogger(__name__)


ENDS_INTERVAL_S = 0.25  # how often PartitionEnds asks for a topic's partition ends


class PartitionEnds:
    """A topic's partition end offsets, kept fresh without ever blocking the caller's loop: one ListOffsets
    request at a time, its answers taken once every partition's has come, the next one ``interval`` seconds later.

    ``ends`` may under-report an end (Tansu, docs/brokers.md): callers count the ends fetches saw too.
    """

    def __init__(self, interval: float = ENDS_INTERVAL_S) -> None:
        self.interval = interval
        self.ends: dict[int, int] = {}  # partition -> end offset, as last answered
        self._pending: dict[Any, Any] | None = None
        self._next_ask = 0.0  # monotonic

    def refresh(self, store: OffsetStore, topic: str, partition_count: int | None, now: float) -> None:
        """Take the answers of the request in flight if they are all in; ask again when due (not while the topic's
        partition count is unknown)."""
        if self._pending is not None:
            if not all(f.done() for f in self._pending.values()):
                return
            for tp, future in self._pending.items():
                if future.exception() is None:  # a partition's lookup that failed is asked again next time
                    self.ends[tp.partition] = int(future.result().offset)
            self._pending = None
        if now < self._next_ask or not partition_count:
            return
        self._next_ask = now + self.interval
        self._pending = store.request_ends(topic, range(partition_count))


class OffsetLookupError(Exception):
    """Kafka did not tell where a partition stands (the caller retries later)."""


class OffsetStore:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.group = settings.require_group()
        self.log = group_log(_log, self.group)
        self._consumer = Consumer(client_profiles.offset_keeper(settings, self._on_commit))
        self._commit_failures_logged = False
        self._admin = admin_client(settings)

    def committed_many(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """The group's committed offsets of (topic, partition) pairs, one request for all; None: it has none.

        Raises OffsetLookupError when Kafka does not say: "none" and "unknown" must not be confused,
        or a partition would restart from auto_offset_reset instead of its backup.
        """
        try:
            found = self._consumer.committed(
                [TopicPartition(t, p) for t, p in keys], timeout=self.settings.connect_timeout
            )
        except KafkaException as exc:
            where = ", ".join(f"{t}[{p}]" for t, p in keys[:3]) + (
                f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            )
            raise OffsetLookupError(f"could not read the committed offsets of {where}: {exc}") from None
        failed = next((tp for tp in found if tp.error is not None), None)
        if failed is not None:
            raise OffsetLookupError(
                f"could not read the committed offset of {failed.topic}[{failed.partition}]: {failed.error}"
            )
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}

    def start_offsets(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Where shared partitions never leased start: the group's committed offset (the low-water mark's backup),
        else auto_offset_reset; a partition whose offset Kafka did not give is left out (asked again later).

        Raises OffsetLookupError when the committed offsets cannot be read."""
        committed = self.committed_many(keys)
        missing = [key for key in keys if committed.get(key) is None]
        reset = self.reset_offsets(missing) if missing else {}
        found: dict[tuple[str, int], int] = {}
        for key in keys:
            offset = committed.get(key)
            if offset is None:
                offset = reset.get(key)  # type: ignore[assignment]
            if isinstance(offset, int):
                found[key] = offset
        return found

    def learn_start_offsets(self, topic: str, partitions: Sequence[int], starts: dict[int, int], log: Any) -> None:
        """Add to ``starts`` (partition -> offset) where ``topic``'s shared partitions never leased start
        (start_offsets), for the range-lease member's choice (protocol/range_member.py).  Once per partition; a
        blocking lookup, like a whole partition's first claim.  When Kafka cannot tell, say so on the caller's
        ``log``: the partitions stay unknown and are asked about again on the next claim."""
        try:
            found = self.start_offsets([(topic, p) for p in partitions])
        except OffsetLookupError as exc:
            log.warning("%s", exc)
            return
        starts.update({partition: offset for (_, partition), offset in found.items()})

    def reset_offsets(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | OffsetLookupError]:
        """Where partitions with no known position start, per auto_offset_reset: one request for all (a
        partition's lookup error in place of its offset)."""
        spec = OffsetSpec.earliest() if self.settings.auto_offset_reset == "earliest" else OffsetSpec.latest()
        result: dict[tuple[str, int], int | OffsetLookupError] = {}
        try:
            futures = self._admin.list_offsets(
                {TopicPartition(t, p): spec for t, p in keys}, request_timeout=self.settings.connect_timeout
            )
        except KafkaException as exc:
            return {key: OffsetLookupError(f"could not read the offsets of {key[0]}[{key[1]}]: {exc}") for key in keys}
        for tp, future in futures.items():
            try:
                result[(tp.topic, tp.partition)] = int(future.result(timeout=self.settings.connect_timeout + 1).offset)
            except Exception as exc:  # noqa: BLE001 - KafkaException, or a timeout: Kafka did not say
                result[(tp.topic, tp.partition)] = OffsetLookupError(
                    f"could not read the {spec} offset of {tp.topic}[{tp.partition}]: {exc}"
                )
        return result

    def request_ends(self, topic: str, partitions: Iterable[int]) -> dict[TopicPartition, Any]:
        """Ask for the partitions' end offsets without waiting: a future per partition (one request)."""
        spec = OffsetSpec.latest()
        try:
            return self._admin.list_offsets(
                {TopicPartition(topic, p): spec for p in partitions}, request_timeout=self.settings.connect_timeout
            )
        except KafkaException as exc:
            self.log.warning("could not ask for the ends of %s: %s", topic, exc)
            return {}

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
