"""Building confluent-kafka clients from Settings, and the few metadata calls we need.

librdkafka retries forever on its own; every call here has a deadline and
turns "no answer" into a :class:`KafkaUnavailable` that names the brokers.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from marshal_workers.config import Settings
from marshal_workers.errors import KafkaUnavailable, UnknownTopicError

# librdkafka's own log lines go to Python logging instead of raw stderr.
librdkafka_log = logging.getLogger("marshal_workers.librdkafka")


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Common librdkafka settings: brokers, client id, user passthrough, then overrides."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.brokers,
        "client.id": f"marshal-workers-{settings.client_id}",
        "logger": librdkafka_log,
        # Connection errors are reported by our own deadlines, with a message that says what to do.
        "error_cb": _log_client_error,
    }
    config.update(settings.kafka)
    config.update(overrides)
    return config


def _log_client_error(error: KafkaError) -> None:
    librdkafka_log.debug("kafka client error: %s", error)


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(client_config(settings))


def cluster_metadata(admin: AdminClient, settings: Settings) -> ClusterMetadata:
    """Metadata of all topics within the connect timeout, or KafkaUnavailable.

    Never asks for one topic by name: on clusters with auto.create.topics.enable
    that request would create it.
    """
    try:
        return admin.list_topics(timeout=settings.connect_timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"Kafka at {settings.brokers} did not answer within {settings.connect_timeout:g}s ({exc.args[0]}). "
            "Check --brokers / MARSHAL_WORKERS_BROKERS and that the cluster is up "
            "(for a local broker: marshal-workers broker)."
        ) from None


def topic_partition_count(admin: AdminClient, settings: Settings, topic: str) -> int | None:
    """The number of partitions of ``topic``, or None if it does not exist."""
    metadata = cluster_metadata(admin, settings)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return None
    if found.error is not None:
        raise KafkaUnavailable(f"metadata for topic {topic!r} has an error: {found.error}")
    return len(found.partitions)


def require_topic(admin: AdminClient, settings: Settings, topic: str) -> int:
    """The partition count of an existing topic, or UnknownTopicError."""
    count = topic_partition_count(admin, settings, topic)
    if count is None:
        raise UnknownTopicError(f"topic {topic!r} does not exist on {settings.brokers}; check the name or create it first")
    return count
