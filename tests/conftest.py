"""Shared fixtures: one Kafka broker for the suite, unique names per test, polling.

The suite runs against the embedded Tansu broker (started by the plugin's marshal_broker), or against
an external Kafka named by MARSHAL_WORKERS_TEST_BROKERS=host:port.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from property_runs import examples

from marshal_workers.core.config import Settings

# Timing figures live in benchmarks, not in pass/fail tests: hypothesis's per-example deadline (200 ms) and its
# "data generation is too slow" check fail a property on a loaded machine, not on a broken rule (an example of the
# fold's kept answers took 400 ms with another developer's suite beside this one).  Tests that set a deadline keep it.
# A property that names no count tries its share of hypothesis's 100 (property_runs.py).
hypothesis_settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=examples(100)
)
hypothesis_settings.load_profile("suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Spark tests first.  Under ``pytest -n 4 --dist loadgroup`` each of their two xdist groups runs on one
    worker, for two to three minutes (a Spark session, then audits and replays of a few seconds each), and
    pytest-xdist hands out work in collection order: collected after the end-to-end tests, the longer group was
    still running when the other workers had nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("spark") is None)


@pytest.fixture(scope="session")
def kafka_brokers(marshal_broker: str) -> str:
    """The suite's broker: the one the marshal-workers pytest plugin gives users (marshal_workers/pytest_plugin.py)."""
    return marshal_broker


@pytest.fixture
def unique() -> str:
    """A short random suffix, so tests sharing a broker never see each other's topics or groups."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def settings(kafka_brokers: str, unique: str) -> Settings:
    """Settings for a fresh group on a fresh coordination topic, with a short HB."""
    return Settings(
        brokers=kafka_brokers,
        group=f"group-{unique}",
        client_id="client-a",
        heartbeat_interval=1.0,
        coordination_topic=f"__marshal-{unique}",
        coordination_partitions=4,
        connect_timeout=10.0,
        write_timeout=10.0,
    )


@pytest.fixture
def as_client(settings: Settings) -> Callable[[str], Settings]:
    """The same group and coordination topic, seen from another client id."""
    return lambda client_id: replace(settings, client_id=client_id)


@pytest.fixture
def spans() -> Iterator[Any]:
    """Built-in tracing on, into an OpenTelemetry SDK in-memory exporter (``get_finished_spans()``), for this test."""
    from opentelemetry.sdk.trace import TracerProvider  # only the tracing tests need the SDK
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from marshal_workers.core import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.stop()
    provider.shutdown()
