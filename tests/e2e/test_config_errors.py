"""Mistakes a user makes on the first day, through the real command line: each is one line on stderr and a named
exit code before anything starts, never a traceback, and never an empty answer that looks healthy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import processes
import pytest

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_writer import Coordinator

ROOT = Path(__file__).resolve().parents[2]
NOBODY = "127.0.0.1:1"  # no broker: a command that tried to connect would exit 4, not 3

# Every command that loads settings, with what else it needs to get that far.
COMMANDS = {
    "run": ["run", "examples.quickstart:app"],
    "serve": ["serve", "--topic", "orders"],
    "status": ["status"],
    "log": ["log"],
    "admin": ["admin", "pause", "--for", "5m"],
    "dlq": ["dlq", "list", "--topic", "orders"],
}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command in the repository's root (where examples/ is importable)."""
    return processes.run_cli(*args, env=env, cwd=ROOT)


def assert_one_line_config_error(result: subprocess.CompletedProcess[str], *named: str) -> str:
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    assert "Traceback" not in result.stderr and "KafkaException" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ")
    for words in named:
        assert words in line, line
    return line


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unknown_librdkafka_property_in_the_config_file_is_named_before_anything_starts(
    command: str, tmp_path: Path
) -> None:
    config = tmp_path / "mw.toml"
    config.write_text(f'group = "g"\nbrokers = "{NOBODY}"\n[kafka]\n"bogus.property" = 1\n')
    result = run_cli(*COMMANDS[command], "--config", str(config))
    assert_one_line_config_error(result, '"bogus.property"', f"[kafka] of {config}", "not a librdkafka property")


@pytest.mark.parametrize("command", ["run", "status"])
def test_sasl_without_credentials_from_the_environment_is_named_and_no_secret_is_shown(command: str) -> None:
    env = {
        "MARSHAL_WORKERS_GROUP": "g",
        "MARSHAL_WORKERS_BROKERS": NOBODY,
        "MARSHAL_WORKERS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MARSHAL_WORKERS_KAFKA_SASL_MECHANISM": "PLAIN",
        "MARSHAL_WORKERS_KAFKA_SASL_PASSWORD": "hunter2-never-shown",  # a password, but no user name
    }
    result = run_cli(*COMMANDS[command], env=env)
    line = assert_one_line_config_error(result, "sasl.username and sasl.password must be set", "the environment")
    assert "hunter2-never-shown" not in line


def test_a_bad_value_of_a_consumer_property_is_named_with_its_section(tmp_path: Path) -> None:
    config = tmp_path / "mw.toml"
    config.write_text(f'group = "g"\nbrokers = "{NOBODY}"\n[kafka.consumer]\n"isolation.level" = "sometimes"\n')
    result = run_cli("status", "--config", str(config))
    assert_one_line_config_error(result, '"isolation.level"', f"[kafka.consumer] of {config}", "refused by librdkafka")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "dlq"])  # (dlq takes no --heartbeat-interval)
def test_a_heartbeat_interval_below_the_floor_is_refused_with_the_reason(command: str) -> None:
    result = run_cli(*COMMANDS[command], "--group", "g", "--brokers", NOBODY, "--heartbeat-interval", "10ms")
    assert_one_line_config_error(
        result,
        "heartbeat_interval in the command line",
        "'10ms'",
        "250ms",
        "every member of every group on the coordination topic",
    )
    from_the_environment = run_cli(
        *COMMANDS[command],
        env={
            "MARSHAL_WORKERS_GROUP": "g",
            "MARSHAL_WORKERS_BROKERS": NOBODY,
            "MARSHAL_WORKERS_HEARTBEAT_INTERVAL": "0.1",
        },
    )
    assert_one_line_config_error(from_the_environment, "heartbeat_interval in the environment", "250ms")


@pytest.fixture
def other_group(settings: Settings) -> Settings:
    """A coordination topic where one group (``settings.group``) has records."""
    with Coordinator(settings) as member:
        assert member.claim("orders", 0) and member.release("orders", 0, 3)
    return settings


def typo_options(settings: Settings) -> list[str]:
    return [
        "--brokers",
        settings.brokers,
        "--group",
        f"{settings.group}-typo",
        "--coordination-topic",
        settings.coordination_topic,
    ]


def assert_unknown_group(result: subprocess.CompletedProcess[str], settings: Settings) -> None:
    assert result.returncode == ExitCode.UNKNOWN_GROUP, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert f"group '{settings.group}-typo' has no record in {settings.coordination_topic}" in line, line
    assert "check --group and --coordination-topic" in line


@pytest.mark.broker
def test_status_of_a_mistyped_group_exits_as_the_admin_commands_do(other_group: Settings) -> None:
    table = run_cli("status", *typo_options(other_group))
    assert_unknown_group(table, other_group)
    assert "no record of this group" in table.stdout

    document = run_cli("status", *typo_options(other_group), "--json")
    assert_unknown_group(document, other_group)
    empty = {"group": f"{other_group.group}-typo", "paused_until": None, "partitions": []}
    assert orjson.loads(document.stdout) == empty

    admin = run_cli("admin", "pause", "--for", "5m", *typo_options(other_group))
    assert admin.returncode == document.returncode == table.returncode


@pytest.mark.broker
def test_log_of_a_mistyped_group_exits_as_the_admin_commands_do_even_when_following(other_group: Settings) -> None:
    result = run_cli("log", *typo_options(other_group))
    assert_unknown_group(result, other_group)
    assert result.stdout == "", "another group's records are not shown"
    following = run_cli("log", "--follow", *typo_options(other_group))
    assert_unknown_group(following, other_group)

    known = run_cli(
        "log", *typo_options(other_group)[:3], other_group.group, "--coordination-topic", other_group.coordination_topic
    )
    assert known.returncode == ExitCode.OK, known.stderr
    assert " claim " in known.stdout and " release " in known.stdout


@pytest.mark.broker
def test_status_and_log_on_a_missing_coordination_topic_exit_as_for_an_unknown_group(settings: Settings) -> None:
    for command in (["status", "--json"], ["log"]):
        result = run_cli(
            *command,
            "--brokers",
            settings.brokers,
            "--group",
            f"{settings.group}-typo",
            "--coordination-topic",
            settings.coordination_topic,
        )
        assert_unknown_group(result, settings)
