"""A stand-in for confluent_kafka.Message in unit tests (the real one cannot be built in Python)."""

from __future__ import annotations


class FakeRecord:
    """A stand-in for confluent_kafka.Message: the same accessor methods, fixed values."""

    def __init__(
        self,
        topic: str = "orders",
        partition: int = 3,
        offset: int = 1234,
        key: bytes | None = b"k-1",
        value: bytes | None = b'{"id": 7, "items": ["a", "b"]}',
        headers: list[tuple[str, bytes]] | None = None,
        timestamp: tuple[int, int] = (1, 1_700_000_000_123),
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers, self._timestamp = key, value, headers, timestamp

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def error(self) -> None:
        return None  # a record, not an error event
