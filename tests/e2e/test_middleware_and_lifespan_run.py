"""Middleware and lifespan hooks under ``marshal-workers run`` (tests/apps/lifespan_app.py): the middleware wraps
each message's call once, in the worker processes; the app's on_startup runs in the supervisor before its first
claim and on_shutdown after its last release; each worker process enters the lifespan before its first message
and exits it after its last.  An on_startup hook that fails stops the start-up, before anything is claimed, with
exit code 18 and one line that names the hook."""

from __future__ import annotations

import collections
import signal

import pytest
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.protocol import codec

pytestmark = [pytest.mark.broker, pytest.mark.fleet(name="mw", partitions=4, app="lifespan_app:app")]

MESSAGES = 40


def sink(fleet: Fleet) -> list[list[str]]:
    return [line.split() for line in fleet.sink.read_text().splitlines()] if fleet.sink.exists() else []


def test_middleware_wraps_each_call_and_the_lifespan_hooks_run_where_and_when_they_say(fleet: Fleet) -> None:
    fleet.produce(range(MESSAGES))
    supervisor = fleet.start("only")
    poll_until(lambda: sum(line[0] == "handled" for line in sink(fleet)) >= MESSAGES, what="every message handled")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0

    lines = sink(fleet)
    by_kind = collections.defaultdict(list)
    for index, (kind, *rest) in enumerate(lines):
        by_kind[kind].append((index, *rest))
    middleware = collections.Counter(value for _, value, _pid in by_kind["mw"])
    assert middleware == dict.fromkeys(map(str, range(MESSAGES)), 1), "the middleware saw each message once"
    assert sorted(int(value) for _, value, _pid in by_kind["handled"]) == list(range(MESSAGES))

    # The supervisor's hooks, once each, in the supervisor: before its first claim and after its last release.
    [(_, startup_pid, startup_ms)] = by_kind["startup"]
    [(_, shutdown_pid, shutdown_ms)] = by_kind["shutdown"]
    assert int(startup_pid) == int(shutdown_pid) == supervisor.pid
    records = [r for r in fleet.coordination_records() if r.group == fleet.group]
    claims = [r.ts for r in records if isinstance(r, codec.Claim)]
    releases = [r.ts for r in records if isinstance(r, (codec.Release, codec.ReleaseGroup))]
    assert len(claims) == fleet.partitions and releases, "it claimed every partition and released them"
    assert int(startup_ms) <= min(claims) and max(releases) <= int(shutdown_ms)

    # The lifespan: entered and exited once in each worker process (one per partition), around its calls.
    entered = {pid: index for index, pid in by_kind["enter"]}
    exited = {pid: index for index, pid in by_kind["exit"]}
    assert len(entered) == len(by_kind["enter"]) == fleet.partitions and set(exited) == set(entered)
    assert len(exited) == len(by_kind["exit"]) and str(supervisor.pid) not in entered
    for index, _value, pid in by_kind["mw"]:
        assert entered[pid] < index < exited[pid], "the middleware runs in a worker, inside its lifespan"


def test_an_on_startup_hook_that_fails_stops_the_start_up_before_anything_is_claimed(fleet: Fleet) -> None:
    fleet.produce(range(4))
    supervisor = fleet.start("only", MW_TEST_STARTUP_FAILS="1")

    assert supervisor.wait(timeout=60) == ExitCode.STARTUP_FAILED
    log = fleet.log_of("only")
    assert (
        "error: on_startup hook lifespan_app.check_database failed (ConnectionError: no database at db:5432): "
        "nothing was claimed" in log
    )
    assert "Traceback" in log, "the hook's traceback is in the log"
    assert sink(fleet) == [], "no worker started, no shutdown hook ran"
    assert "running lifespan_app:app" not in log, "it never got as far as its start-up line"
