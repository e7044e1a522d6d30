"""Fixtures for the end-to-end tests: fresh fleets (a topic, a group, a coordination topic of their own), every
supervisor, server and client they started killed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, new_fleet
from otlp import OtlpReceiver

NewFleet = Callable[..., Fleet]


@pytest.fixture
def fleets(kafka_brokers: str, unique: str, tmp_path: Path) -> Iterator[NewFleet]:
    """``fleets(name="seq", partitions=8, env=..., app=..., heartbeat=...)``: a fresh fleet (tests/fleet.py,
    new_fleet); every process started through any of them is killed at the end."""
    made: list[Fleet] = []

    def make(name: str = "seq", partitions: int = 8, **fields: Any) -> Fleet:
        made.append(new_fleet(kafka_brokers, unique, tmp_path, name, partitions, **fields))
        return made[-1]

    try:
        yield make
    finally:
        for fleet in made:
            fleet.stop_all()


@pytest.fixture
def fleet(fleets: NewFleet, request: pytest.FixtureRequest) -> Fleet:
    """A fresh fleet of 8 partitions, or as a ``@pytest.mark.fleet(name=..., partitions=..., env=...)`` marker on
    the test or its module says."""
    marker = request.node.get_closest_marker("fleet")
    return fleets(*(marker.args if marker else ()), **(marker.kwargs if marker else {}))


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP traces endpoint (tests/otlp.py) the test's processes export their spans to."""
    receiver = OtlpReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()
