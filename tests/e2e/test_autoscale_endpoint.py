"""GET /autoscale read as KEDA's metrics-api scaler reads it: the number at a ``valueLocation`` path.

Real broker, real supervisors with a backlog produced before they start; the answer is checked against what the
sink says was handled around the request (docs/operations.md, Autoscaling).
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from fleet import Fleet, free_port
from polling import poll_until
from processes import child_environment, run_cli, run_command

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker

# Positions reach the log at heartbeats (every HB/2, HB = 1s here) and are folded soon after: a position is never
# ahead of what the sink shows at the answer, nor behind what it showed this long before the request.
POSITION_DELAY_S = 3.0


def value_at(document: Any, location: str) -> Any:
    """What KEDA's metrics-api scaler reads: a GJSON path of keys split at dots (``\\.`` is a dot in a key)."""
    for key in re.split(r"(?<!\\)\.", location):
        document = document[key.replace("\\.", ".")]
    return document


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def handled_by(fleet: Fleet, moment: float) -> int:
    """Messages the sink shows handled at ``moment`` (wall clock), each once."""
    return len({(line.partition, line.offset) for line in fleet.lines() if line.at <= moment})


def answer_with_a_rate(fleet: Fleet, url: str) -> tuple[float, dict[str, Any], float]:
    """(time before, the answer, time after) of the first answer that measured the topic's rate, with a backlog."""

    def ask() -> tuple[float, dict[str, Any], float] | None:
        before = time.time()
        try:
            status, found = get(url)
        except OSError:
            return None  # not listening yet
        assert status == 200, found
        topic = found["topics"].get(fleet.topic)
        if topic is None or topic["rate"] is None or not topic["rate"] or not topic["backlog"]:
            return None
        return before, found, time.time()

    return poll_until(ask, timeout=60, interval=0.5, what="an answer with a measured rate")


@pytest.mark.fleet(name="autoscale", partitions=4, env={"MW_TEST_DELAY": "0.02"})
def test_a_whole_partition_backlog_wants_members_up_to_the_partition_count(fleet: Fleet) -> None:
    produced = 8_000
    fleet.produce(range(produced))
    port = free_port()
    fleet.start("only", "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
    url = f"http://127.0.0.1:{port}/autoscale?drain_target=1s"

    before, found, after = answer_with_a_rate(fleet, url)

    topic = value_at(found, f"topics.{fleet.topic}")
    backlog = value_at(found, f"topics.{fleet.topic}.backlog")
    assert produced - handled_by(fleet, after) <= backlog <= produced - handled_by(fleet, before - POSITION_DELAY_S)
    assert (topic["mode"], topic["partitions"], topic["members"], topic["processes"]) == ("partitions", 4, 1, 4)
    # The one member handles `rate` messages/s: draining the backlog within 1 s takes far more than 4 members,
    # and 4 partitions can use no more than 4.
    assert backlog / topic["rate"] > 4, "the backlog takes the member more than 4 s: the cap is what answers"
    assert value_at(found, f"topics.{fleet.topic}.workers_wanted") == 4
    assert value_at(found, "workers_wanted") == 4, "the group's answer: the most any topic wants"
    relaxed = get(f"http://127.0.0.1:{port}/autoscale?drain_target=1h")[1]["topics"][fleet.topic]
    expected = math.ceil(relaxed["backlog"] / (relaxed["rate"] / relaxed["members"] * 3600))
    assert relaxed["workers_wanted"] == min(4, max(1, expected))

    status, refused = get(f"http://127.0.0.1:{port}/autoscale?drain_target=soon")
    assert status == 400 and "drain_target" in refused["error"]


@pytest.mark.fleet(
    name="autoscale-shared",
    partitions=1,
    env={"MW_TEST_SHARED": "1", "MW_TEST_DELAY": "0.01", "MW_TEST_RANGE_SIZE": "20", "MW_TEST_ADAPTIVE_RANGES": "0"},
)
def test_a_shared_backlog_wants_processes_beyond_the_partitions_from_the_dashboard_and_status(
    fleet: Fleet, tmp_path: Path
) -> None:
    produced = 10_000  # some 50 s of work for the 2 processes: a backlog through both answers
    fleet.produce(range(produced))
    fleet.start("only", "--processes", "2")
    poll_until(lambda: fleet.lines(), timeout=60, what="the shared workers to start")
    port = free_port()
    with open(tmp_path / "dashboard.log", "wb") as log:
        dashboard = subprocess.Popen(
            fleet.command("dashboard", "--port", str(port), "--drain-target", "1s"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_environment({"MARSHAL_WORKERS_PROCESSES": "2"}),
            start_new_session=True,
        )
    try:
        poll_until(lambda: dashboard.poll() is not None or _answers(port), timeout=60, what="the dashboard")
        assert dashboard.poll() is None, (tmp_path / "dashboard.log").read_text()
        found_before_after = answer_with_a_rate(fleet, f"http://127.0.0.1:{port}/autoscale")
    finally:
        os.killpg(dashboard.pid, signal.SIGKILL)
        dashboard.wait(timeout=30)
    before, found, after = found_before_after

    topic = value_at(found, f"topics.{fleet.topic}")
    # A shared partition's position is its low-water mark and what is done above it, acked a range (20) at a time
    # by each of the 2 processes: what they handled of the ranges they hold is not in it yet.
    in_ranges = 2 * 20
    lowest = produced - handled_by(fleet, after)
    assert lowest <= topic["backlog"] <= produced - handled_by(fleet, before - POSITION_DELAY_S) + in_ranges
    assert (topic["mode"], topic["partitions"], topic["members"], topic["processes_per_member"]) == ("shared", 1, 1, 2)
    assert found["drain_target_s"] == 1.0
    assert topic["processes_wanted"] > topic["partitions"], "not capped by the partition count"
    assert topic["processes_wanted"] == math.ceil(topic["backlog"] / (topic["rate"] / topic["processes"] * 1.0))
    assert value_at(found, f"topics.{fleet.topic}.workers_wanted") == math.ceil(topic["processes_wanted"] / 2)

    result = run_command(
        fleet.command("status", "--autoscale", "--json", "--drain-target", "1s"), {"MARSHAL_WORKERS_PROCESSES": "2"}
    )
    assert result.returncode == 0, result.stderr
    printed = orjson.loads(result.stdout)
    assert value_at(printed, f"topics.{fleet.topic}.processes_per_member") == 2
    assert value_at(printed, f"topics.{fleet.topic}.rate") > 0, "status watched the group for a heartbeat interval"
    assert printed["drain_target_s"] == 1.0


def _answers(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/autoscale")[0] == 200
    except OSError:
        return False


def test_status_refuses_a_drain_target_that_is_not_a_duration_in_one_line() -> None:
    result = run_cli("status", "--group", "g", "--autoscale", "--drain-target", "soon")
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    assert result.stderr.splitlines() == [
        "error: drain_target in the command line: expected a duration such as 5s, 250ms, 2m or 1h, got 'soon'"
    ]
