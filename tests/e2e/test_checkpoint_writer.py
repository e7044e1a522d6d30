"""The supervisor's checkpoint writer (runtime/supervisor/checkpoint_writer.py, stepping the pure
protocol/checkpoint_schedule.py that the simulator steps too): a running supervisor writes a checkpoint every
``checkpoint_interval``, again and again, and the next supervisor starts at them and resumes exactly."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.reader_start import find_checkpoints
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker


def latest_as_of(fleet: Fleet, settings: Settings, partitions: int, home: int) -> int | None:
    found = find_checkpoints(settings, fleet.coordination_topic, partitions, fleet.group)[home]
    return None if found is None else found[0].as_of


def test_a_supervisor_writes_checkpoints_every_interval_and_the_next_one_starts_at_them(
    kafka_brokers: str, fleets: Callable[..., Fleet]
) -> None:
    fleet = fleets("ckpt", 4, env={"MARSHAL_WORKERS_CHECKPOINT_INTERVAL": "1s"})
    settings = Settings(brokers=kafka_brokers, group=fleet.group, coordination_topic=fleet.coordination_topic)
    try:
        fleet.produce(range(40))
        first = fleet.start("a")
        poll_until(lambda: len(fleet.counts()) == 40, timeout=90, what="a handling everything")
        with Coordinator(settings) as coordinator:
            partitions = coordinator.partition_count
        home = codec.coordination_partition(fleet.topic, partitions)
        poll_until(lambda: latest_as_of(fleet, settings, partitions, home) is not None, timeout=60, what="a checkpoint")
        earlier = latest_as_of(fleet, settings, partitions, home)
        assert earlier is not None
        poll_until(
            lambda: (latest_as_of(fleet, settings, partitions, home) or 0) > earlier,
            timeout=60,
            what="a later checkpoint, an interval on",
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == ExitCode.OK

        second = fleet.start("b")
        poll_until(lambda: "claimed" in fleet.log_of("b"), timeout=60, what="b's first claim")
        assert "the whole log: no checkpoint yet" not in fleet.log_of("b")
        fleet.produce(range(40, 60))
        poll_until(lambda: len(fleet.counts()) == 60, timeout=60, what="b handling the new messages")
        assert max(fleet.counts().values()) == 1, "nothing handled twice across the hand-over"
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == ExitCode.OK
    finally:
        fleet.stop_all()
