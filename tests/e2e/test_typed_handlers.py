"""Typed handlers on the embedded broker (docs/handlers.md, "Typed handlers"): a topic of good orders and malformed
ones (a field of the wrong type, a field missing, not JSON at all) under every runner.  Every good order is handled
once, at its first try; every bad one is in the dead-letter topic once as a PayloadError with the field's path, never
retried; no worker restarts."""

from __future__ import annotations

import signal

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker

PARTITIONS = 2
GOOD = 40  # orders 0..39, good
BAD = {  # offset-independent: value -> what its dead letter's error must say
    b'{"id": "seven", "item": "tea"}': b"Expected `int`, got `str` - at `$.id`",
    b'{"id": 8}': b"Object missing required field `item`",
    b"not json at all": b"JSON is malformed",
}


def produce(fleet: Fleet) -> list[bytes]:
    """The good orders and, on each partition, each bad value once among them; what was sent."""
    values = [orjson.dumps({"id": n, "item": f"item-{n}", "quantity": n % 5}) for n in range(GOOD)]
    for index, bad in enumerate(BAD):
        for partition in range(PARTITIONS):
            values.insert(7 * index + 3 + partition, bad)
    producer = Producer({"bootstrap.servers": fleet.brokers, "linger.ms": 5})
    for n, value in enumerate(values):
        producer.produce(fleet.topic, value=value, partition=n % PARTITIONS)
    assert producer.flush(30) == 0
    return values


def all_dead_letters(fleet: Fleet, count: int) -> list[tuple[bytes, dict[str, bytes]]]:
    """The messages of the dead-letter topic, (value, headers): the first ``count`` (waited for), and any more that
    arrive within 3 s after them (a duplicate would)."""
    consumer = Consumer({"bootstrap.servers": fleet.brokers, "group.id": "dlq-reader", "enable.auto.commit": False})
    dlq = f"{fleet.topic}.dlq"
    try:
        partitions = consumer.list_topics(dlq, timeout=10).topics[dlq].partitions
        consumer.assign([TopicPartition(dlq, p, 0) for p in partitions])
        found: list[tuple[bytes, dict[str, bytes]]] = []
        while len(found) < count:
            message = poll_until(lambda: consumer.poll(0.5), timeout=30, what="a dead letter")
            if message.error() is None:
                found.append((message.value(), dict(message.headers() or [])))
        more = [m for m in consumer.consume(100, 3.0) if m.error() is None]
        return found + [(m.value(), dict(m.headers() or [])) for m in more]
    finally:
        consumer.close()


@pytest.mark.parametrize("runner", ["alo", "amo", "lanes", "async", "batch", "shared"])
@pytest.mark.fleet("typed", PARTITIONS)
def test_good_orders_are_handled_once_and_bad_ones_dead_lettered_once_without_retry(fleet: Fleet, runner: str) -> None:
    fleet.app = "typed_app:app"
    fleet.env |= {"MW_TEST_RUNNER": runner}
    supervisor = fleet.start("only", "--processes", "2")

    def workers() -> set[int]:
        return fleet.shared_worker_pids("only") if runner == "shared" else set(fleet.worker_pids("only").values())

    def two_workers() -> set[int] | None:
        found = workers()
        return found if len(found) == 2 else None

    started = poll_until(two_workers, timeout=60, what="2 workers")
    produce(fleet)
    poll_until(lambda: len(fleet.lines()) >= GOOD, timeout=60, what="every good order handled")

    handled = [line.value for line in fleet.lines()]
    assert sorted(handled) == sorted(f"{n}:1" for n in range(GOOD)), "each good order once, at its first try"
    letters = all_dead_letters(fleet, len(BAD) * PARTITIONS)
    assert sorted(value for value, _ in letters) == sorted(list(BAD) * PARTITIONS), "each bad one once"
    for value, headers in letters:
        assert headers["error_type"] == b"PayloadError"
        assert BAD[value] in headers["error"], headers["error"]
    log = fleet.log_of("only")
    assert "; retry 1 in " not in log, "a payload that does not decode is never retried"
    assert "PayloadError" in log
    assert workers() == started, "no worker restarted"

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == ExitCode.OK
