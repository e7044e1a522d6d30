"""The supervisor's first and last log lines: what it runs with, and how it stopped."""

from __future__ import annotations

from marshal_workers import App
from marshal_workers.core.config import load_settings
from marshal_workers.runtime.supervisor.supervisor_lines import StartUpTimes, start_line, stop_line


def test_the_start_line_shows_the_effective_group_and_settings_not_the_apps_arguments() -> None:
    app = App()  # no group in code: it comes from the command line
    app.handler("orders")(lambda msg: None)
    app.handler("thumbs", shared=True)(lambda msg: None)
    settings = load_settings(
        cli={"group": "billing", "brokers": "k1:9092", "balance": "fair", "max_memory_per_worker": "512MB"},
        env={"MARSHAL_WORKERS_PROCESSES": "3"},
        app_defaults=app.settings,
    )
    line = start_line(app, "tasks:app", settings, "host-a", "5f1c")
    assert line.startswith("supervisor host-a/5f1c running tasks:app (topics orders; shared thumbs) in group billing ")
    assert "on k1:9092: " in line
    for shown in (
        "balance=fair",
        "heartbeat_interval=5s",
        "max_partitions=0",
        "shutdown_timeout=30s",
        "max_memory_per_worker=512MB",
        "processes=3",
        "coordination_topic=__marshal",
    ):
        assert shown in line, shown
    assert "None" not in line and "App(" not in line
    assert "crash_limit" not in line, "settings left at their defaults are not listed (but the main ones)"


def test_the_stop_line_says_whether_the_stop_was_clean() -> None:
    assert stop_line(8, 1.234, 0, False) == "stopped cleanly: released 8 partitions at their offsets in 1.2s"
    assert stop_line(1, 0.5, 0, False) == "stopped cleanly: released 1 partition at its offset in 0.5s"
    assert stop_line(3, 31.0, 0, True) == (
        "stopped: released 3 partitions in 31.0s; workers were killed and released at their last progress"
    )
    assert stop_line(2, 0.3, 10, False) == "stopped with exit code 10: released 2 partitions in 0.3s"
    unconfirmed = stop_line(4, 8.0, 4, False, not_confirmed=4)
    assert not unconfirmed.startswith("stopped cleanly") and unconfirmed.startswith("stopped with exit code 4:")
    assert "4 of the releases not confirmed" in unconfirmed and "handled again" in unconfirmed


def test_the_start_line_says_where_the_start_up_went() -> None:
    app = App(group="billing")
    app.handler("orders")(lambda msg: None)
    settings = load_settings(cli={}, env={}, app_defaults=app.settings)
    times = StartUpTimes(imports=0.481, coordination_log=0.574, rest=0.066, cpu=0.312)
    line = start_line(app, "tasks:app", settings, "host-a", "5f1c", times)
    assert line.endswith(
        "; up in 1.12s of the process (interpreter and imports 0.48s, reading the coordination log 0.57s, "
        "the rest 0.07s; 0.31 CPU-s)"
    ), "the CPU used beside the seconds: a start-up that waited for a core or the broker is told from a busy one"
    unknown = StartUpTimes(imports=None, coordination_log=0.574, rest=0.066)
    assert start_line(app, "tasks:app", settings, "host-a", "5f1c", unknown).endswith(
        "; up in 0.64s (reading the coordination log 0.57s, the rest 0.07s)"
    ), "where the system cannot tell when the process started, only what the supervisor timed itself"
