"""Dead-letter topics: what is in one (``dlq list``) and sending its messages back (``dlq redrive``).

A dead letter is the original message (value, key, headers, timestamp) with the
headers our workers add (``error``, ``error_type``, ``traceback`` when the
handler raised the error, ``handler``, ``original_topic``,
``original_partition``, ``original_offset``, ``deliveries`` for shared
handlers, then ``dead_letter_group`` and ``dead_letter_client_id``: who wrote
it).  Both commands read the dead-letter topic from its start to its end as it
is when they begin, and take a group: then only the letters that group wrote
(dead_letter_groups.py); letters written before letters named their group
belong to none.  A redrive checks
everything it can before it writes anything (the topics exist, each chosen
letter has somewhere to go), then sends each chosen letter once, through an
idempotent producer, without our headers, and addressed (``redriven_for_group``)
to the group that wrote it, which alone handles it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer

from marshal_workers.core.config import Settings
from marshal_workers.errors import ConfigError, UnknownTopicError
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.dead_letter_reader import DeadLetter
from marshal_workers.kafka.kafka_clients import admin_client, ask_producer_id, topic_partition_count


def choose(
    letters: list[DeadLetter], error_type: str | None, since_ms: int | None, group: str | None = None
) -> list[DeadLetter]:
    """The letters a redrive sends: of this error type, dead-lettered at or after ``since_ms``, and by ``group``,
    if given (a letter that names no group is no group's).  A letter written before letters said when
    (``written_ms`` None) goes by its original message's time, the best known."""
    return [
        letter
        for letter in letters
        if (error_type is None or letter.error_type == error_type)
        and (since_ms is None or _written_or_original(letter, since_ms))
        and (group is None or letter.group == group)
    ]


def _written_or_original(letter: DeadLetter, since_ms: int) -> bool:
    when = letter.written_ms if letter.written_ms is not None else letter.timestamp
    return when is not None and when >= since_ms


def targets(
    settings: Settings, dlq_topic: str, chosen: list[DeadLetter], to_topic: str | None
) -> list[tuple[DeadLetter, str]]:
    """Where each of ``chosen`` goes: ``to_topic``, or its original topic.  What a redrive checks before it writes
    anything, and a dry run checks too: ConfigError for a letter with no original topic when no ``to_topic`` is
    given, UnknownTopicError for a target topic that does not exist."""
    found = [(letter, to_topic or letter.header("original_topic")) for letter in chosen]
    nowhere = [letter for letter, target in found if not target]
    if nowhere:
        raise ConfigError(
            f"{len(nowhere)} dead letters of {dlq_topic} name no original topic (first at "
            f"{nowhere[0].partition}@{nowhere[0].offset}): give --to TOPIC"
        )
    checked = [(letter, target) for letter, target in found if target]
    if checked:
        admin = admin_client(settings)
        missing = sorted({t for t in {t for _, t in checked} if topic_partition_count(admin, settings, t) is None})
        if missing:
            raise UnknownTopicError(f"nothing sent: {', '.join(missing)} does not exist on {settings.brokers}")
    return checked


def redrive(
    settings: Settings, dlq_topic: str, chosen: list[DeadLetter], to_topic: str | None, report: Callable[[str], None]
) -> int:
    """Send ``chosen`` back to ``to_topic``, or each to its original topic; return how many were sent.  Refused
    before anything is written (``targets``): a letter with nowhere to go, a target topic that does not exist."""
    sending = targets(settings, dlq_topic, chosen, to_topic)
    if not sending:
        return 0
    producer = Producer(client_profiles.redrive_producer(settings))
    ask_producer_id(producer, sending[0][1])
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    for letter, target in sending:
        headers = letter.redrive_headers(dlq_topic)
        while True:
            try:
                # Ignored: confluent-kafka's stub takes headers as an invariant list of (str, str | bytes | None).
                producer.produce(target, value=letter.value, key=letter.key, headers=headers, on_delivery=delivered)  # type: ignore[arg-type]
                break
            except BufferError:
                producer.poll(0.1)
    left = producer.flush(settings.write_timeout * 3)
    if left or failures:
        raise ConfigError(
            f"{left + len(failures)} of {len(sending)} dead letters were not confirmed by Kafka "
            f"({failures[0] if failures else 'timed out'}); the others were sent"
        )
    sent = collections.Counter((t, letter.group) for letter, t in sending)
    for (target, group), count in sorted(sent.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        report(
            f"sent {count} dead letters of {dlq_topic} to {target} "
            + (
                f"for group {group} (only its workers handle them)"
                if group is not None
                else "that name no group (every group reading it handles them)"
            )
        )
    return len(sending)
