"""Operator commands against running supervisors: pause, set-position, log."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from fleet import Fleet
from polling import poll_until
from processes import child_environment, group_command, run_command

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker


def handled_at_least(fleet: Fleet, times: int, count: int) -> bool:
    counts = fleet.counts()
    return len(counts) == count and min(counts.values()) >= times


def test_set_position_rewinds_a_running_group(fleet: Fleet) -> None:
    fleet.start("only")
    fleet.produce(range(800))
    poll_until(lambda: handled_at_least(fleet, 1, 800), what="every message once")

    result = fleet.run("admin", "set-position", "--topic", fleet.topic, "--offset", "0")
    assert result.returncode == ExitCode.OK, result.stderr
    assert f"{fleet.topic}[7] -> 0" in result.stdout and "resumed" in result.stdout
    poll_until(lambda: handled_at_least(fleet, 2, 800), timeout=60, what="every message again, from offset 0")
    assert max(fleet.counts().values()) == 2


def test_set_position_by_partition_and_latest(fleet: Fleet) -> None:
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: handled_at_least(fleet, 1, 80), what="every message once")
    result = fleet.run("admin", "set-position", "--topic", fleet.topic, "--partition", "2", "--earliest")
    assert result.returncode == ExitCode.OK, result.stderr
    poll_until(lambda: all(fleet.counts()[str(n)] == 2 for n in range(2, 80, 8)), timeout=60, what="partition 2 again")
    assert all(fleet.counts()[str(n)] == 1 for n in range(80) if n % 8 != 2), "other partitions are untouched"


def test_a_pause_stops_the_group_until_it_expires(fleet: Fleet) -> None:
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: handled_at_least(fleet, 1, 80), what="every message once")
    result = fleet.run("admin", "pause", "--for", "5s")
    paused_at = time.time()
    assert result.returncode == ExitCode.OK, result.stderr
    assert "paused until" in result.stdout
    poll_until(lambda: fleet.worker_pids("only") == {}, timeout=10, what="the workers to stop")
    fleet.produce(range(80, 160))
    poll_until(lambda: handled_at_least(fleet, 1, 160), timeout=60, what="the rest, after the pause")
    late = [line for line in fleet.lines() if int(line.value) >= 80]
    assert min(line.at for line in late) >= paused_at + 4.0, "nothing is handled while the group is paused"


def test_bad_admin_requests_are_refused_and_write_nothing(fleet: Fleet) -> None:
    fleet.start("only")
    fleet.produce(range(16))
    poll_until(lambda: handled_at_least(fleet, 1, 16), what="the group to exist")
    before = fleet.run("log").stdout.count("\n")

    beyond = fleet.run("admin", "set-position", "--topic", fleet.topic, "--offset", "999")
    assert beyond.returncode == ExitCode.CONFIG_ERROR and "outside" in beyond.stderr
    unknown_topic = fleet.run("admin", "set-position", "--topic", "no-such-topic", "--earliest")
    assert unknown_topic.returncode == ExitCode.UNKNOWN_TOPIC
    two_targets = fleet.run("admin", "set-position", "--topic", fleet.topic, "--earliest", "--latest")
    assert two_targets.returncode == ExitCode.CONFIG_ERROR and "exactly one" in two_targets.stderr
    bad_duration = fleet.run("admin", "pause", "--for", "a while")
    assert bad_duration.returncode == ExitCode.CONFIG_ERROR and "--for" in bad_duration.stderr
    endless = fleet.run("admin", "pause", "--for", "999999999999999h")
    assert endless.returncode == ExitCode.CONFIG_ERROR and "int64" in endless.stderr
    where = {"brokers": fleet.brokers, "group": "no-such-group", "coordination_topic": fleet.coordination_topic}
    unknown_group = run_command(group_command("admin", "pause", "--for", "5s", **where))
    assert unknown_group.returncode == ExitCode.UNKNOWN_GROUP and "no record" in unknown_group.stderr

    after = fleet.run("log").stdout
    assert "release_group" not in after and "admin@" not in after
    assert after.count("\n") >= before  # only the supervisor's own heartbeats were added


def test_log_prints_the_groups_records_and_follows(fleet: Fleet) -> None:
    fleet.start("only")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")

    def one_round_in_one_record() -> subprocess.CompletedProcess[str] | None:
        """``log`` once a heartbeat round with every partition is in: one heartbeats record per topic and round."""
        found = fleet.run("log")
        assert found.returncode == ExitCode.OK, found.stderr
        beats = [line for line in found.stdout.splitlines() if " heartbeats only/" in line]
        return found if any(all(f" [{p}]=" in line for p in range(8)) for line in beats) else None

    result = poll_until(one_round_in_one_record, what="a heartbeats record of every partition")
    claims = [line for line in result.stdout.splitlines() if " claim only/" in line]
    assert len({line.split()[-1] for line in claims}) == 8

    follower = subprocess.Popen(
        fleet.command("log", "--follow"), stdout=subprocess.PIPE, text=True, env=child_environment()
    )
    try:
        assert follower.stdout is not None
        seen = [follower.stdout.readline() for _ in range(len(result.stdout.splitlines()) + 3)]
        assert sum(" heartbeats only/" in line for line in seen) > 0, "new heartbeats keep coming"
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=20) == ExitCode.OK
    finally:
        follower.kill()
        follower.wait()
