"""The ``marshal-workers`` command line: a thin layer that builds Settings and calls the library.

Its commands, one module per group (docs/architecture.md): running.py (run, serve, demo, broker), inspecting.py
(status, log, dashboard), operating.py (admin, dlq, topics), tools.py (simulate, replay, audit, asyncapi); what
they share (exit codes, common options, settings, MODULE:APP) is in shared.py.
"""

from __future__ import annotations

import click

from marshal_workers import __version__
from marshal_workers.cli.inspecting import dashboard, log_command, status
from marshal_workers.cli.operating import admin, dlq, topics
from marshal_workers.cli.running import broker, demo, run, serve
from marshal_workers.cli.tools import asyncapi, audit_command, replay_command, simulate


@click.group()
@click.version_option(__version__, prog_name="marshal-workers")
def main() -> None:
    """Run Python handlers over Kafka partitions, coordinated through Kafka alone."""


# --help lists them by name, whatever the order here.
for command in (
    run,
    serve,
    demo,
    broker,
    status,
    log_command,
    dashboard,
    admin,
    dlq,
    topics,
    simulate,
    replay_command,
    audit_command,
    asyncapi,
):
    main.add_command(command)
