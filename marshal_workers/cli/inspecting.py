"""The commands that look at a group and change nothing: ``status`` (with ``--autoscale``), ``log`` (its
coordination records) and ``dashboard`` (a live web view)."""

from __future__ import annotations

import signal
import time
from typing import Any

import click
import orjson

from marshal_workers.cli.shared import DRAIN_TARGET, configure, optional_app_at, reports_errors, settings_options
from marshal_workers.errors import ConfigError


@click.command()
@settings_options
@click.option("--topic", help="Only this topic; its partitions that no record mentions show as unclaimed.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document instead of a table.")
@click.option(
    "--autoscale", is_flag=True, help="The backlog and the workers it wants, as GET /autoscale (measured over HB)."
)
@DRAIN_TARGET
@reports_errors
def status(config_file: str | None, topic: str | None, as_json: bool, autoscale: bool, **options: Any) -> None:
    """Show the world state of a group: owner, offset and liveness of each partition."""
    from marshal_workers.kafka.coordination_reader import read_group_state
    from marshal_workers.kafka.kafka_clients import admin_client, require_topic
    from marshal_workers.observe.status import render_table, status_document
    from marshal_workers.ops.admin import unknown_group

    settings = configure(config_file, **options)
    group = settings.require_group()
    if autoscale:
        from marshal_workers.observe.autoscale import render_autoscale
        from marshal_workers.observe.autoscale_meter import measure_once

        if topic is not None:
            raise ConfigError("--autoscale answers for every topic of the group: leave out --topic")
        found = measure_once(settings, group)
        click.echo(orjson.dumps(found).decode() if as_json else render_autoscale(found))
        if not found["topics"]:
            raise unknown_group(settings)
        return
    topic_partitions = None if topic is None else require_topic(admin_client(settings), settings, topic)
    state = read_group_state(settings, group)
    now_ms = int(time.time() * 1000)
    document = status_document(state, now_ms, topic, topic_partitions)
    if as_json:
        click.echo(orjson.dumps(document).decode())
    else:
        click.echo(render_table(document, now_ms))
    if state.stats.garbage:
        click.echo(f"note: {state.stats.garbage} invalid coordination records were skipped", err=True)
    if not state.has_records():  # after the (empty) document: scripts reading --json still get one
        raise unknown_group(settings)


@click.command("log")
@settings_options
@click.option("--follow", is_flag=True, help="Keep printing new records until Ctrl-C.")
@click.option(
    "--from-beginning", is_flag=True, help="Print the whole log, not only what follows the latest checkpoint."
)
@reports_errors
def log_command(config_file: str | None, follow: bool, from_beginning: bool, **options: Any) -> None:
    """Print the group's coordination records, decoded, one per line (from its latest checkpoint on)."""
    from marshal_workers.ops.admin import log_lines

    settings = configure(config_file, **options)
    stop: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    for line in log_lines(settings, follow, stop=lambda: bool(stop), from_beginning=from_beginning):
        click.echo(line)


@click.command()
@settings_options
@click.option("--port", "dashboard_port", type=click.IntRange(0, 65535), help="Port of the web server (default 8000).")
@click.option("--host", "dashboard_host", help="Address to listen on (default 127.0.0.1: this host only).")
@click.option(
    "--app", "app_path", metavar="MODULE:APP", help="Also serve this app's AsyncAPI document at /asyncapi.json."
)
@DRAIN_TARGET
@reports_errors
def dashboard(config_file: str | None, app_path: str | None, **options: Any) -> None:
    """Serve a live, read-only web dashboard of a group: partitions, members, hand-overs, dead letters; and
    GET /autoscale."""
    import asyncio

    from marshal_workers.handlers.asyncapi import asyncapi_json
    from marshal_workers.observe.autoscale_meter import AutoscaleMeter
    from marshal_workers.observe.dashboard import GroupWatcher, Publisher
    from marshal_workers.ops.dashboard_server import serve

    app = optional_app_at(app_path)
    settings = configure(config_file, app_defaults=None if app is None else app.settings, **options)
    group = settings.require_group()
    described = None if app is None else (lambda: asyncapi_json(app, brokers=settings.brokers))
    watcher = GroupWatcher(settings, group).start()
    publisher = Publisher(watcher.step).start()
    meter = AutoscaleMeter(watcher.step, settings).start()
    try:
        asyncio.run(
            serve(
                publisher,
                settings.dashboard_host,
                settings.dashboard_port,
                lambda url: click.echo(f"dashboard of group {group} on {url}   (Ctrl-C stops it)"),
                asyncapi=described,
                autoscale=meter,
            )
        )
    finally:
        publisher.close()
        watcher.close()
    click.echo("dashboard stopped")
