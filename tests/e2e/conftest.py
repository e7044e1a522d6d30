"""Fixtures for the end-to-end tests: a fresh topic and group per test, supervisors killed after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import Fleet


@pytest.fixture
def fleet(kafka_brokers: str, unique: str, tmp_path: Path) -> Iterator[Fleet]:
    """A fresh 8-partition topic and group; every supervisor started through it is killed at the end."""
    topic = f"seq-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_brokers})
    admin.create_topics([NewTopic(topic, num_partitions=8, replication_factor=1)])[topic].result(10)
    running = Fleet(
        brokers=kafka_brokers,
        group=f"group-{unique}",
        topic=topic,
        coordination_topic=f"__marshal-{unique}",
        sink=tmp_path / "sink.txt",
        partitions=8,
    )
    try:
        yield running
    finally:
        running.stop_all()
