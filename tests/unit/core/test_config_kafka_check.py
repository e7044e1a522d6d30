"""librdkafka settings are checked by librdkafka itself when the settings are loaded (Settings.check_kafka): a
mistake is a ConfigError naming the property and where it was given, not a KafkaException once a client is made.

No broker: the check makes each kind of client without bootstrap servers and closes it at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from marshal_workers.core.config import Origin, load_settings, mask_secrets, refusal_message
from marshal_workers.errors import ConfigError


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "marshal-workers.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def refused(path: str | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env or {})
    message = str(caught.value)
    assert "\n" not in message, "one line"
    return message


def test_an_unknown_property_in_kafka_is_named_with_its_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafka]\n"bogus.property" = 1\n')
    message = refused(path)
    assert message.startswith(f'"bogus.property" in [kafka] of {path} is not a librdkafka property: correct its name')
    assert "CONFIGURATION.md" in message


def test_an_unknown_property_in_kafka_consumer_is_named_with_its_section(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[kafka]\n"client.rack" = "r1"\n[kafka.consumer]\n"fetch.min.byte" = 1\n')
    assert refused(path).startswith(f'"fetch.min.byte" in [kafka.consumer] of {path} is not a librdkafka property')


def test_an_unknown_property_in_kafka_producer_from_the_environment_names_the_variable() -> None:
    message = refused(env={"MARSHAL_WORKERS_KAFKA_PRODUCER_LINGER_MSS": "5"})
    assert message.startswith('"linger.mss" in the environment (MARSHAL_WORKERS_KAFKA_PRODUCER_LINGER_MSS) is not')


@pytest.mark.parametrize(
    ("table", "name", "value", "librdkafka_says"),
    [
        ("kafka", "security.protocol", '"TLS"', 'Invalid value "TLS" for configuration property "security.protocol"'),
        ("kafka.producer", "acks", '"banana"', 'configuration property "request.required.acks"'),  # an alias
        ("kafka.consumer", "fetch.min.bytes", '"lots"', 'configuration property "fetch.min.bytes"'),
        ("kafka", "socket.timeout.ms", "-5", "outside allowed range"),
        ("kafka.producer", "enable.idempotence", '"maybe"', 'Expected bool value for "enable.idempotence"'),
    ],
)
def test_a_bad_value_is_named_as_given_with_librdkafkas_reason(
    tmp_path: Path, table: str, name: str, value: str, librdkafka_says: str
) -> None:
    path = write_toml(tmp_path, f'[{table}]\n"{name}" = {value}\n')
    message = refused(path)
    shown = value.strip('"')
    assert message.startswith(f"\"{name}\" = '{shown}' in [{table}] of {path} is refused by librdkafka ("), message
    assert librdkafka_says in message and "give it a value librdkafka takes" in message


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_without_credentials_is_refused_naming_what_is_missing_and_where_the_rest_was_given(
    tmp_path: Path, mechanism: str
) -> None:
    path = write_toml(tmp_path, f'[kafka]\n"security.protocol" = "SASL_PLAINTEXT"\n"sasl.mechanism" = "{mechanism}"\n')
    message = refused(path, env={"MARSHAL_WORKERS_KAFKA_SASL_USERNAME": "alice"})
    assert "sasl.username and sasl.password must be set" in message
    assert f"given in [kafka] of {path} and the environment (MARSHAL_WORKERS_KAFKA_SASL_USERNAME)" in message


def test_secrets_are_never_shown(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        '[kafka]\n"security.protocol" = "SASL_PLAINTEXT"\n"sasl.password" = "pw-in-file"\n"sasl.mechanism" = "PLAIN"\n',
    )
    assert "pw-in-file" not in refused(path)
    # A secret-looking property refused on its own is named, its value is not.
    internal = refused(write_toml(tmp_path, '[kafka]\n"ssl_key" = "pem-secret-text"\n'))
    assert internal.startswith('"ssl_key" in [kafka] of') and "pem-secret-text" not in internal


def test_a_secret_refused_on_its_own_is_named_without_its_value() -> None:
    where = {"sasl.password": Origin("[kafka] of mw.toml"), "sasl.mechanism": Origin("the environment", "MW_X")}
    properties = {"sasl.password": "s3cret-value", "sasl.mechanism": "PLAIN"}
    message = refusal_message("producer", properties, 'Invalid value "***"', "sasl.password", where)
    assert message.startswith('"sasl.password" in [kafka] of mw.toml is refused by librdkafka (Invalid value "***")')
    assert "s3cret-value" not in message


def test_secret_values_in_librdkafkas_words_are_masked_and_others_kept() -> None:
    kafka = {"sasl.password": "pw", "ssl.key.password": "longer-secret", "security.protocol": "TLS"}
    said = 'Invalid value "pw" near longer-secret for "TLS"'
    assert mask_secrets(said, kafka) == 'Invalid value "***" near *** for "TLS"'


def test_good_settings_pass_and_none_cost_nothing(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        '[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "SCRAM-SHA-512"\n"sasl.username" = "a"\n'
        '"sasl.password" = "b"\n"acks" = "all"\n"fetch.min.bytes" = 1\n[kafka.consumer]\n"isolation.level" = '
        '"read_committed"\n[kafka.producer]\n"compression.type" = "zstd"\n',
    )
    assert load_settings(path, env={}).kafka_for("producer")["compression.type"] == "zstd"
    assert load_settings(env={}).kafka == {}


def test_bootstrap_servers_given_in_kafka_pass_the_check_and_reach_the_clients(tmp_path: Path) -> None:
    # The check makes its clients without bootstrap servers (they connect nowhere); the real clients get them.
    path = write_toml(tmp_path, '[kafka]\n"bootstrap.servers" = "nowhere.invalid:9092"\n')
    assert load_settings(path, env={}).kafka_for("admin") == {"bootstrap.servers": "nowhere.invalid:9092"}
