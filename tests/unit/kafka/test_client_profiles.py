"""client_profiles.py: each Kafka client's settings, from the Settings alone (no broker), and that every client the
package makes takes its settings from a profile."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marshal_workers.core.config import Settings
from marshal_workers.core.librdkafka_check import librdkafka_refusal
from marshal_workers.errors import ConfigError
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.client_profiles import librdkafka_log

PACKAGE = Path(client_profiles.__file__).resolve().parent.parent


def _statistics(_document: str) -> None: ...


def _committed(_error: Any, _partitions: list[Any]) -> None: ...


# Each profile with the kind of client it configures, built from a Settings.
PROFILES: dict[str, tuple[str, Callable[[Settings], dict[str, Any]]]] = {
    "coordination writer": ("producer", lambda s: client_profiles.coordination_writer(s, _statistics)),
    "coordination reader": ("consumer", lambda s: client_profiles.coordination_reader(s, "a test")),
    "worker consumer": ("consumer", client_profiles.worker_consumer),
    "shared consumer": ("consumer", client_profiles.shared_consumer),
    "served-topic consumer": ("consumer", client_profiles.served_topic_consumer),
    "split reader": ("consumer", client_profiles.split_reader),
    "position reader": ("consumer", client_profiles.position_reader),
    "demo view": ("consumer", client_profiles.demo_view),
    "offset keeper": ("consumer", lambda s: client_profiles.offset_keeper(s, _committed)),
    "output producer": ("producer", client_profiles.output_producer),
    "dead-letter producer": ("producer", client_profiles.dead_letter_producer),
    "redrive producer": ("producer", client_profiles.redrive_producer),
    "demo producer": ("producer", client_profiles.demo_producer),
    "admin": ("admin", client_profiles.admin),
}
CONSUMERS = [name for name, (kind, _) in PROFILES.items() if kind == "consumer"]
WRITERS = ["coordination writer", "output producer", "dead-letter producer", "redrive producer"]
READERS = ["coordination reader", "split reader", "position reader", "demo view"]  # never in the user's group


def settings(**fields: Any) -> Settings:
    return Settings(brokers="kafka1:9092,kafka2:9092", group="billing", client_id="host-7", **fields)


def build(name: str, given: Settings) -> dict[str, Any]:
    return PROFILES[name][1](given)


@pytest.mark.parametrize("name", PROFILES)
def test_every_client_reaches_the_brokers_as_this_client_and_logs_through_python(name: str) -> None:
    config = build(name, settings())
    assert config["bootstrap.servers"] == "kafka1:9092,kafka2:9092"
    assert config["client.id"] == "marshal-workers-host-7"
    assert config["logger"] is librdkafka_log


@pytest.mark.parametrize("name", PROFILES)
def test_librdkafka_takes_every_profile(name: str) -> None:
    # A misspelt property or a bad value would only fail once the client is made, in a worker or at a claim.
    kind, _ = PROFILES[name]
    assert librdkafka_refusal(kind, build(name, settings(kafka={"client.rack": "r1"}))) is None


@pytest.mark.parametrize("name", PROFILES)
def test_the_users_passthrough_reaches_the_clients_of_its_kind(name: str) -> None:
    given = settings(
        kafka={"client.rack": "r1"},
        kafka_consumer={"fetch.min.bytes": "4096"},
        kafka_producer={"compression.type": "zstd"},
    )
    config = build(name, given)
    kind, _ = PROFILES[name]
    assert config["client.rack"] == "r1"
    assert ("fetch.min.bytes" in config) == (kind == "consumer")
    assert ("compression.type" in config) == (kind == "producer")


@pytest.mark.parametrize("name", WRITERS)
def test_what_is_written_is_on_every_in_sync_replica_once_whatever_the_passthrough_says(name: str) -> None:
    config = build(name, settings(kafka_producer={"acks": "1", "enable.idempotence": "false"}))
    assert config["acks"] == "all"
    assert config["enable.idempotence"] is True


@pytest.mark.parametrize("name", CONSUMERS)
def test_no_reader_commits_on_its_own_whatever_the_passthrough_says(name: str) -> None:
    config = build(name, settings(kafka_consumer={"enable.auto.commit": "true", "enable.auto.offset.store": "true"}))
    assert config["enable.auto.commit"] is False
    assert config["enable.auto.offset.store"] is False


@pytest.mark.parametrize("name", READERS)
def test_a_reader_has_a_group_of_its_own_so_reading_moves_nobodys_position(name: str) -> None:
    first, second = build(name, settings()), build(name, settings())
    assert first["group.id"] != second["group.id"]
    assert "billing" not in first["group.id"]
    assert first["group.id"].startswith("marshal-workers-")
    assert first["auto.offset.reset"] == "earliest"  # an asked-for offset that is gone: what is left


@pytest.mark.parametrize("name", ["worker consumer", "shared consumer", "served-topic consumer", "offset keeper"])
def test_the_groups_own_clients_use_its_group_and_need_one(name: str) -> None:
    assert build(name, settings())["group.id"] == "billing"
    with pytest.raises(ConfigError):
        build(name, Settings(brokers="kafka1:9092"))


def test_a_worker_goes_where_the_user_chose_when_its_resume_offset_is_gone() -> None:
    assert client_profiles.worker_consumer(settings(auto_offset_reset="latest"))["auto.offset.reset"] == "latest"
    assert client_profiles.worker_consumer(settings(auto_offset_reset="earliest"))["auto.offset.reset"] == "earliest"


@pytest.mark.parametrize("name", ["shared consumer", "served-topic consumer"])
def test_a_range_reader_goes_on_from_the_oldest_offset_and_hears_where_a_partition_ends(name: str) -> None:
    config = build(name, settings(auto_offset_reset="latest"))
    assert config["auto.offset.reset"] == "earliest"  # "latest" would skip the rest of the partition
    assert config["enable.partition.eof"] is True


def test_a_range_reader_reads_ahead_less_and_waits_less_than_a_partitions_worker() -> None:
    worker, shared = client_profiles.worker_consumer(settings()), client_profiles.shared_consumer(settings())
    assert shared["queued.max.messages.kbytes"] < worker["queued.max.messages.kbytes"]
    assert shared["fetch.wait.max.ms"] < worker["fetch.wait.max.ms"]


def test_the_coordination_writer_gives_up_within_the_write_timeout_and_reports_its_traffic() -> None:
    config = client_profiles.coordination_writer(settings(write_timeout=7.5), _statistics)
    assert config["message.timeout.ms"] == 7500
    assert config["linger.ms"] == 0
    assert config["stats_cb"] is _statistics
    assert config["statistics.interval.ms"] == client_profiles.STATISTICS_INTERVAL_MS


def test_the_coordination_reader_fetches_with_the_configured_wait_and_never_less_than_a_millisecond() -> None:
    assert (
        client_profiles.coordination_reader(settings(coordination_fetch_wait=0.02), "tail")["fetch.wait.max.ms"] == 20
    )
    assert (
        client_profiles.coordination_reader(settings(coordination_fetch_wait=0.0001), "tail")["fetch.wait.max.ms"] == 1
    )


def test_the_offset_keeper_hears_how_each_commit_went() -> None:
    assert client_profiles.offset_keeper(settings(), _committed)["on_commit"] is _committed


# ---------------------------------------------------------------- every client takes a profile

CLIENTS = {"Consumer", "Producer", "AdminClient", "GuardedConsumer"}
# Where a client is made from settings that are not a profile's, and why.
NOT_FROM_A_PROFILE = {
    "kafka/guarded_consumer.py",  # makes its Consumer from the profile its caller gave it (and again with a longer wait)
    "core/librdkafka_check.py",  # throw-away clients that check the user's passthrough, connecting nowhere
}


def makes_a_client(call: ast.Call) -> bool:
    """A call of a client class, or of a worker's ``edges.consumer`` (runtime/worker/process.py: GuardedConsumer, or a
    test's fake)."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in CLIENTS
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value.attr if isinstance(func.value, ast.Attribute) else getattr(func.value, "id", "")
    return func.attr in CLIENTS or (func.attr == "consumer" and owner.endswith("edges"))


def client_constructions() -> list[tuple[str, int, ast.Call]]:
    """Every call that makes a Kafka client in the package: (module path, line, call)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and makes_a_client(node):
                found.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    return found


def from_a_profile(call: ast.Call) -> bool:
    """The client's settings are the result of a client_profiles function, as it returned them."""
    config = call.args[0] if call.args else None
    return (
        isinstance(config, ast.Call)
        and isinstance(config.func, ast.Attribute)
        and isinstance(config.func.value, ast.Name)
        and config.func.value.id == "client_profiles"
    )


def test_every_kafka_client_the_package_makes_takes_its_settings_from_a_profile() -> None:
    made = client_constructions()
    assert len(made) > 15  # the walk found the package's clients
    elsewhere = [
        f"{path}:{line}" for path, line, call in made if path not in NOT_FROM_A_PROFILE and not from_a_profile(call)
    ]
    assert elsewhere == []


def test_the_exceptions_are_still_there_to_be_excepted() -> None:
    # An exception that no longer makes a client would let a new one in unchecked.
    assert {path for path, _, _ in client_constructions()} >= NOT_FROM_A_PROFILE
