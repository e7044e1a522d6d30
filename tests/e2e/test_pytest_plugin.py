"""The pytest plugin's running_app, as users' tests use it: it creates the topics the app's handlers name, so a
test needs nothing but the app (docs/handlers.md#testing)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from polling import poll_until

from marshal_workers.pytest_plugin import RunningApp

APPS = Path(__file__).resolve().parents[1] / "apps"

pytestmark = pytest.mark.broker


def app_env(topic: str, sink: Path) -> dict[str, str]:
    """tests/apps/sink_app.py on ``topic``: the topic is named by the environment, as an app may name it."""
    path = os.pathsep.join(filter(None, [str(APPS), os.getcwd(), os.environ.get("PYTHONPATH")]))
    return {"MW_TEST_TOPIC": topic, "MW_TEST_SINK": str(sink), "PYTHONPATH": path}


def partitions_of(brokers: str, topic: str) -> int:
    found = AdminClient({"bootstrap.servers": brokers}).list_topics(timeout=10).topics.get(topic)
    return 0 if found is None else len(found.partitions)


def test_running_app_creates_the_handlers_topic_it_lacks_and_handles_what_is_produced(
    marshal_broker: str, running_app: Callable[..., RunningApp], unique: str, tmp_path: Path
) -> None:
    topic, sink = f"plugin-{unique}", tmp_path / "sink"
    assert partitions_of(marshal_broker, topic) == 0
    running_app("sink_app:app", env=app_env(topic, sink), partitions=3)
    assert partitions_of(marshal_broker, topic) == 3
    producer = Producer({"bootstrap.servers": marshal_broker})
    for n in range(6):
        producer.produce(topic, str(n).encode(), partition=n % 3)
    assert producer.flush(30) == 0
    poll_until(lambda: sink.exists() and len(sink.read_text().splitlines()) == 6, timeout=60, what="6 handled")


def test_running_app_leaves_an_existing_topic_as_it_is_and_can_create_none(
    marshal_broker: str, running_app: Callable[..., RunningApp], unique: str, tmp_path: Path
) -> None:
    existing, missing = f"plugin-kept-{unique}", f"plugin-none-{unique}"
    admin = AdminClient({"bootstrap.servers": marshal_broker})  # kept: its futures die with it
    admin.create_topics([NewTopic(existing, 2, 1)])[existing].result(30)
    running_app("sink_app:app", env=app_env(existing, tmp_path / "sink"), partitions=5)
    assert partitions_of(marshal_broker, existing) == 2

    refused = running_app("sink_app:app", env=app_env(missing, tmp_path / "sink"), create_topics=False, wait=False)
    assert refused.process.wait(timeout=60) != 0
    assert f"handler topic {missing!r} does not exist" in refused.log()
    assert partitions_of(marshal_broker, missing) == 0
