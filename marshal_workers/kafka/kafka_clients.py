"""The admin client, and the few metadata calls we need (every client's settings: client_profiles.py).

librdkafka retries forever on its own; every call here has a deadline and
turns "no answer" into a :class:`KafkaUnavailable` that names the brokers.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.core.stopping import ShouldStop, check_stop, interruptible, never, wait_future
from marshal_workers.errors import CoordinationTopicError, KafkaUnavailable, UnknownTopicError
from marshal_workers.kafka import client_profiles

log = logging.getLogger(__name__)

PRODUCER_ID_PROMPT_TIMEOUT_S = 2.0  # ask_producer_id's wait for a metadata answer

# A fetched record's error and headers, by the methods themselves: map() and any() call them from C with no
# look-up per record, 27 ns a record against 100 through operator.methodcaller (a worker passes every record it
# fetches through both: link.py, shared_worker.py; the HTTP service's range_reader.py the headers).
RECORD_ERROR = Message.error
RECORD_HEADERS = Message.headers


class Fetching(Protocol):
    """A consumer: confluent-kafka's, or a GuardedConsumer."""

    def poll(self, timeout: float) -> Any: ...

    def consume(self, num_messages: int, timeout: float) -> list[Any]: ...


def take_fetched(consumer: Fetching, most: int, wait: float) -> list[Message]:
    """Up to ``most`` records (or error events): wait up to ``wait`` seconds for the first, then take only what is
    already fetched.  Not ``consume(most, wait)``, which waits the whole ``wait`` whenever fewer than ``most`` come:
    a reader near its end, or of a partition with a few records, paid it on every call."""
    first = consumer.poll(wait)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, 0)] if most > 1 else [first]


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(client_profiles.admin(settings))


def ask_producer_id(producer: Producer, topic: str) -> None:
    """Make a new idempotent ``producer`` ask for its producer id now rather than in 500 ms.

    Until it has one, nothing it produces is sent.  librdkafka asks for it when the producer is created, before it
    has a connection, and then only on a 500 ms timer or when a metadata answer comes in while a connection is
    up (rdkafka_idempotence.c, rdkafka_metadata.c).  The first answer comes on the bootstrap connection, which
    librdkafka drops for the brokers the answer names; the second comes from one of those, still up: so ask for
    ``topic``'s metadata twice, two round trips.  (Once was enough only when a broker connection happened to be
    up already: a supervisor on a new coordination topic still waited out the timer.)  Every start of a
    supervisor, and a worker's first output or dead letter, waited for that timer.  No answer in time costs
    nothing: the timer still fires.
    """
    try:
        for _ in range(2):
            producer.list_topics(topic, timeout=PRODUCER_ID_PROMPT_TIMEOUT_S)
    except KafkaException as exc:
        log.debug("no metadata of %s yet (%s): the producer asks for its id on its own timer", topic, exc)


class ListsTopics(Protocol):
    """A client that lists the cluster's topics: an AdminClient, a Consumer or a GuardedConsumer."""

    def list_topics(self, *args: Any, **kwargs: Any) -> ClusterMetadata: ...


def cluster_metadata(client: ListsTopics, settings: Settings, should_stop: ShouldStop = never) -> ClusterMetadata:
    """Metadata of all topics within the connect timeout, or KafkaUnavailable (StopRequested as soon as
    ``should_stop`` says so: stopping.py).  Asked of the client that goes on to use it (a reader of the
    coordination log), it costs no request of its own: the client keeps what it learns (the partitions'
    leaders), which it would otherwise ask for before its first request.

    Never asks for one topic by name: on clusters with auto.create.topics.enable
    that request would create it.
    """
    try:
        return interruptible(lambda: client.list_topics(timeout=settings.connect_timeout), should_stop)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"Kafka at {settings.brokers} did not answer within {settings.connect_timeout:g}s ({exc.args[0]}). "
            "Check --brokers / MARSHAL_WORKERS_BROKERS and that the cluster is up "
            "(for a local broker: marshal-workers broker)."
        ) from None


def topic_partition_count(
    client: ListsTopics, settings: Settings, topic: str, should_stop: ShouldStop = never
) -> int | None:
    """The number of partitions of ``topic``, or None if it does not exist."""
    metadata = cluster_metadata(client, settings, should_stop)
    return _listed_partition_count(metadata, topic)


def _listed_partition_count(metadata: ClusterMetadata, topic: str) -> int | None:
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
        raise UnknownTopicError(
            f"topic {topic!r} does not exist on {settings.brokers}; check the name or create it first"
        )
    return count


def ensure_topic(
    admin: AdminClient,
    settings: Settings,
    topic: str,
    partitions: int,
    config: dict[str, str] | None = None,
    should_stop: ShouldStop = never,
    metadata: ClusterMetadata | None = None,
) -> int:
    """The partition count of ``topic``, creating it first if it is missing (CoordinationTopicError if it cannot).
    ``metadata``: the cluster's, just asked for (all topics): a topic it lists costs no request."""
    if metadata is not None and (count := _listed_partition_count(metadata, topic)) is not None:
        return count
    count = topic_partition_count(admin, settings, topic, should_stop)
    if count is not None:
        return count
    log.info("creating topic %s with %d partitions", topic, partitions)
    new_topic = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=settings.coordination_replication_factor,
        config=config or {},
    )
    refusal = create_topics(admin, settings, [new_topic], should_stop)[topic]
    if refusal not in (None, ALREADY_EXISTS):
        raise _cannot_create(settings, topic, partitions, config, refusal)
    return _wait_topic_visible(admin, settings, topic, should_stop)


ALREADY_EXISTS = "exists"  # create_topics' outcome for a topic that was there already (or made meanwhile)


def create_topics(
    admin: AdminClient, settings: Settings, topics: list[NewTopic], should_stop: ShouldStop = never
) -> dict[str, str | None]:
    """Create ``topics`` in one request; per topic name the outcome: None (created), ALREADY_EXISTS, or the
    cluster's reason for refusing it (each topic is created or refused on its own).  The one place topics are
    created: ensure_topic (the coordination and dead-letter topics) and ``topics create`` (ops/topics.py)."""
    futures = admin.create_topics(topics, request_timeout=settings.connect_timeout)
    return {
        name: _creation_outcome(future, settings.connect_timeout + 1, should_stop) for name, future in futures.items()
    }


def _creation_outcome(future: concurrent.futures.Future[None], timeout: float, should_stop: ShouldStop) -> str | None:
    try:
        wait_future(future, timeout, should_stop)
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return ALREADY_EXISTS
        return str(error.str() if isinstance(error, KafkaError) else error)
    except concurrent.futures.TimeoutError:
        return f"no answer within {timeout:g}s"
    return None


def _cannot_create(
    settings: Settings, topic: str, partitions: int, config: dict[str, str] | None, reason: str
) -> CoordinationTopicError:
    extra = "".join(f", {k}={v}" for k, v in (config or {}).items())
    return CoordinationTopicError(
        f"topic {topic!r} is missing and could not be created on {settings.brokers}: {reason}. "
        f"Create it (e.g. {partitions} partitions{extra}) or allow this client to create topics."
    )


def _wait_topic_visible(admin: AdminClient, settings: Settings, topic: str, should_stop: ShouldStop) -> int:
    deadline = time.monotonic() + settings.connect_timeout
    while time.monotonic() < deadline:
        count = topic_partition_count(admin, settings, topic, should_stop)
        if count:
            return count
        check_stop(should_stop)
        time.sleep(0.05)
    raise CoordinationTopicError(
        f"topic {topic!r} was created but does not show in the metadata of {settings.brokers} "
        f"after {settings.connect_timeout:g}s"
    )
