"""Shared partitions (DESIGN.md section 11): many workers on many supervisors share each partition through range
leases, with every message accounted for under kill -9, SIGSTOP past the pending timeout and SIGTERM."""

from __future__ import annotations

import collections
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import Fleet
from polling import poll_until

from marshal_workers.exit_codes import ExitCode

pytestmark = pytest.mark.broker

PARTITIONS = 2


@pytest.fixture
def shared_fleet(kafka_brokers: str, unique: str, tmp_path: Path) -> Iterator[Fleet]:
    """A fresh 2-partition topic whose handler is shared; supervisors killed at the end."""
    topic = f"shared-{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_brokers})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(10)
    running = Fleet(
        brokers=kafka_brokers,
        group=f"group-{unique}",
        topic=topic,
        coordination_topic=f"__marshal-{unique}",
        sink=tmp_path / "sink.txt",
        partitions=PARTITIONS,
        env={"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20", "MW_TEST_PENDING_TIMEOUT": "5s"},
    )
    try:
        yield running
    finally:
        running.stop_all()


def test_three_supervisors_of_four_processes_handle_every_message_exactly_once(shared_fleet: Fleet) -> None:
    total = 1200
    shared_fleet.env["MW_TEST_DELAY"] = "0.02"
    supervisors = [shared_fleet.start(name, "--processes", "4") for name in ("a", "b", "c")]
    shared_fleet.produce(range(total))
    poll_until(lambda: len(shared_fleet.counts()) == total, timeout=120, what="every message")

    for supervisor in supervisors:
        supervisor.send_signal(signal.SIGTERM)
    for supervisor in supervisors:
        assert supervisor.wait(timeout=60) == ExitCode.OK
    counts = shared_fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)]
    assert [v for v, n in counts.items() if n > 1] == [], "a clean run handles each message once"
    workers_by_partition = collections.defaultdict(set)
    for line in shared_fleet.lines():
        workers_by_partition[line.partition].add((line.client, line.pid))
    # Fan-out beyond the partition count: each partition's messages were handled by many processes on every host.
    assert all(len(workers) >= 6 for workers in workers_by_partition.values()), workers_by_partition
    assert {line.client for line in shared_fleet.lines()} == {"a", "b", "c"}
