"""``marshal-workers topics create``: the topics an application reads and writes, created before its first run.

``run`` refuses a handler topic that does not exist (UnknownTopicError: on clusters that create topics on first
use, a typo would otherwise start an empty topic) and creates only the dead-letter topics and the coordination
topic itself.  ``topics create MODULE:APP`` creates every topic of an application (app_topics: each handler's
topic, each topic it declares it sends to, each dead-letter topic), and ``--topic NAME`` more.  A topic that exists
is left as it is and reported, so the command can run before every deploy.  ``topics list [MODULE:APP]`` shows
them with their partitions and what uses each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.errors import ConfigError, TopicCreationError
from marshal_workers.handlers.app import App, OnError
from marshal_workers.kafka import kafka_clients
from marshal_workers.kafka.kafka_clients import ALREADY_EXISTS, admin_client, cluster_metadata


@dataclass(frozen=True)
class WantedTopic:
    name: str
    partitions: int
    why: str  # "named", "handler", "dead letters of <topic>": what the report says


def app_topics(app: App) -> dict[str, list[str]]:
    """Every topic the app uses, with what uses it: its handlers' topics, the topics it declares it sends to
    (``app.sends``) and the dead-letter topics of its handlers that dead-letter."""
    used: dict[str, list[str]] = {}
    for topic, handler in sorted(app.handlers.items()):
        used.setdefault(topic, []).append(f"handler {handler.name}")
        if handler.on_error is OnError.DLQ:
            used.setdefault(handler.dlq_topic, []).append(f"dead letters of {topic}")
    for topic in sorted(app.outputs):
        used.setdefault(topic, []).append("app.send (declared with app.sends)")
    return used


def wanted_topics(names: Iterable[str], app: App | None, partitions: int) -> list[WantedTopic]:
    """The topics to create, each once: the app's (app_topics), then ``names``.  ConfigError if there is nothing to
    create or a name is not a valid topic name."""
    found: dict[str, WantedTopic] = {}
    if app is not None:
        for topic, used_by in app_topics(app).items():
            found[topic] = WantedTopic(topic, partitions, "; ".join(used_by))
    for name in names:
        found.setdefault(name, WantedTopic(name, partitions, "named"))
    if not found:
        raise ConfigError("no topic to create: give MODULE:APP for every topic of an application, or --topic NAME")
    for wanted in found.values():
        _check_name(wanted.name)
    return list(found.values())


def listed_topics(settings: Settings, app: App | None) -> list[dict[str, Any]]:
    """``topics list``: with an app, its topics (app_topics) and their partitions (None: missing); without, every
    topic of the cluster but its internal ones (``__``), none used by anything known."""
    existing = cluster_metadata(admin_client(settings), settings).topics
    counts = {
        name: len(found.partitions) for name, found in existing.items() if found.error is None and found.partitions
    }
    if app is None:
        return [
            {"topic": name, "partitions": count, "used_by": []}
            for name, count in sorted(counts.items())
            if not name.startswith("__")
        ]
    return [
        {"topic": name, "partitions": counts.get(name), "used_by": used_by} for name, used_by in app_topics(app).items()
    ]


def _check_name(name: str) -> None:
    """Kafka's own rule (a topic name is 1 to 249 of [a-zA-Z0-9._-], not "." or ".."), checked before asking."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    if not name or len(name) > 249 or name in (".", "..") or not set(name) <= allowed:
        raise ConfigError(f"{name!r} is not a valid topic name: 1 to 249 letters, digits, '.', '_' or '-'")


def create_topics(
    settings: Settings,
    wanted: list[WantedTopic],
    replication_factor: int,
    config: dict[str, str],
    report: Callable[[str], None],
) -> int:
    """Create the topics of ``wanted`` that do not exist (each with ``config``); report each topic; return how many
    were created.  TopicCreationError naming every topic the cluster refused (the others are created)."""
    admin = admin_client(settings)
    existing = cluster_metadata(admin, settings).topics
    missing = []
    for topic in wanted:
        found = existing.get(topic.name)
        if found is None or found.error is not None or not found.partitions:
            missing.append(topic)
            continue
        count = len(found.partitions)
        other = "" if count == topic.partitions else f" (not {topic.partitions}: an existing topic is left as it is)"
        report(f"{topic.name}: exists, {count} partitions{other}")
    if not missing:
        return 0
    outcomes = kafka_clients.create_topics(
        admin,
        settings,
        [
            NewTopic(t.name, num_partitions=t.partitions, replication_factor=replication_factor, config=config)
            for t in missing
        ],
    )
    refused: list[str] = []
    created = 0
    for topic in missing:
        outcome = outcomes[topic.name]
        if outcome is None:
            created += 1
            report(f"{topic.name}: created, {topic.partitions} partitions ({topic.why})")
        elif outcome == ALREADY_EXISTS:
            report(f"{topic.name}: exists (created meanwhile by someone else)")
        else:
            refused.append(f"{topic.name} ({outcome})")
    if refused:
        raise TopicCreationError(
            f"{len(refused)} of {len(wanted)} topics could not be created on {settings.brokers}: {'; '.join(refused)}. "
            "Check the partitions, the replication factor (--replication-factor, at most the number of brokers) "
            "and that this client may create topics"
        )
    return created
