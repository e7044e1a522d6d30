"""Fixtures for the nemesis: a broker of its own (the nemesis freezes it), stopped after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from marshal_workers.kafka.embedded_broker import EmbeddedBroker


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A Tansu broker for one test: freezing it must not stall the rest of the suite."""
    with EmbeddedBroker(log_path=str(tmp_path / "broker.log")) as broker:
        yield broker
