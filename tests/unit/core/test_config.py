"""Settings: defaults < TOML file < MARSHAL_WORKERS_* environment < CLI (docs/operations.md).

Every test passes ``env=`` explicitly, so the real environment never leaks in.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest

from marshal_workers.core.config import SETTINGS, Settings, load_settings
from marshal_workers.core.durations import parse_duration, parse_size
from marshal_workers.errors import ConfigError


def write_toml(tmp_path: Path, text: str, name: str = "marshal-workers.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------- defaults


def test_defaults() -> None:
    settings = load_settings(env={})
    assert settings.brokers == "127.0.0.1:9092"
    assert settings.group is None
    assert settings.client_id == socket.gethostname()
    assert settings.heartbeat_interval == 5.0
    assert settings.heartbeat_ms == 5000
    assert settings.coordination_topic == "__marshal"
    assert settings.coordination_partitions == 8
    assert settings.coordination_replication_factor == -1
    assert settings.connect_timeout == 10.0
    assert settings.write_timeout == 10.0
    assert settings.log_level == "info"
    assert dict(settings.kafka) == {}
    # Every server listens on this host only unless told otherwise: /state shows the supervisor's whole state.
    assert settings.metrics_host == settings.dashboard_host == settings.serve_host == "127.0.0.1"


def test_unrelated_environment_variables_are_ignored() -> None:
    settings = load_settings(env={"PATH": "/bin", "MARSHAL_WORKERS": "x", "GROUP": "nope"})
    assert settings == load_settings(env={})


# --------------------------------------------------------------- precedence


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
        group = "from-file"
        brokers = "file:9092"
        log_level = "debug"
        heartbeat_interval = "7s"
        """,
    )
    env = {
        "MARSHAL_WORKERS_GROUP": "from-env",
        "MARSHAL_WORKERS_BROKERS": "env:9092",
        "MARSHAL_WORKERS_HEARTBEAT_INTERVAL": "3s",
    }
    cli = {"group": "from-cli", "heartbeat_interval": "1s"}
    settings = load_settings(path, cli=cli, env=env)
    assert settings.group == "from-cli"  # CLI beats env and file
    assert settings.heartbeat_interval == 1.0  # CLI beats env and file
    assert settings.brokers == "env:9092"  # env beats file
    assert settings.log_level == "debug"  # file beats default
    assert settings.coordination_topic == "__marshal"  # default


def test_cli_none_means_not_given(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'brokers = "file:9092"\n')
    settings = load_settings(
        path, cli={"group": None, "brokers": None, "log_level": None}, env={"MARSHAL_WORKERS_GROUP": "g"}
    )
    assert settings.group == "g"
    assert settings.brokers == "file:9092"
    assert settings.log_level == "info"


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'group = "from-file"\n')
    assert load_settings(env={"MARSHAL_WORKERS_CONFIG": path}).group == "from-file"


def test_config_file_argument_beats_config_file_from_environment(tmp_path: Path) -> None:
    cli_path = write_toml(tmp_path, 'group = "from-argument"\n', "a.toml")
    env_path = write_toml(tmp_path, 'group = "from-env-file"\n', "b.toml")
    assert load_settings(cli_path, env={"MARSHAL_WORKERS_CONFIG": env_path}).group == "from-argument"


def test_every_setting_can_come_from_each_source(tmp_path: Path) -> None:
    values = {
        "brokers": "k1:9092,k2:9092",
        "group": "g",
        "client_id": "host-7",
        "heartbeat_interval": "2s",
        "coordination_topic": "__coord",
        "coordination_partitions": "16",
        "coordination_replication_factor": "3",
        "connect_timeout": "30s",
        "write_timeout": "4s",
        "log_level": "warning",
        "max_partitions": "4",
        "processes": "6",
        "shutdown_timeout": "1m",
        "auto_offset_reset": "latest",
        "crash_limit": "2",
        "sick_cooldown": "90s",
        "coordination_fetch_wait": "50ms",
        "checkpoint_interval": "2m",
        "coordination_retention": "3d",
        "release_if_behind": "false",
        "behind_cycles": "9",
        "worker_nice": "5",
        "max_messages_per_worker": "1000",
        "max_memory_per_worker": "512MB",
        "log_format": "json",
        "balance": "fair",
        "soft_time_limit": "20s",
        "time_limit": "1m",
        "metrics_port": "9400",
        "metrics_host": "0.0.0.0",
        "dashboard": "true",
        "dashboard_port": "8080",
        "dashboard_host": "0.0.0.0",
        "drain_target": "2m",
        "serve_topic": "jobs",
        "serve_port": "8081",
        "serve_host": "0.0.0.0",
        "serve_token": "t0ken",
        "serve_token_file": "/run/token",
        "serve_pending_timeout": "45s",
        "serve_max_deliveries": "3",
        "serve_range_size": "50",
        "serve_dlq_topic": "jobs.dead",
        "serve_tls_cert": "/etc/cert.pem",
        "serve_tls_key": "/etc/key.pem",
    }
    assert set(values) == set(SETTINGS), "update this test when a setting is added"
    expected = {
        "brokers": "k1:9092,k2:9092",
        "group": "g",
        "client_id": "host-7",
        "heartbeat_interval": 2.0,
        "coordination_topic": "__coord",
        "coordination_partitions": 16,
        "coordination_replication_factor": 3,
        "connect_timeout": 30.0,
        "write_timeout": 4.0,
        "log_level": "warning",
        "max_partitions": 4,
        "processes": 6,
        "shutdown_timeout": 60.0,
        "auto_offset_reset": "latest",
        "crash_limit": 2,
        "sick_cooldown": 90.0,
        "coordination_fetch_wait": 0.05,
        "checkpoint_interval": 120.0,
        "coordination_retention": 259200.0,
        "release_if_behind": False,
        "behind_cycles": 9,
        "worker_nice": 5,
        "max_messages_per_worker": 1000,
        "max_memory_per_worker": 512 * 2**20,
        "log_format": "json",
        "balance": "fair",
        "soft_time_limit": 20.0,
        "time_limit": 60.0,
        "metrics_port": 9400,
        "metrics_host": "0.0.0.0",
        "dashboard": True,
        "dashboard_port": 8080,
        "dashboard_host": "0.0.0.0",
        "drain_target": 120.0,
        "serve_topic": "jobs",
        "serve_port": 8081,
        "serve_host": "0.0.0.0",
        "serve_token": "t0ken",
        "serve_token_file": "/run/token",
        "serve_pending_timeout": 45.0,
        "serve_max_deliveries": 3,
        "serve_range_size": 50,
        "serve_dlq_topic": "jobs.dead",
        "serve_tls_cert": "/etc/cert.pem",
        "serve_tls_key": "/etc/key.pem",
    }
    toml = "".join(f'{name} = "{value}"\n' for name, value in values.items())
    from_file = load_settings(write_toml(tmp_path, toml), env={})
    from_env = load_settings(env={f"MARSHAL_WORKERS_{name.upper()}": value for name, value in values.items()})
    from_cli = load_settings(cli=values, env={})
    for settings in (from_file, from_env, from_cli):
        assert {name: getattr(settings, name) for name in SETTINGS} == expected


def test_toml_native_types(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "coordination_partitions = 12\nheartbeat_interval = 0.25\nconnect_timeout = 3\n")
    settings = load_settings(path, env={})
    assert settings.coordination_partitions == 12
    assert settings.heartbeat_interval == 0.25
    assert settings.heartbeat_ms == 250
    assert settings.connect_timeout == 3.0


# ----------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        (" 5s ", 5.0),
        ("3", 3.0),
        (7, 7.0),
        (0.5, 0.5),
    ],
)
def test_durations(value: Any, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)
    assert load_settings(cli={"heartbeat_interval": value}, env={}).heartbeat_interval == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "milliseconds"),
    [
        ("250ms", 250),
        ("5s", 5000),
        ("2m", 120_000),
        ("4007ms", 4007),
        ("1.001s", 1001),
    ],
)
def test_heartbeat_ms_is_the_interval_that_was_written(value: Any, milliseconds: int) -> None:
    # HB is group-wide and every member must agree on it: "4007ms" must mean 4007 ms, not 4006.
    assert load_settings(cli={"heartbeat_interval": value}, env={}).heartbeat_ms == milliseconds


BAD_DURATIONS = [
    "5x",
    "-1s",
    "0",
    "0s",
    "",
    "s",
    "ms5",
    "5 sec",
    "1.2.3s",
    "forever",
    True,
    False,
    0,
    -1,
    -0.5,
    "0.5ms",
    0.0001,
]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_bad_durations_are_rejected(value: Any) -> None:
    with pytest.raises(ConfigError):
        parse_duration(value)


@pytest.mark.parametrize("value", BAD_DURATIONS)
@pytest.mark.parametrize("name", ["heartbeat_interval", "connect_timeout", "write_timeout"])
def test_bad_duration_error_names_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings(cli={name: value}, env={})


@pytest.mark.parametrize("value", ["5x", "-1s", "0"])
def test_bad_duration_from_environment_names_setting_and_source(value: str) -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval") as info:
        load_settings(env={"MARSHAL_WORKERS_HEARTBEAT_INTERVAL": value})
    assert "environment" in str(info.value)


@pytest.mark.parametrize("value", ['"5x"', "true", "0", '"-1s"'])
def test_bad_duration_from_file_names_setting_and_file(tmp_path: Path, value: str) -> None:
    path = write_toml(tmp_path, f"heartbeat_interval = {value}\n")
    with pytest.raises(ConfigError, match="heartbeat_interval") as info:
        load_settings(path, env={})
    assert path in str(info.value)


def test_nan_duration_in_file_is_rejected(tmp_path: Path) -> None:
    # TOML has a nan literal; a NaN heartbeat makes every age comparison false.
    path = write_toml(tmp_path, "heartbeat_interval = nan\n")
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        load_settings(path, env={})


# -------------------------------------------------------- other bad values


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("coordination_partitions", "0"),
        ("coordination_partitions", "abc"),
        ("coordination_partitions", "1.5"),
        ("coordination_partitions", True),
        ("coordination_replication_factor", "-2"),
        ("log_level", "verbose"),
        ("group", ""),
        ("brokers", "   "),
    ],
)
def test_bad_values_name_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings(cli={name: value}, env={})


def test_log_level_is_case_insensitive() -> None:
    assert load_settings(env={"MARSHAL_WORKERS_LOG_LEVEL": "DEBUG"}).log_level == "debug"


# ------------------------------------------------------------------- files


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'group = "g"\nheartbeat_intervall = "5s"\n')
    with pytest.raises(ConfigError, match="heartbeat_intervall") as info:
        load_settings(path, env={})
    assert path in str(info.value)


def test_misspelled_table_in_file_is_named(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafak]\n"sasl.password" = "x"\n')
    with pytest.raises(ConfigError, match="kafak"):
        load_settings(path, env={})


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "group = \n[[[\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert path in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = str(tmp_path / "does-not-exist.toml")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert path in str(info.value)


def test_missing_file_named_by_environment_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_settings(env={"MARSHAL_WORKERS_CONFIG": str(tmp_path / "nope.toml")})


# -------------------------------------------------------- librdkafka passthrough


def test_kafka_table_from_file(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
        group = "g"
        [kafka]
        "security.protocol" = "SASL_SSL"
        "sasl.mechanism" = "PLAIN"
        "sasl.username" = "alice"
        "sasl.password" = "file-secret"
        "enable.idempotence" = true
        "message.max.bytes" = 1000000
        """,
    )
    settings = load_settings(path, env={})
    assert dict(settings.kafka) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "file-secret",
        "enable.idempotence": "true",  # librdkafka wants "true", not Python's "True"
        "message.max.bytes": "1000000",
    }
    assert settings.group == "g"


def test_kafka_environment_variables() -> None:
    settings = load_settings(
        env={
            "MARSHAL_WORKERS_KAFKA_SASL_PASSWORD": "env-secret",
            "MARSHAL_WORKERS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "MARSHAL_WORKERS_KAFKA_SASL_MECHANISM": "PLAIN",  # librdkafka's default, GSSAPI, is not in its wheels
            "MARSHAL_WORKERS_KAFKA_SASL_USERNAME": "alice",
        }
    )
    assert dict(settings.kafka) == {
        "sasl.password": "env-secret",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
    }


def test_kafka_environment_beats_kafka_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafka]\n"sasl.password" = "file-secret"\n"sasl.username" = "alice"\n')
    settings = load_settings(path, env={"MARSHAL_WORKERS_KAFKA_SASL_PASSWORD": "env-secret"})
    assert settings.kafka["sasl.password"] == "env-secret"
    assert settings.kafka["sasl.username"] == "alice"


def test_kafka_that_is_not_a_table_is_a_config_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'kafka = "sasl.password=x"\n')
    with pytest.raises(ConfigError, match="kafka"):
        load_settings(path, env={})


def test_kafka_redacted_masks_secrets() -> None:
    kafka = {
        "bootstrap.servers": "k1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.username": "alice",
        "sasl.password": "pw-1",
        "ssl.key.password": "pw-2",
        "ssl.keystore.password": "pw-3",
        "sasl.oauthbearer.client.secret": "pw-4",
        "sasl.jaas.config": "pw-5",
        "ssl.key.pem": "pw-6",
        "SASL.PASSWORD.UPPER": "pw-7",
    }
    settings = dataclasses.replace(Settings(), kafka=dict(kafka))
    redacted = settings.kafka_redacted()
    assert set(redacted) == set(kafka)
    assert redacted["bootstrap.servers"] == "k1:9092"
    assert redacted["security.protocol"] == "SASL_SSL"
    assert redacted["sasl.username"] == "alice"
    for n in range(1, 8):
        assert f"pw-{n}" not in repr(redacted)
    assert settings.kafka == kafka, "redacting must not change the settings used to connect"
    shown = repr(settings)
    assert "sasl.username': 'alice'" in shown and "group=None" in shown
    assert not any(f"pw-{n}" in shown for n in range(1, 8)), "a Settings repr never shows a secret"


# ------------------------------------------------------------------- helpers


def test_require_group() -> None:
    with pytest.raises(ConfigError, match="--group"):
        load_settings(env={}).require_group()
    assert load_settings(env={"MARSHAL_WORKERS_GROUP": "billing"}).require_group() == "billing"


def test_settings_given_in_code_replace_the_defaults_and_everything_else_overrides_them(tmp_path: Path) -> None:
    app_defaults = {"group": "from-code", "max_partitions": 2, "heartbeat_interval": "3s"}
    assert load_settings(env={}, app_defaults=app_defaults).max_partitions == 2
    path = write_toml(tmp_path, "max_partitions = 5\n")
    settings = load_settings(path, env={"MARSHAL_WORKERS_GROUP": "from-env"}, app_defaults=app_defaults)
    assert (settings.group, settings.max_partitions, settings.heartbeat_interval) == ("from-env", 5, 3.0)


def test_app_settings_are_defaults_that_env_and_cli_override() -> None:
    from marshal_workers import App

    app = App(group="g", max_partitions=2)
    settings = load_settings(env={}, app_defaults=app.settings)
    assert (settings.group, settings.max_partitions) == ("g", 2)
    assert settings.brokers == "127.0.0.1:9092"  # untouched settings keep the built-in defaults

    from_env = load_settings(
        env={"MARSHAL_WORKERS_GROUP": "env-group", "MARSHAL_WORKERS_MAX_PARTITIONS": "7"}, app_defaults=app.settings
    )
    assert (from_env.group, from_env.max_partitions) == ("env-group", 7)

    from_cli = load_settings(
        cli={"group": "cli-group", "max_partitions": 0},
        env={"MARSHAL_WORKERS_GROUP": "env-group", "MARSHAL_WORKERS_MAX_PARTITIONS": "7"},
        app_defaults=app.settings,
    )
    assert (from_cli.group, from_cli.max_partitions) == ("cli-group", 0)
    assert app.settings == {"group": "g", "max_partitions": 2}, "loading settings must not change the App"


@pytest.mark.parametrize(
    ("text", "size"), [("0", 0), ("512", 512), ("64k", 64 * 2**10), ("512MB", 512 * 2**20), ("1.5 GiB", 3 * 2**29)]
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "size"), [("0", 0), ("1MB", 2**20), ("1048576", 2**20), ("512MB", 512 * 2**20)])
def test_memory_limits(text: str, size: int) -> None:
    assert load_settings(env={"MARSHAL_WORKERS_MAX_MEMORY_PER_WORKER": text}).max_memory_per_worker == size


def test_a_memory_limit_without_a_unit_under_1mb_is_refused_with_a_hint() -> None:
    with pytest.raises(
        ConfigError, match=r"max_memory_per_worker in the command line: 512 is 512 bytes.*did you mean 512MB\?"
    ):
        load_settings(cli={"max_memory_per_worker": "512"}, env={})
    with pytest.raises(ConfigError, match=r"64k is 65536 bytes.*at least 1MB"):
        load_settings(env={"MARSHAL_WORKERS_MAX_MEMORY_PER_WORKER": "64k"})


@pytest.mark.parametrize("text", ["lots", "-1MB", "5 TB", "MB"])
def test_bad_sizes_are_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="max_memory_per_worker"):
        load_settings(env={"MARSHAL_WORKERS_MAX_MEMORY_PER_WORKER": text})


# ------------------------------------------- librdkafka settings by kind of client


def test_consumer_and_producer_sections_reach_only_their_kind_of_client(tmp_path: Path) -> None:
    from marshal_workers.kafka.client_profiles import client_config

    path = write_toml(
        tmp_path,
        """
        [kafka]
        "security.protocol" = "SASL_SSL"
        "sasl.mechanism" = "PLAIN"
        "sasl.username" = "alice"
        "sasl.password" = "secret"
        [kafka.consumer]
        "fetch.min.bytes" = 4096
        "isolation.level" = "read_committed"
        [kafka.producer]
        "compression.type" = "zstd"
        """,
    )
    settings = load_settings(path, env={})
    consumer, producer, admin = (client_config(settings, role) for role in ("consumer", "producer", "admin"))
    assert consumer["fetch.min.bytes"] == "4096" and consumer["isolation.level"] == "read_committed"
    assert "fetch.min.bytes" not in producer and "isolation.level" not in producer
    assert producer["compression.type"] == "zstd" and "compression.type" not in consumer
    assert not {"fetch.min.bytes", "compression.type"} & set(admin)
    assert consumer["security.protocol"] == producer["security.protocol"] == admin["security.protocol"] == "SASL_SSL"


def test_a_consumer_only_property_under_plain_kafka_reaches_consumers_only(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafka]\n"fetch.min.bytes" = 4096\n"linger.ms" = 7\n"client.rack" = "r1"\n')
    settings = load_settings(path, env={})
    assert settings.kafka_for("consumer") == {"fetch.min.bytes": "4096", "client.rack": "r1"}
    assert settings.kafka_for("producer") == {"linger.ms": "7", "client.rack": "r1"}
    assert settings.kafka_for("admin") == {"client.rack": "r1"}


def test_a_property_in_the_wrong_section_is_refused_naming_the_right_one(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafka.producer]\n"fetch.min.bytes" = 4096\n')
    with pytest.raises(
        ConfigError,
        match=r"fetch.min.bytes under \[kafka.producer\] only applies to consumers: "
        r"put it under \[kafka.consumer\]",
    ):
        load_settings(path, env={})


def test_consumer_and_producer_settings_from_the_environment() -> None:
    settings = load_settings(
        env={
            "MARSHAL_WORKERS_KAFKA_CONSUMER_FETCH_MIN_BYTES": "4096",
            "MARSHAL_WORKERS_KAFKA_PRODUCER_LINGER_MS": "7",
            "MARSHAL_WORKERS_KAFKA_CLIENT_RACK": "r1",
        }
    )
    assert (dict(settings.kafka_consumer), dict(settings.kafka_producer)) == (
        {"fetch.min.bytes": "4096"},
        {"linger.ms": "7"},
    )
    assert dict(settings.kafka) == {"client.rack": "r1"}


def test_an_unquoted_dotted_name_under_kafka_is_a_clear_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[kafka]\nsasl.username = 'alice'\n")
    with pytest.raises(ConfigError, match="in quotes"):
        load_settings(path, env={})


def test_secrets_of_the_consumer_and_producer_sections_are_never_shown() -> None:
    settings = dataclasses.replace(
        Settings(), kafka_consumer={"sasl.password": "pw-1"}, kafka_producer={"ssl.key.password": "pw-2"}
    )
    assert "pw-1" not in repr(settings) and "pw-2" not in repr(settings)


def test_a_producer_built_from_settings_with_consumer_properties_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import Producer

    from marshal_workers.kafka.client_profiles import client_config

    path = write_toml(
        tmp_path, '[kafka]\n"fetch.min.bytes" = 4096\n[kafka.consumer]\n"isolation.level" = "read_committed"\n'
    )
    settings = dataclasses.replace(load_settings(path, env={}), brokers="127.0.0.1:1")  # never connects
    with caplog.at_level("WARNING", logger="marshal_workers.librdkafka"):
        producer = Producer(client_config(settings, "producer"))
        producer.poll(0.3)  # librdkafka's log lines are served by poll
        # The same property passed straight to a producer does warn: the check above can see a warning.
        warned = Producer(client_config(settings, "producer") | {"fetch.min.bytes": "4096"})
        warned.poll(0.3)
    warnings = [r.getMessage() for r in caplog.records if "CONFWARN" in r.getMessage()]
    assert len(warnings) == 1 and "fetch.min.bytes" in warnings[0], warnings


@pytest.mark.parametrize("value", ["1ms", "10ms", "249ms", 0.1, "0.2s"])
def test_a_heartbeat_interval_below_the_floor_is_refused_with_the_reason(value: Any) -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval") as info:
        load_settings(cli={"heartbeat_interval": value}, env={})
    assert "250ms" in str(info.value) and "every member of every group" in str(info.value)


def test_the_heartbeat_floor_itself_is_accepted() -> None:
    assert load_settings(cli={"heartbeat_interval": "250ms"}, env={}).heartbeat_ms == 250


def test_worker_nice_is_a_nice_increment_from_0_to_19_and_10_by_default() -> None:
    assert load_settings(env={}).worker_nice == 10
    assert load_settings(env={"MARSHAL_WORKERS_WORKER_NICE": "0"}).worker_nice == 0
    for wrong, said in (("20", "<= 19"), ("-1", ">= 0"), ("low", "whole number")):
        with pytest.raises(ConfigError, match=said):
            load_settings(env={"MARSHAL_WORKERS_WORKER_NICE": wrong})
