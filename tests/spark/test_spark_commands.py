"""``marshal-workers replay`` and ``audit`` as users run them: real processes, their own Spark, exit codes.

Each successful command starts its own JVM (local[2]); the refusals must come before any Spark starts.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from processes import run_cli
from spark_support import APP, APPS, LogWriter, ReplayApp, create_topic, produce

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.protocol import codec

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one Spark session

SPARK_STARTED = ("Using incubator modules", "SparkContext", "spark ")  # what a JVM of Spark says as it starts


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A Spark command to its end: each starts a JVM of its own, which takes a while on a busy machine."""
    return run_cli(*args, env=env, timeout=180)


@pytest.fixture
def cli_app(tmp_path: Path) -> tuple[ReplayApp, dict[str, str]]:
    """replay_app with topics of its own, and the environment that configures it in the command's workers."""
    app = ReplayApp(prefix=f"cli-{uuid.uuid4().hex[:8]}", sink=tmp_path)
    env = {
        "MW_SPARK_TOPIC_PREFIX": app.prefix,
        "MW_SPARK_SINK_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(p for p in (str(APPS), os.environ.get("PYTHONPATH", "")) if p),
    }
    return app, env


def test_replay_runs_the_handler_over_the_range_and_reports_it(
    cli_app: tuple[ReplayApp, dict[str, str]], kafka_brokers: str
) -> None:
    app, env = cli_app
    topic = app.topic("plain")
    create_topic(kafka_brokers, topic, 2)
    produce(kafka_brokers, topic, {p: [f"{p}-{i}".encode() for i in range(150)] for p in (0, 1)})

    args = ["--topic", topic, "--brokers", kafka_brokers, "--spark-master", "local[2]", "--max-split", "50"]
    result = cli("replay", APP, *args, "--from", "10", "--json", env=env)

    assert result.returncode == ExitCode.OK, result.stderr
    report = orjson.loads(result.stdout)
    assert report["messages"] == 280 and report["topic"] == topic
    assert [(s["partition"], s["start"], s["end"], s["handled"]) for s in report["splits"]] == [
        (p, start, end, end - start) for p in (0, 1) for start, end in ((10, 57), (57, 104), (104, 150))
    ]
    handled = Counter((p, o) for p, o, _, _ in app.lines(topic))
    assert handled == Counter((p, o) for p in (0, 1) for o in range(10, 150))


def test_replay_refuses_a_bad_request_before_spark_starts(
    cli_app: tuple[ReplayApp, dict[str, str]], kafka_brokers: str
) -> None:
    app, env = cli_app
    topic = app.topic("plain")
    base = ["--brokers", kafka_brokers, "--spark-master", "local[2]"]

    unknown = cli("replay", APP, "--topic", topic, *base, env=env)  # the app handles it; Kafka has no such topic
    assert unknown.returncode == ExitCode.UNKNOWN_TOPIC and "does not exist" in unknown.stderr

    create_topic(kafka_brokers, topic, 2)
    produce(kafka_brokers, topic, {0: [b"x"] * 5, 1: [b"y"] * 5})
    beyond = cli("replay", APP, "--topic", topic, "--from", "3", "--to", "9", *base, env=env)
    assert beyond.returncode == ExitCode.BAD_RANGE and "which holds offsets 0..4" in beyond.stderr
    backwards = cli("replay", APP, "--topic", topic, "--from", "@2000", "--to", "@1000", *base, env=env)
    assert backwards.returncode == ExitCode.BAD_RANGE and "is after --to" in backwards.stderr
    unhandled = cli("replay", APP, "--topic", "no-handler", *base, env=env)
    assert unhandled.returncode == ExitCode.CONFIG_ERROR and "has no handler for topic" in unhandled.stderr

    for refused in (unknown, beyond, backwards, unhandled):
        assert not any(sign in refused.stderr for sign in SPARK_STARTED), refused.stderr
        assert "Traceback" not in refused.stderr
    assert app.lines(topic) == [], "nothing was handled"


def test_audit_prints_the_figures_and_writes_the_tables(settings: Settings, unique: str, tmp_path: Path) -> None:
    create_topic(settings.brokers, settings.coordination_topic, settings.coordination_partitions)
    write = LogWriter(settings)
    topic = f"orders-{unique}"
    write(codec.Claim, "a", 0, topic)
    write(codec.Release, "a", 1000, topic, offset=3)
    write(codec.Claim, "b", 1250, topic)
    write(codec.Heartbeat, "a", 1300, topic, offset=3)  # a zombie: b owns it
    options = [
        "--brokers",
        settings.brokers,
        "--group",
        str(settings.group),
        "--coordination-topic",
        settings.coordination_topic,
        "--heartbeat-interval",
        "1s",
        "--spark-master",
        "local[2]",
    ]

    result = cli("audit", *options, "--json", "--out", str(tmp_path / "audit"))

    assert result.returncode == ExitCode.OK, result.stderr
    assert orjson.loads(result.stdout) == {
        "group": settings.group,
        "records": 4,
        "garbage": 0,
        "partitions": 1,
        "handoffs": {"count": 1, "p50_ms": 250.0, "max_ms": 250},
        "zombie_records": 1,
    }
    for table in ("records", "garbage", "ownership", "handoffs", "zombies", "clients"):
        assert (tmp_path / "audit" / table / "_SUCCESS").exists(), table


def test_audit_of_a_missing_coordination_topic_is_refused_before_spark_starts(settings: Settings) -> None:
    result = cli(
        "audit",
        "--brokers",
        settings.brokers,
        "--group",
        str(settings.group),
        "--coordination-topic",
        settings.coordination_topic,
    )
    assert result.returncode == ExitCode.UNKNOWN_GROUP and "does not exist" in result.stderr
    assert not any(sign in result.stderr for sign in SPARK_STARTED), result.stderr
