"""Helpers of the Spark tests: the replay app's sink, topics and messages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.core.config import Settings
from marshal_workers.protocol import codec

APPS = Path(__file__).parent / "apps"
APP = "replay_app:app"
T0 = 1_700_000_000_000  # record times of the coordination logs the tests write


@dataclass(frozen=True)
class ReplayApp:
    """Where replay_app's handlers write, and the names of their topics."""

    prefix: str
    sink: Path

    def topic(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    def lines(self, topic: str) -> list[tuple[int, int, str, int]]:
        """(partition, offset, value, size of the call's batch) per message handled."""
        path = self.sink / f"{topic}.txt"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            partition, offset, value, size = line.split()
            out.append((int(partition), int(offset), value, int(size)))
        return out

    def hooks(self) -> list[str]:
        path = self.sink / "hooks.txt"
        return path.read_text().split() if path.exists() else []


def create_topic(brokers: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": brokers})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(10)


def produce(brokers: str, topic: str, values: dict[int, list[bytes]], timestamps: dict[int, list[int]] | None = None):
    """Each partition's values in order (and their record times, if given)."""
    producer = Producer({"bootstrap.servers": brokers, "linger.ms": 5})
    for partition, items in values.items():
        for i, value in enumerate(items):
            stamp = {} if timestamps is None else {"timestamp": timestamps[partition][i]}
            producer.produce(topic, value=value, partition=partition, **stamp)
    assert producer.flush(30) == 0


class LogWriter:
    """Writes records of a group to the coordination topic as members would: each on its topic's partition."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = Producer({"bootstrap.servers": settings.brokers, "linger.ms": 2})

    def __call__(self, kind: type, client: str, at: int, topic: str, partition: int = 0, **fields: object) -> None:
        record = kind(
            v=1,
            ts=T0 + at,
            group=fields.pop("group", self.settings.group),
            client=client,
            instance=f"{client}-1",
            topic=topic,
            partition=partition,
            **fields,
        )
        self.write(codec.encode(record), codec.coordination_partition(topic, self.settings.coordination_partitions))

    def write(self, value: bytes, log_partition: int, key: bytes | None = None) -> None:
        self.producer.produce(self.settings.coordination_topic, value=value, key=key, partition=log_partition)
        assert self.producer.flush(10) == 0
