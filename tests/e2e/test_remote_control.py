"""Remote control through the coordination log against running supervisors:
``admin drain`` / ``resume --client``, ``admin release``, ``admin pause --topic`` / ``resume --topic``,
``admin shutdown``.  Every hand-over an order causes is clean: nothing is lost or handled twice."""

from __future__ import annotations

import time

import orjson
import pytest
from fleet import Fleet
from polling import poll_until
from test_admin import handled_at_least

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker


def owners(fleet: Fleet) -> dict[int, str | None]:
    """partition -> client of its live owner (None if it has none), from ``status``."""
    return {
        p: row["client"] if row["state"] in ("fresh", "unknown") else None for p, row in fleet.status_rows().items()
    }


def exactly_once(fleet: Fleet, count: int) -> bool:
    counts = fleet.counts()
    return len(counts) == count and set(counts.values()) == {1}


def test_drain_hands_everything_over_resume_takes_a_share_back_and_release_moves_one_partition(fleet: Fleet) -> None:
    fleet.start("a", "--balance", "fair")
    fleet.start("b", "--balance", "fair")
    poll_until(lambda: len(fleet.worker_pids("a")) == 4 and len(fleet.worker_pids("b")) == 4, what="4 workers each")
    fleet.produce(range(400))
    poll_until(lambda: handled_at_least(fleet, 1, 400), what="every message once")

    drained = fleet.run("admin", "drain", "--client", "a")
    assert drained.returncode == ExitCode.OK, drained.stdout + drained.stderr
    assert "client a drained" in drained.stdout and "done" in drained.stdout
    assert fleet.worker_pids("a") == {}, "a drained member runs no worker"
    poll_until(lambda: set(owners(fleet).values()) == {"b"}, what="b to own every partition")
    status = fleet.run("status", "--json")
    assert [entry["client"] for entry in orjson.loads(status.stdout)["drained"]] == ["a"]
    fleet.produce(range(400, 800))
    poll_until(lambda: handled_at_least(fleet, 1, 800), what="the messages produced during the drain")
    assert {line.client for line in fleet.lines() if int(line.value) >= 400} == {"b"}, "a claims nothing while drained"

    resumed = fleet.run("admin", "resume", "--client", "a")
    assert resumed.returncode == ExitCode.OK, resumed.stderr
    poll_until(lambda: list(owners(fleet).values()).count("a") == 4, timeout=60, what="a to take its share back")

    moved = next(p for p, client in owners(fleet).items() if client == "a")
    released = fleet.run("admin", "release", "--topic", fleet.topic, "--partition", str(moved))
    assert released.returncode == ExitCode.OK, released.stdout + released.stderr
    assert "done" in released.stdout
    assert f"[{moved}]: handing it over (ordered by an operator: release)" in fleet.log_of("a")

    fleet.produce(range(800, 1200))
    poll_until(lambda: handled_at_least(fleet, 1, 1200), what="the messages produced after the release")
    assert exactly_once(fleet, 1200), "every hand-over an operator ordered was clean"
    orders = [line for line in fleet.run("log").stdout.splitlines() if " control admin@" in line]
    actions = [tuple(line.split()[-2:]) for line in orders]  # one copy per coordination partition
    assert set(actions) == {("drain", "a"), ("resume", "a")} and actions.index(("resume", "a")) > 0, orders


def test_pause_topic_stops_its_partitions_until_resumed(fleet: Fleet) -> None:
    fleet.start("only")
    fleet.produce(range(80))
    poll_until(lambda: handled_at_least(fleet, 1, 80), what="every message once")

    paused = fleet.run("admin", "pause", "--topic", fleet.topic)
    assert paused.returncode == ExitCode.OK, paused.stdout + paused.stderr
    assert "until `admin resume --topic`" in paused.stdout and "done" in paused.stdout
    assert fleet.worker_pids("only") == {}
    status = orjson.loads(fleet.run("status", "--json").stdout)
    assert [entry["topic"] for entry in status["paused_topics"]] == [fleet.topic]
    assert all(row["state"] == "released" for row in status["partitions"])
    fleet.produce(range(80, 160))
    time.sleep(3)  # three heartbeat intervals, in which a member that ignored the pause would claim and handle
    assert len(fleet.counts()) == 80, "nothing of a paused topic is handled"

    resumed_at = time.time()
    resumed = fleet.run("admin", "resume", "--topic", fleet.topic)
    assert resumed.returncode == ExitCode.OK, resumed.stderr
    poll_until(lambda: handled_at_least(fleet, 1, 160), timeout=60, what="the rest, after the resume")
    assert exactly_once(fleet, 160)
    assert min(line.at for line in fleet.lines() if int(line.value) >= 80) >= resumed_at - 0.5


def test_shutdown_stops_the_clients_supervisors_but_not_one_started_later(fleet: Fleet) -> None:
    first = fleet.start("a", "--balance", "fair")
    fleet.start("b", "--balance", "fair")
    poll_until(lambda: len(fleet.worker_pids("a")) == 4 and len(fleet.worker_pids("b")) == 4, what="4 workers each")
    fleet.produce(range(200))
    poll_until(lambda: handled_at_least(fleet, 1, 200), what="every message once")

    ordered = fleet.run("admin", "shutdown", "--client", "a")
    assert ordered.returncode == ExitCode.OK, ordered.stdout + ordered.stderr
    assert first.wait(timeout=30) == 0, "a shutdown order ends the supervisor as SIGTERM does: exit 0"
    assert "shutdown ordered by an operator" in fleet.log_of("a")
    poll_until(lambda: set(owners(fleet).values()) == {"b"}, what="b to own every partition")

    fleet.start("a", "--balance", "fair")  # a new supervisor of client a: the order was for the ones before it
    poll_until(lambda: list(owners(fleet).values()).count("a") == 4, timeout=60, what="the new a to take its share")
    fleet.produce(range(200, 400))
    poll_until(lambda: handled_at_least(fleet, 1, 400), what="every message once")
    assert exactly_once(fleet, 400)


def test_bad_orders_are_refused_and_write_nothing(fleet: Fleet) -> None:
    fleet.start("only")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")

    refused = {
        ("admin", "drain", "--client", "nobody"): (ExitCode.CONFIG_ERROR, "known clients: only"),
        ("admin", "shutdown", "--client", "nobody"): (ExitCode.CONFIG_ERROR, "no member"),
        ("admin", "resume", "--client", "only"): (ExitCode.CONFIG_ERROR, "not drained"),
        ("admin", "resume", "--topic", fleet.topic): (ExitCode.CONFIG_ERROR, "not paused"),
        ("admin", "resume"): (ExitCode.CONFIG_ERROR, "not paused"),
        ("admin", "resume", "--client", "only", "--topic", fleet.topic): (ExitCode.CONFIG_ERROR, "not both"),
        ("admin", "pause"): (ExitCode.CONFIG_ERROR, "--for"),
        ("admin", "pause", "--topic", "no-such-topic"): (ExitCode.UNKNOWN_TOPIC, "no-such-topic"),
        ("admin", "release", "--topic", fleet.topic, "--partition", "8"): (ExitCode.CONFIG_ERROR, "no partition 8"),
        ("admin", "drain", "--client", "only", "--wait", "soon"): (ExitCode.CONFIG_ERROR, "--wait"),
    }
    for args, (code, message) in refused.items():
        result = fleet.run(*args)
        assert result.returncode == code and message in result.stderr, (args, result.returncode, result.stderr)
    log = fleet.run("log").stdout
    assert "admin@" not in log, "a refused order writes nothing"
    assert len(fleet.worker_pids("only")) == 8


def test_a_drained_supervisor_settles_its_range_leases_and_leases_nothing_until_resumed(fleet: Fleet) -> None:
    fleet.env |= {
        "MW_TEST_SHARED": "1",
        "MW_TEST_RANGE_SIZE": "10",
        "MW_TEST_PENDING_TIMEOUT": "5s",
        "MW_TEST_DELAY": "0.02",
    }
    fleet.start("only", "--processes", "2")
    fleet.produce(range(400))  # about 4 s of work for 2 workers
    poll_until(lambda: len(fleet.counts()) >= 40, what="the shared workers to be under way")

    drained = fleet.run("admin", "drain", "--client", "only")
    assert drained.returncode == ExitCode.OK, drained.stdout + drained.stderr
    assert "done" in drained.stdout, "every lease of the drained member is settled"
    handled = len(fleet.counts())
    assert handled < 400
    time.sleep(2)  # four claim rounds, in which a member that ignored the drain would lease more
    assert len(fleet.counts()) == handled, "a drained member leases nothing"

    assert fleet.run("admin", "resume", "--client", "only").returncode == ExitCode.OK
    poll_until(lambda: handled_at_least(fleet, 1, 400), timeout=60, what="the rest, after the resume")
    assert exactly_once(fleet, 400)
