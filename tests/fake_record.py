"""A stand-in for confluent_kafka.Message in unit tests, with fixed defaults (marshal_workers.testing's)."""

from __future__ import annotations

from marshal_workers.testing import FakeRecord as _FakeRecord


def FakeRecord(  # it stands for a class
    topic: str = "orders",
    partition: int = 3,
    offset: int = 1234,
    key: bytes | None = b"k-1",
    value: bytes | None = b'{"id": 7, "items": ["a", "b"]}',
    headers: list[tuple[str, bytes]] | None = None,
    timestamp: tuple[int, int] = (1, 1_700_000_000_123),
) -> _FakeRecord:
    return _FakeRecord(topic, partition, offset, key, value, headers, timestamp)
