"""The nemesis's timings, without a broker: how long `status` took after the heal, when a status answer first
showed the fleet settled, how long a supervisor took to start; and the long run's load and bounds on them."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time

from fleet import StatusCall
from nemesis import NemesisConfig, Report
from polling import poll_until
from processes import pid_gone
from run_nemesis import BUSY_LOOP, COLUMNS, start_busy_cores, stop_busy_cores, table
from timings import (
    StartUp,
    after_the_heal,
    over_bounds,
    settled_seen_s,
    start_line_at,
    start_ups,
    timings_line,
)

from marshal_workers import App
from marshal_workers.core.config import load_settings
from marshal_workers.core.logs import TextFormatter, group_log
from marshal_workers.runtime.supervisor.supervisor_lines import StartUpTimes, start_line

HEAL = 1_000.0


def logged(at: float, client: str = "s1", message: str | None = None) -> str:
    """A line of a supervisor's log as the supervisor writes it (text format, group prefix) at wall time ``at``:
    by default its start line."""
    if message is None:
        app = App()
        app.handler("orders")(lambda msg: None)
        settings = load_settings(cli={"group": "g", "brokers": "localhost:9092"}, app_defaults=app.settings)
        message = start_line(app, "sink_app:app", settings, client, "5f1c")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())

    def stamp(record: logging.LogRecord) -> bool:
        record.created, record.msecs = at, (at - int(at)) * 1000
        return True

    handler.addFilter(stamp)
    logger = logging.Logger(f"supervisor-{client}")  # noqa: LOG001 - unregistered: each call its own handler
    logger.addHandler(handler)
    group_log(logger, "g").info("%s", message)
    return out.getvalue()


def test_settled_seen_is_when_the_first_settled_answer_came_back_its_own_call_time_included() -> None:
    answers = [
        (StatusCall(HEAL + 0.2, 0.5), False),  # still behind
        (StatusCall(HEAL + 0.9, 2.6), True),  # settled, but the answer took 2.6 s to come
        (StatusCall(HEAL + 3.7, 0.3), True),
    ]
    assert settled_seen_s(answers, HEAL) == 3.5
    assert settled_seen_s(answers[:1], HEAL) is None, "no answer showed it settled"
    before_the_heal = [(StatusCall(HEAL - 5.0, 0.3), True)]
    assert settled_seen_s(before_the_heal + answers, HEAL) == 3.5, "an answer about the fleet under faults"


def test_a_timed_out_status_call_shows_nothing_settled_and_counts_with_its_timeout() -> None:
    timed_out = StatusCall(HEAL + 1.0, 60.0, timed_out=True)
    calls = [StatusCall(HEAL - 3.0, 9.0), StatusCall(HEAL + 0.1, 0.8), timed_out, StatusCall(HEAL + 61.5, 1.2)]
    assert settled_seen_s([(timed_out, True)], HEAL) is None
    after = after_the_heal(calls, HEAL)
    assert after == calls[1:], "the call begun under the faults is not one after the heal"
    line = timings_line(after, 62.7, [])
    assert "status after the heal: 3 calls, slowest 60.0s (timed out), 1 timed out" in line
    assert "settled seen 62.7s after the heal" in line


def test_the_start_up_is_read_off_the_supervisors_own_start_line() -> None:
    log = logged(HEAL + 0.25, message="loading the app") + logged(HEAL + 2.345)
    assert "supervisor s1/5f1c running sink_app:app" in log, "the line the supervisor writes"
    assert abs(start_line_at(log, "s1") - (HEAL + 2.345)) < 0.002  # the log's clock: milliseconds
    assert start_line_at(log, "s") is None and start_line_at(logged(HEAL, client="s10"), "s1") is None


def test_each_start_is_timed_by_its_own_start_line_and_one_killed_before_it_is_left_out() -> None:
    first = logged(HEAL + 1.5).encode()
    killed_early = logged(HEAL + 20.1, message="claimed 4 partitions").encode()  # another process's trailing line
    third = logged(HEAL + 42.0).encode()
    log = first + killed_early + third
    starts = [(HEAL + 40.0, len(first + killed_early)), (HEAL, 0), (HEAL + 20.0, len(first))]  # in any order
    found = start_ups("s1", log, starts)
    assert [(s.started_at, None if s.seconds is None else round(s.seconds, 2)) for s in found] == [
        (HEAL, 1.5),
        (HEAL + 20.0, None),  # killed before it logged its start line: neither timed nor given another's line
        (HEAL + 40.0, 2.0),
    ]
    line = timings_line([], None, found)
    assert (
        "supervisor start-up: 2 starts, slowest 2.0s (s1, broker frozen or stalled 0.0s meanwhile); 1 killed or "
        "stopped before their start line" in line
    )
    assert "settled seen NEVER" in line


def test_the_slowest_start_up_says_how_much_of_it_was_the_interpreter_and_imports_and_the_cpu_it_used() -> None:
    app = App()
    app.handler("orders")(lambda msg: None)
    settings = load_settings(cli={"group": "g", "brokers": "localhost:9092"}, app_defaults=app.settings)
    times = StartUpTimes(imports=2.71, coordination_log=0.9, rest=0.1, cpu=0.34)
    log = logged(HEAL + 3.8, message=start_line(app, "sink_app:app", settings, "s1", "5f1c", times)).encode()
    [found] = start_ups("s1", log, [(HEAL, 0)])
    assert (found.imports_s, found.cpu_s) == (2.71, 0.34)
    assert (
        "slowest 3.8s (s1, broker frozen or stalled 0.0s meanwhile, interpreter and imports 2.7s, 0.34 CPU-s)"
        in timings_line([], None, [found])
    ), "a start-up that used far less CPU than its seconds waited: for a core, or for the broker"


def test_a_start_up_that_waited_on_a_frozen_broker_is_told_apart_from_the_slowest_with_the_broker_up() -> None:
    found = [StartUp("s0", HEAL, 4.0, broker_frozen_s=2.5), StartUp("s1", HEAL + 9, 1.25), StartUp("s2", HEAL, 0.9)]
    line = timings_line([], None, found)
    assert (
        "slowest 4.0s (s0, broker frozen or stalled 2.5s meanwhile), slowest with the broker up throughout "
        "1.2s (s1)" in line
    )


def test_the_acceptance_bounds_make_problems_only_when_given_and_exceeded() -> None:
    calls = [StatusCall(HEAL + 1, 0.4), StatusCall(HEAL + 2, 3.2)]
    assert over_bounds(calls, 4.0, None, None) == [], "no bounds (the suite): figures only"
    assert over_bounds(calls, 4.0, status_bound=5.0, settle_bound=10.0) == []
    [slow] = over_bounds(calls, 4.0, status_bound=3.0, settle_bound=None)
    assert "3.2s" in slow and "1 of 2" in slow
    [unsettled] = over_bounds(calls, 11.0, status_bound=None, settle_bound=10.0)
    assert "11.0s" in unsettled
    assert len(over_bounds(calls, None, status_bound=None, settle_bound=10.0)) == 1, "never seen settled"
    assert len(over_bounds([StatusCall(HEAL, 60.0, timed_out=True)], 1.0, 5.0, None)) == 1


def test_the_long_runs_table_has_the_timing_columns_and_marks_a_timed_out_status() -> None:
    report = Report(NemesisConfig(mode="amo", seed=3, fault_seconds=20.0), complete_after_s=0.4, settled_seen_s=1.9)
    report.status_calls = [StatusCall(HEAL, 0.7), StatusCall(HEAL + 1, 60.0, timed_out=True)]
    report.start_ups = [StartUp("s0", HEAL, 2.25), StartUp("s1", HEAL, None)]
    header, row = table([report])
    assert header.split()[-4:] == ["slowest_status_s", "settled_seen_s", "slowest_start_s", "problems"]
    cells = dict(zip(COLUMNS, row.split(), strict=True))
    assert cells["slowest_status_s"] == "60.0(timeout)"
    assert (cells["settled_seen_s"], cells["slowest_start_s"], cells["settle_s"]) == ("1.9", "2.2", "0.4")
    assert "slowest 60.0s (timed out)" in report.summary()


def test_busy_cores_spin_until_stopped_by_their_pid() -> None:
    busy: list[subprocess.Popen[bytes]] = []
    try:
        start_busy_cores(2, busy)
        time.sleep(0.3)
        assert len(busy) == 2 and not any(pid_gone(p.pid) for p in busy)
    finally:
        stop_busy_cores(busy)
    assert all(pid_gone(p.pid) for p in busy)


def test_a_busy_core_ends_by_itself_once_its_parent_is_gone() -> None:
    # A parent that starts a busy loop and exits at once, as a run_nemesis.py killed by SIGKILL would.
    spawn = (
        f"import os, subprocess, sys\n"
        f"print(subprocess.Popen([sys.executable, '-c', {BUSY_LOOP!r}, str(os.getpid())],"
        f" stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"  # not our pipes: run() returns at its exit
    )
    parent = subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, timeout=30, check=True)
    orphan = int(parent.stdout)
    try:
        poll_until(lambda: pid_gone(orphan), timeout=10, what="the orphaned busy loop to end")
    finally:
        if not pid_gone(orphan):
            os.kill(orphan, signal.SIGKILL)
