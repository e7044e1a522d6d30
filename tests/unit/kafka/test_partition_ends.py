"""PartitionEnds (committed_offsets.py): partition ends kept fresh without ever blocking a loop (fake futures, no broker)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from confluent_kafka import TopicPartition

from marshal_workers.kafka.committed_offsets import PartitionEnds


class Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class Store:
    """Hands out one unanswered future per partition per request, and remembers the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[TopicPartition, Future[Any]]] = []

    def request_ends(self, topic: str, partitions: Any) -> dict[TopicPartition, Future[Any]]:
        self.requests.append({TopicPartition(topic, p): Future() for p in partitions})
        return self.requests[-1]


def test_a_loop_never_waits_and_takes_the_ends_once_every_partition_answered() -> None:
    store, ends = Store(), PartitionEnds(interval=0.25)
    ends.refresh(store, "t", 2, now=0.0)  # type: ignore[arg-type]
    first = list(store.requests[0].values())
    first[0].set_result(Answer(40))
    ends.refresh(store, "t", 2, now=1.0)  # type: ignore[arg-type]
    assert ends.ends == {} and len(store.requests) == 1, "half answered: nothing taken, nothing asked again"
    first[1].set_exception(RuntimeError("broker away"))
    ends.refresh(store, "t", 2, now=1.0)  # type: ignore[arg-type]
    assert ends.ends == {0: 40}, "a failed partition keeps what it had"
    assert len(store.requests) == 2, "the next request goes out as the answers are taken, when due"


def test_requests_are_spaced_by_the_interval_and_a_topic_without_partitions_is_not_asked() -> None:
    store, ends = Store(), PartitionEnds(interval=0.25)
    ends.refresh(store, "t", 0, now=0.0)  # type: ignore[arg-type]
    assert store.requests == []
    ends.refresh(store, "t", 1, now=0.0)  # type: ignore[arg-type]
    next(iter(store.requests[0].values())).set_result(Answer(7))
    ends.refresh(store, "t", 1, now=0.1)  # type: ignore[arg-type]
    assert ends.ends == {0: 7} and len(store.requests) == 1, "answered, but the next ask is not due yet"
    ends.refresh(store, "t", 1, now=0.3)  # type: ignore[arg-type]
    assert len(store.requests) == 2
