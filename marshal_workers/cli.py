"""The ``marshal-workers`` command line: a thin layer that builds Settings and calls the library."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from marshal_workers import __version__
from marshal_workers.core.config import Settings, load_settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.core.logs import configure_logging
from marshal_workers.errors import (
    AppLoadError,
    AppStartupError,
    ConfigError,
    CoordinationTopicError,
    CoordinationWriteError,
    EmbeddedBrokerError,
    KafkaUnavailable,
    MarshalWorkersError,
    NoHandlersError,
    OffsetRangeError,
    ReplayFailedError,
    SparkJobError,
    SparkUnavailableError,
    TopicCreationError,
    UnknownGroupError,
    UnknownTopicError,
)
from marshal_workers.kafka.embedded_broker import EmbeddedBroker

F = TypeVar("F", bound=Callable[..., Any])


_EXIT_CODES: dict[type[MarshalWorkersError], ExitCode] = {
    ConfigError: ExitCode.CONFIG_ERROR,
    KafkaUnavailable: ExitCode.KAFKA_UNAVAILABLE,
    CoordinationTopicError: ExitCode.COORDINATION_ERROR,
    CoordinationWriteError: ExitCode.COORDINATION_ERROR,
    UnknownTopicError: ExitCode.UNKNOWN_TOPIC,
    TopicCreationError: ExitCode.TOPIC_NOT_CREATED,
    UnknownGroupError: ExitCode.UNKNOWN_GROUP,
    EmbeddedBrokerError: ExitCode.EMBEDDED_BROKER_ERROR,
    AppLoadError: ExitCode.APP_LOAD_ERROR,
    AppStartupError: ExitCode.STARTUP_FAILED,
    NoHandlersError: ExitCode.NO_HANDLERS,
    OffsetRangeError: ExitCode.BAD_RANGE,
    SparkUnavailableError: ExitCode.SPARK_UNAVAILABLE,
    SparkJobError: ExitCode.SPARK_JOB_FAILED,
    ReplayFailedError: ExitCode.SPARK_JOB_FAILED,
}


def _reports_errors(command: F) -> F:
    """Turn our exceptions into one line on stderr and a named exit code, not a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except MarshalWorkersError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(_EXIT_CODES.get(type(exc), ExitCode.FAILURE))

    return wrapper  # type: ignore[return-value]


def _options(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying several click options, in the order given (as --help lists them)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


_CONFIG = click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings file.")
_BROKERS = click.option("--brokers", help="Kafka bootstrap servers, host:port[,host:port].")
_CONNECT_TIMEOUT = click.option("--connect-timeout", help="Give up when Kafka does not answer within this, e.g. 10s.")
_LOG_LEVEL = click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
_LOG_FORMAT = click.option("--log-format", type=click.Choice(["text", "json"]), help="Log lines as text or JSON.")

# The options every command that talks to a group shares; each is also a setting (file, env).
_settings_options = _options(
    _CONFIG,
    _BROKERS,
    click.option("--group", help="The consumer group."),
    click.option("--coordination-topic", help="Coordination topic (default __marshal)."),
    click.option("--heartbeat-interval", help="HB of the group, e.g. 5s (all members must agree)."),
    _CONNECT_TIMEOUT,
    _LOG_LEVEL,
    _LOG_FORMAT,
)
# The options of a command that reads Kafka but never joins a group (replay).
_kafka_options = _options(_CONFIG, _BROKERS, _CONNECT_TIMEOUT, _LOG_LEVEL, _LOG_FORMAT)


# Where Spark runs (replay, audit).
_spark_options = _options(
    click.option(
        "--spark-master",
        default="local[*]",
        show_default=True,
        help="Spark master URL: local[N], spark://HOST:PORT, yarn, k8s://...",
    ),
    click.option(
        "--spark-conf",
        multiple=True,
        metavar="KEY=VALUE",
        help="A Spark setting (repeatable), e.g. spark.executor.memory=4g.",
    ),
)


def _load(config_file: str | None, app_defaults: dict[str, Any] | None = None, **cli: Any) -> Settings:
    settings = load_settings(config_file, cli, app_defaults=app_defaults)
    configure_logging(settings.log_level, settings.log_format)
    return settings


@click.group()
@click.version_option(__version__, prog_name="marshal-workers")
def main() -> None:
    """Run Python handlers over Kafka partitions, coordinated through Kafka alone."""


@main.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=9092, show_default=True, help="Port on 127.0.0.1 (0: any free port)."
)
@_reports_errors
def broker(port: int) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory only) in the foreground."""
    stop_requested: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: stop_requested.append(signum))
    with EmbeddedBroker(port=port or None) as embedded:
        click.echo(f"embedded broker ready: --brokers {embedded.bootstrap}   (pid {embedded.pid}; Ctrl-C stops it)")
        while not stop_requested:
            assert embedded.process is not None
            if embedded.process.poll() is not None:
                raise EmbeddedBrokerError(f"the broker exited with code {embedded.process.returncode}; see {embedded.log_path}")
            time.sleep(0.2)
    click.echo("embedded broker stopped")


_DRAIN_TARGET = click.option(
    "--drain-target", help="Autoscaling: how soon the wanted workers should drain the backlog (default 60s)."
)


@main.command()
@_settings_options
@click.option("--topic", help="Only this topic; its partitions that no record mentions show as unclaimed.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document instead of a table.")
@click.option(
    "--autoscale", is_flag=True, help="The backlog and the workers it wants, as GET /autoscale (measured over HB)."
)
@_DRAIN_TARGET
@_reports_errors
def status(config_file: str | None, topic: str | None, as_json: bool, autoscale: bool, **options: Any) -> None:
    """Show the world state of a group: owner, offset and liveness of each partition."""
    from marshal_workers.kafka.coordination_log import read_group_state
    from marshal_workers.kafka.kafka_clients import admin_client, require_topic
    from marshal_workers.observe.status import render_table, status_document
    from marshal_workers.ops.admin import unknown_group

    settings = _load(config_file, **options)
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


@main.command()
@_settings_options
@click.option("--port", "dashboard_port", type=click.IntRange(0, 65535), help="Port of the web server (default 8000).")
@click.option("--host", "dashboard_host", help="Address to listen on (default 127.0.0.1: this host only).")
@click.option("--app", "app_path", metavar="MODULE:APP", help="Also serve this app's AsyncAPI document at /asyncapi.json.")
@_DRAIN_TARGET
@_reports_errors
def dashboard(config_file: str | None, app_path: str | None, **options: Any) -> None:
    """Serve a live, read-only web dashboard of a group: partitions, members, hand-overs, dead letters; and
    GET /autoscale."""
    import asyncio

    from marshal_workers.handlers.asyncapi import asyncapi_json
    from marshal_workers.observe.autoscale_meter import AutoscaleMeter
    from marshal_workers.observe.dashboard import GroupWatcher, Publisher
    from marshal_workers.ops.dashboard_server import serve

    app = _optional_app(app_path)
    settings = _load(config_file, app_defaults=None if app is None else app.settings, **options)
    group = settings.require_group()
    described = None if app is None else (lambda: asyncapi_json(app, brokers=settings.brokers))
    watcher = GroupWatcher(settings, group).start()
    publisher = Publisher(watcher.step).start()
    meter = AutoscaleMeter(watcher.step, settings).start()
    try:
        asyncio.run(serve(publisher, settings.dashboard_host, settings.dashboard_port,
                          lambda url: click.echo(f"dashboard of group {group} on {url}   (Ctrl-C stops it)"),
                          asyncapi=described, autoscale=meter))  # fmt: skip
    finally:
        publisher.close()
        watcher.close()
    click.echo("dashboard stopped")


@main.command()
@click.argument("app_path", metavar="MODULE:APP")
@_settings_options
@click.option("--client-id", help="Stable name of this host/instance (default: hostname); unique per supervisor.")
@click.option("--max-partitions", type=click.IntRange(0), help="Most partitions to claim (0: no cap).")
@click.option(
    "--processes", type=click.IntRange(0), help="Worker processes per shared handler (0, the default: one per CPU)."
)
@click.option(
    "--balance",
    type=click.Choice(["fair", "greedy"]),
    help="fair (default): hold an equal share of the group's partitions; greedy: claim every free partition.",
)
@click.option("--shutdown-timeout", help="On SIGTERM, how long workers may finish, e.g. 30s.")
@click.option(
    "--release-if-behind/--no-release-if-behind",
    default=None,
    help="Hand a partition whose worker falls behind or stalls to another member (default on; a handler call "
    "running within its time limit is not a stall).",
)
@click.option(
    "--max-memory-per-worker",
    help="Restart a worker cleanly once its resident memory passes this, e.g. 512MB (a bare number is bytes; 0: never).",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve Prometheus metrics on this port (0: off).")
@click.option(
    "--dashboard/--no-dashboard", default=None, help="Also serve the live dashboard on the metrics port, at /dashboard."
)
@_DRAIN_TARGET
@_reports_errors
def run(app_path: str, config_file: str | None, **options: Any) -> None:
    """Run the handlers of MODULE:APP: one worker process per claimed partition, and --processes workers per
    shared handler."""
    from marshal_workers.runtime.supervisor.supervisor import Supervisor

    app = _app(app_path)
    settings = _load(config_file, app_defaults=app.settings, **options)
    settings.require_group()
    if settings.dashboard and not settings.metrics_port:
        raise ConfigError("the dashboard is served on the metrics port: give --metrics-port too")
    supervisor = Supervisor(app, app_path, settings)
    code = supervisor.run()
    if supervisor.restart_requested and code == 0:
        # SIGHUP: every partition was released; the same command, with the same client id, starts afresh (the
        # application is imported anew) and claims again.  Its fork server and workers are gone with us.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "marshal_workers", *sys.argv[1:]])
    sys.exit(code)


@main.command()
@_settings_options
@click.option("--client-id", help="Stable name of this server (default: hostname); unique per server of the group.")
@click.option("--topic", "serve_topic", help="The shared topic to serve.")
@click.option("--port", "serve_port", type=click.IntRange(0, 65535), help="HTTP port (default 8080).")
@click.option("--host", "serve_host", help="Address to listen on (default 127.0.0.1; another needs a token).")
@click.option("--pending-timeout", "serve_pending_timeout", help="How long a read message stays pending (default 30s).")
@click.option("--max-deliveries", "serve_max_deliveries", type=click.IntRange(1),
              help="Hand-outs of a message before it is dead-lettered (default 5).")  # fmt: skip
@click.option("--range-size", "serve_range_size", type=click.IntRange(1, 65536), help="Offsets per range lease (default 100).")
@click.option("--dlq-topic", "serve_dlq_topic", help="The dead-letter topic (default: <topic>.dlq).")
@click.option("--token", "serve_token", help="Require Authorization: Bearer TOKEN (visible to ps: prefer --token-file).")
@click.option("--token-file", "serve_token_file", help="Read the token from this file (or MARSHAL_WORKERS_SERVE_TOKEN).")
@click.option("--tls-cert", "serve_tls_cert", help="PEM certificate (chain): serve HTTPS.")
@click.option("--tls-key", "serve_tls_key", help="The certificate's PEM private key.")
@click.option("--allow-unauthenticated", is_flag=True, help="Listen on a non-loopback address without a token.")
@click.option("--shutdown-timeout", help="On SIGTERM, how long clients may ack what they hold, e.g. 30s.")
@_reports_errors
def serve(config_file: str | None, allow_unauthenticated: bool, **options: Any) -> None:
    """Serve a shared topic over HTTP: POST /read, /ack and /cancel, for processes with no Kafka client."""
    import asyncio

    from marshal_workers.http.http_service import check_bind, tls_context
    from marshal_workers.http.http_service import serve as serve_http
    from marshal_workers.http.served_topic import ServedTopic, ServeOptions

    settings = _load(config_file, **options)
    group = settings.require_group()
    if not settings.serve_topic:
        raise ConfigError("no topic given: pass --topic (or set serve_topic)")
    token = settings.serve_token_value()
    check_bind(settings.serve_host, token, allow_unauthenticated)
    context = tls_context(settings.serve_tls_cert, settings.serve_tls_key)
    topic = ServedTopic(settings, ServeOptions(
        topic=settings.serve_topic, pending_timeout=settings.serve_pending_timeout,
        max_deliveries=settings.serve_max_deliveries, range_size=settings.serve_range_size,
        dlq_topic=settings.serve_dlq_topic or "",
    )).start()  # fmt: skip
    try:
        asyncio.run(serve_http(
            topic, settings.serve_host, settings.serve_port, token, context, settings.shutdown_timeout,
            lambda url: click.echo(f"serving {settings.serve_topic} of group {group} on {url}"
                                   f"{' (token required)' if token else ''}   (Ctrl-C stops it)", err=True),
        ))  # fmt: skip
    finally:
        topic.close()
    click.echo("serve stopped", err=True)


@main.command()
@click.option("--partitions", type=click.IntRange(1, 256), default=8, show_default=True, help="Partitions of the demo topic.")
@click.option("--rate", type=click.IntRange(1), default=2000, show_default=True, help="Messages produced per second.")
@click.option("--supervisors", type=click.IntRange(1, 8), default=2, show_default=True, help="Supervisor processes.")
@click.option("--duration", type=click.FloatRange(0), default=0, help="Stop after this many seconds (0: at Ctrl-C).")
@_reports_errors
def demo(partitions: int, rate: int, supervisors: int, duration: float) -> None:
    """Everything on the embedded broker: a stream, supervisors sharing it, a live view; Ctrl-C hands over."""
    from marshal_workers.ops.demo import DemoOptions, run_demo

    configure_logging("warning")
    options = DemoOptions(partitions=partitions, rate=rate, supervisors=supervisors, duration=duration)
    sys.exit(run_demo(options))


@main.command("log")
@_settings_options
@click.option("--follow", is_flag=True, help="Keep printing new records until Ctrl-C.")
@click.option(
    "--from-beginning", is_flag=True, help="Print the whole log, not only what follows the latest checkpoint."
)
@_reports_errors
def log_command(config_file: str | None, follow: bool, from_beginning: bool, **options: Any) -> None:
    """Print the group's coordination records, decoded, one per line (from its latest checkpoint on)."""
    from marshal_workers.ops.admin import log_lines

    settings = _load(config_file, **options)
    stop: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    for line in log_lines(settings, follow, stop=lambda: bool(stop), from_beginning=from_beginning):
        click.echo(line)


@main.command("replay")
@click.argument("app_path", metavar="MODULE:APP")
@click.option("--topic", required=True, help="The topic to replay; MODULE:APP must have a handler for it.")
@click.option(
    "--from",
    "start",
    default="earliest",
    show_default=True,
    help="First offset replayed: earliest, latest, an offset, or a time (ISO 8601, UTC if no zone; or @MS).",
)
@click.option(
    "--to", "end", default="latest", show_default=True, help="First offset NOT replayed, in the same forms as --from."
)
@click.option("--partition", type=click.IntRange(0), multiple=True, help="Only these partitions (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--max-split",
    type=click.IntRange(1),
    default=500_000,
    show_default=True,
    help="Most offsets of one partition that one Spark task replays (each task costs ~50 ms to start reading).",
)
@_spark_options
@_kafka_options
@_reports_errors
def replay_command(
    app_path: str,
    topic: str,
    start: str,
    end: str,
    partition: tuple[int, ...],
    as_json: bool,
    spark_master: str,
    spark_conf: tuple[str, ...],
    max_split: int,
    config_file: str | None,
    **options: Any,
) -> None:
    """Run MODULE:APP's handler over a range of TOPIC's history on Spark (never touches the group's positions)."""
    from marshal_workers.spark import planner, ranges, replay
    from marshal_workers.spark.session import parse_spark_conf, spark_session

    conf = parse_spark_conf(spark_conf)
    app = _app(app_path)
    settings = _load(config_file, app_defaults=app.settings, **options)
    if topic not in app.handlers:
        raise ConfigError(f"{app_path} has no handler for topic {topic!r}; it handles {', '.join(app.topics)}")
    # Every check against Kafka happens here, before Spark starts.
    whole = ranges.resolve_ranges(
        settings, topic, list(partition), ranges.parse_bound(start, "--from"), ranges.parse_bound(end, "--to")
    )
    splits = planner.plan_splits(whole, max_split)
    click.echo(
        f"replay of {topic} ({', '.join(f'[{r.partition}] {r.start}..{r.end}' for r in whole)}) with {app_path}: "
        f"{planner.total_size(splits):,} offsets in {len(splits)} splits on {spark_master}",
        err=True,
    )
    if not splits:
        click.echo("nothing to replay: the range is empty", err=True)
        return
    with spark_session(spark_master, conf, f"marshal-workers replay {topic}", settings.log_level) as spark:
        report = replay.replay(spark, app_path, settings, splits)
    if as_json:
        click.echo(orjson.dumps(replay.document(report)).decode())
    else:
        for line in replay.render(report):
            click.echo(line)
    if report.failed:
        raise ReplayFailedError(replay.failure_summary(report))


@main.command("audit")
@_settings_options
@click.option("--out", metavar="DIR", help="Write the tables as Parquet under DIR (or a URL Spark writes to).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--from-beginning", is_flag=True,
    help="Audit the whole log still kept, not only what came after the latest checkpoints.",
)  # fmt: skip
@_spark_options
@_reports_errors
def audit_command(
    config_file: str | None,
    out: str | None,
    as_json: bool,
    from_beginning: bool,
    spark_master: str,
    spark_conf: tuple[str, ...],
    **options: Any,
) -> None:
    """Audit the group's coordination log on Spark: ownership timeline, hand-overs and gaps, zombies, clients."""
    from marshal_workers.spark import audit
    from marshal_workers.spark.planner import total_size
    from marshal_workers.spark.session import parse_spark_conf, spark_session

    conf = parse_spark_conf(spark_conf)
    settings = _load(config_file, **options)
    group = settings.require_group()
    partitions, splits, seeds = audit.plan_log(settings, from_beginning)
    since = f", from the latest checkpoints of {len(seeds)} of them" if seeds else ""
    click.echo(
        f"audit of group {group}: {total_size(splits):,} records of {settings.coordination_topic} "
        f"({partitions} partitions{since}), one task per partition, on {spark_master}",
        err=True,
    )
    with spark_session(spark_master, conf, f"marshal-workers audit {group}", settings.log_level) as spark:
        report = audit.audit(spark, settings, partitions, splits, out, seeds)
    if as_json:
        click.echo(orjson.dumps(audit.document(report)).decode())
    else:
        for line in audit.render(report):
            click.echo(line)


@main.group()
def admin() -> None:
    """Operator commands: pause, drain, release, resume, shut down, set positions (obeyed by every member)."""


_wait_option = click.option(
    "--wait",
    "wait",
    default="60s",
    show_default=True,
    help="Follow the log until the fleet has obeyed, at most this long (0: write the order and return).",
)


def _seconds(option: str, text: str) -> float:
    from marshal_workers.core.durations import parse_duration

    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def _obeyed(done: bool) -> None:
    if not done:
        sys.exit(ExitCode.NOT_YET_OBEYED)


@admin.command("pause")
@_settings_options
@click.option("--topic", help="Pause only this topic: its owners release it, nobody claims it until resumed.")
@click.option("--for", "duration", help="How long, e.g. 30s or 5m (required for the whole group).")
@_wait_option
@_reports_errors
def admin_pause(config_file: str | None, topic: str | None, duration: str | None, wait: str, **options: Any) -> None:
    """Pause the group (every owner drops its partitions; nobody claims until the pause ends), or one topic."""
    from marshal_workers.observe.status import utc_text
    from marshal_workers.ops.admin import pause, pause_topic

    settings = _load(config_file, **options)
    seconds = None if duration is None else _seconds("--for", duration)
    if topic is not None:
        _obeyed(pause_topic(settings, topic, seconds, _seconds("--wait", wait), report=click.echo))
        return
    if seconds is None:
        raise ConfigError("pausing the whole group needs --for (e.g. --for 5m); to pause one topic, give --topic")
    expires = pause(settings, seconds)
    click.echo(f"group {settings.group} paused until {utc_text(expires)}")


@admin.command("resume")
@_settings_options
@click.option("--client", help="End the drain of this client.")
@click.option("--topic", help="End the pause of this topic.")
@_reports_errors
def admin_resume(config_file: str | None, client: str | None, topic: str | None, **options: Any) -> None:
    """End a drain (--client), a topic's pause (--topic) or, with neither, the group's pause."""
    from marshal_workers.ops.admin import resume

    if client is not None and topic is not None:
        raise ConfigError("give --client or --topic, not both")
    resume(_load(config_file, **options), client=client, topic=topic, report=click.echo)


@admin.command("drain")
@_settings_options
@click.option("--client", required=True, help="The client id (--client-id of its supervisors) to drain.")
@_wait_option
@_reports_errors
def admin_drain(config_file: str | None, client: str, wait: str, **options: Any) -> None:
    """Make a client's supervisors release everything and claim nothing until `admin resume --client`."""
    from marshal_workers.ops.admin import drain

    _obeyed(drain(_load(config_file, **options), client, _seconds("--wait", wait), report=click.echo))


@admin.command("shutdown")
@_settings_options
@click.option("--client", required=True, help="The client id (--client-id of its supervisors) to shut down.")
@_wait_option
@_reports_errors
def admin_shutdown(config_file: str | None, client: str, wait: str, **options: Any) -> None:
    """Stop a client's running supervisors as SIGTERM does (release everything at its exact offset, exit 0)."""
    from marshal_workers.ops.admin import shutdown

    _obeyed(shutdown(_load(config_file, **options), client, _seconds("--wait", wait), report=click.echo))


@admin.command("release")
@_settings_options
@click.option("--topic", required=True, help="The topic of the partitions.")
@click.option("--partition", type=click.IntRange(0), multiple=True, required=True, help="A partition (repeatable).")
@_wait_option
@_reports_errors
def admin_release(config_file: str | None, topic: str, partition: tuple[int, ...], wait: str, **options: Any) -> None:
    """Ask the owners of these partitions to hand them over cleanly (to another member, if there is one)."""
    from marshal_workers.ops.admin import release_partitions

    settings = _load(config_file, **options)
    _obeyed(release_partitions(settings, topic, list(partition), _seconds("--wait", wait), report=click.echo))


@admin.command("set-position")
@_settings_options
@click.option("--topic", required=True, help="The topic whose position to set.")
@click.option("--partition", type=click.IntRange(0), multiple=True, help="Only these partitions (repeatable).")
@click.option("--offset", type=click.IntRange(0), help="This offset (the next one to handle).")
@click.option("--earliest", is_flag=True, help="The start of each partition.")
@click.option("--latest", is_flag=True, help="The end of each partition (skip what is there).")
@click.option("--timestamp", help="The first offset at or after this time: ms since epoch or ISO 8601 (UTC if no zone).")
@_reports_errors
def admin_set_position(
    config_file: str | None,
    topic: str,
    partition: tuple[int, ...],
    offset: int | None,
    earliest: bool,
    latest: bool,
    timestamp: str | None,
    **options: Any,
) -> None:
    """Move the group on a topic: pause it, set the positions, resume it."""
    from marshal_workers.kafka.positions import Bound
    from marshal_workers.ops.admin import set_position

    given = [offset is not None, earliest, latest, timestamp is not None]
    if sum(given) != 1:
        raise ConfigError("give exactly one of --offset, --earliest, --latest, --timestamp")
    settings = _load(config_file, **options)
    if offset is not None:
        target = Bound("offset", offset)
    elif timestamp is not None:
        target = Bound("time", _parse_timestamp(timestamp))
    else:
        target = Bound("earliest" if earliest else "latest")
    set_position(settings, topic, list(partition) or None, target, report=click.echo)


@main.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.option("--title", help="The document's title (default: the app's group).")
@click.option("--version", "doc_version", default="1.0.0", show_default=True, help="The document's (the API's) version.")
@click.option("--brokers", help="Name these bootstrap servers (host:port[,host:port]) as the document's servers.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
@_reports_errors
def asyncapi(app_path: str, title: str | None, doc_version: str, brokers: str | None, output: str | None) -> None:
    """Print the AsyncAPI 3.0 document of MODULE:APP: the topics it handles and sends to, and their payloads."""
    from marshal_workers.handlers.asyncapi import asyncapi_json

    text = asyncapi_json(_app(app_path), title, doc_version, brokers)
    if output is None:
        click.echo(text.decode(), nl=False)
    else:
        Path(output).write_bytes(text)


@main.group()
def topics() -> None:
    """The topics an application reads and writes."""


@topics.command("create")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@_kafka_options
@click.option("--topic", "names", multiple=True, metavar="NAME", help="Also this topic (repeatable).")
@click.option("--partitions", type=click.IntRange(1), required=True, help="Partitions of each topic created.")
@click.option("--replication-factor", type=click.IntRange(1), default=None,
              help="Copies of each partition, at most the number of brokers (default: the cluster's default).")  # fmt: skip
@click.option("--topic-config", "topic_config", multiple=True, metavar="KEY=VALUE",
              help="A topic setting for each topic created, e.g. retention.ms=604800000 (repeatable).")  # fmt: skip
@_reports_errors
def topics_create(app_path: str | None, config_file: str | None, names: tuple[str, ...], partitions: int,
                  replication_factor: int | None, topic_config: tuple[str, ...], **options: Any) -> None:  # fmt: skip
    """Create every topic of MODULE:APP that is missing (each handler's topic, each topic it declares it sends to
    with app.sends, each dead-letter topic) and each --topic; topics that exist are reported, not changed."""
    from marshal_workers.ops.topics import create_topics, wanted_topics

    app = _optional_app(app_path)
    settings = _load(config_file, app_defaults=None if app is None else app.settings, **options)
    wanted = wanted_topics(names, app, partitions)
    config = dict(_key_value(item, "--topic-config") for item in topic_config)
    created = create_topics(settings, wanted, replication_factor or -1, config, click.echo)  # -1: the cluster's
    click.echo(f"{created} of {len(wanted)} topics created")


@topics.command("list")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@_kafka_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_reports_errors
def topics_list(app_path: str | None, config_file: str | None, as_json: bool, **options: Any) -> None:
    """The cluster's topics with their partitions; with MODULE:APP, the app's topics and what uses each (a topic
    it needs that is missing is listed as such, and the exit code is 6)."""
    from marshal_workers.ops.topics import listed_topics

    app = _optional_app(app_path)
    settings = _load(config_file, app_defaults=None if app is None else app.settings, **options)
    rows = listed_topics(settings, app)
    if as_json:
        click.echo(orjson.dumps({"topics": rows}).decode())
    else:
        from marshal_workers.observe.status import aligned

        cells = [(row["topic"], "missing" if row["partitions"] is None else str(row["partitions"]),
                  ", ".join(row["used_by"]) or "-") for row in rows]  # fmt: skip
        click.echo("\n".join(aligned(("TOPIC", "PARTITIONS", "USED BY"), cells)))
    missing = [row["topic"] for row in rows if row["partitions"] is None]
    if missing:
        click.echo(f"missing: {', '.join(missing)}: marshal-workers topics create {app_path} --partitions N", err=True)
        sys.exit(ExitCode.UNKNOWN_TOPIC)


def _app(app_path: str) -> Any:
    """MODULE:APP imported as ``run`` imports it: from the current directory too (AppLoadError if it cannot be)."""
    from marshal_workers.handlers.loader import ensure_cwd_importable, load_app

    ensure_cwd_importable()
    return load_app(app_path)


def _optional_app(app_path: str | None) -> Any:
    return None if app_path is None else _app(app_path)


def _key_value(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{option} takes KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()


@main.group()
def dlq() -> None:
    """Dead-letter topics: what is in one, and sending its messages back."""


_DLQ_GROUP = click.option(
    "--group", help="Only the dead letters this group wrote (default: every group's; also the group setting)."
)


@dlq.command("list")
@_kafka_options
@click.option("--topic", required=True, help="The handler's topic: its dead letters are in TOPIC.dlq.")
@_DLQ_GROUP
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_reports_errors
def dlq_list(config_file: str | None, topic: str, as_json: bool, **options: Any) -> None:
    """Summarise TOPIC.dlq by error type: how many, oldest and newest, where they came from; and by group."""
    from marshal_workers.kafka.dead_letter_topic import Tally, read_dead_letters
    from marshal_workers.observe.status import utc_text

    settings = _load(config_file, **options)
    group = settings.group
    tally = Tally()
    for letter in read_dead_letters(settings, f"{topic}.dlq"):
        tally.add(letter)
    rows, groups = tally.rows(None if group is None else {group}), tally.groups()
    if as_json:
        document = {"topic": f"{topic}.dlq", "group": group, "error_types": rows, "groups": groups}
        click.echo(orjson.dumps(document).decode())
        return
    by_group = ", ".join(f"{'no group' if g['group'] is None else 'group ' + g['group']}: {g['count']}" for g in groups)
    count = sum(r["count"] for r in rows)
    if group is None:
        click.echo(f"{topic}.dlq: {count} dead letters" + (f" ({by_group})" if groups else ""))
    else:
        click.echo(f"{topic}.dlq: {count} dead letters of group {group} (of {sum(g['count'] for g in groups)}: "
                   f"{by_group or 'none'})")  # fmt: skip
    for r in rows:
        written = ("dead-lettered -" if r["written_oldest_ms"] is None else
                   f"dead-lettered {utc_text(r['written_oldest_ms'])} .. {utc_text(r['written_newest_ms'])}")
        span = "-" if r["oldest_ms"] is None else f"{utc_text(r['oldest_ms'])} .. {utc_text(r['newest_ms'])}"
        click.echo(f"  {r['error_type']}: {r['count']}   {written}   messages of {span}   "
                   f"from {', '.join(r['from_topics'])}")  # fmt: skip


@dlq.command("redrive")
@_kafka_options
@click.option("--topic", required=True, help="The handler's topic: its dead letters are in TOPIC.dlq.")
@_DLQ_GROUP
@click.option("--error-type", help="Only dead letters of this error_type (e.g. ConnectionError).")
@click.option("--since", help="Only dead letters written (dead-lettered) at or after this time: ms since epoch or "
              "ISO 8601; a letter from before letters said when goes by its message's time.")  # fmt: skip
@click.option("--to", "to_topic", help="Send them here instead of each one's original topic.")
@click.option("--dry-run", is_flag=True, help="Say what would be sent; send nothing.")
@_reports_errors
def dlq_redrive(
    config_file: str | None, topic: str, error_type: str | None, since: str | None, to_topic: str | None,
    dry_run: bool, **options: Any,
) -> None:  # fmt: skip
    """Send dead letters of TOPIC.dlq back (each once, without the error headers), each for the group that wrote
    it only; checks everything first."""
    from marshal_workers.kafka.dead_letter_topic import read_dead_letters
    from marshal_workers.ops.dlq import choose, redrive, targets

    settings = _load(config_file, **options)
    letters = list(read_dead_letters(settings, f"{topic}.dlq"))
    group = settings.group
    chosen = choose(letters, error_type, None if since is None else _parse_timestamp(since, "--since"), group)
    of_group = "" if group is None else f" (group {group})"
    if dry_run:
        targets(settings, f"{topic}.dlq", chosen, to_topic)  # what the real run checks first, the dry run checks
        click.echo(f"would send {len(chosen)} of {len(letters)} dead letters of {topic}.dlq{of_group}")
        return
    redrive(settings, f"{topic}.dlq", chosen, to_topic, click.echo)
    if not chosen:
        click.echo(f"nothing to send: none of the {len(letters)} dead letters of {topic}.dlq matched{of_group}")
    unnamed = sum(1 for letter in letters if letter.group is None)
    if group is not None and unnamed:
        click.echo(f"note: {unnamed} dead letters of {topic}.dlq name no group (written before dead letters named "
                   "their group) and were not chosen: redrive them without --group, for every group", err=True)


def _fault_kinds() -> str:
    from marshal_workers.simulation.faults import FAULT_KINDS

    kinds = "\n".join(f"  {kind}: {what}" for kind, (what, _) in FAULT_KINDS.items())
    return f"\b\nFault kinds (--fault KIND@T[:ARGS], e.g. crash@60s:members=40, freeze@30s:member=3,for=5s):\n{kinds}"


@main.command(epilog=_fault_kinds())
@click.option("--partitions", type=click.IntRange(1), default=256, show_default=True, help="Partitions of the group's topics.")
@click.option("--members", type=click.IntRange(1), default=4, show_default=True, help="Members at the start.")
@click.option("--heartbeat-interval", default="2s", show_default=True, help="HB of the group.")
@click.option("--duration", default="10m", show_default=True, help="Simulated time, e.g. 90s or 10m.")
@click.option("--fault", "faults", multiple=True, metavar="KIND@T[:ARGS]", help="A fault to inject (repeatable; kinds below).")
@click.option("--seed", type=int, default=0, show_default=True, help="One seed, one run, byte for byte.")
@click.option("--seeds", type=click.IntRange(1), default=1, show_default=True,
              help="A sweep: run the seeds from --seed on, print how many broke an invariant and the first.")
@click.option("--balance", type=click.Choice(["fair", "greedy"]), default="fair", show_default=True)
@click.option("--topics", type=click.IntRange(1), default=1, show_default=True, help="Topics the partitions are spread over.")
@click.option("--coordination-partitions", type=click.IntRange(1), default=1, show_default=True,
              help="Partitions of the coordination topic.")
@click.option("--checkpoint-interval", default="0", show_default=True,
              help="Members write checkpoints this often, and a member that starts loads the latest (0: none).")
@click.option("--shared-topics", type=click.IntRange(0), default=0, show_default=True,
              help="The first N topics are shared (shared=True): range leases, never claimed whole.")
@click.option("--amo-topics", type=click.IntRange(0), default=0, show_default=True,
              help="The last N topics are at most once: batch claims (whole) or amo leases (shared).")
@click.option("--pending-timeout", default="6s", show_default=True,
              help="The shared handlers' pending timeout: how long a range lease lasts unless renewed.")
@click.option("--shrink/--no-shrink", "shrink_failures", default=True, show_default=True,
              help="When an invariant breaks, look for a smaller run that breaks it too.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--start-spread", default="100ms", show_default=True,
              help="The members' first passes are spread over this (calibrated on a real fleet: 300ms).")
@click.option("--position-lookup", default="none", show_default=True,
              help="What a claim of a partition with no position in the log costs its member before the worker "
                   "starts, its loop waiting (calibrated on a real fleet: 100ms).")
@_reports_errors
def simulate(partitions: int, members: int, heartbeat_interval: str, duration: str, faults: tuple[str, ...],
             seed: int, seeds: int, balance: str, topics: int, coordination_partitions: int, checkpoint_interval: str,
             shared_topics: int, amo_topics: int, pending_timeout: str, shrink_failures: bool,
             as_json: bool, start_spread: str, position_lookup: str) -> None:  # fmt: skip
    """Simulate a fleet on a virtual clock and log: the real claiming policy and fold, under faults.

    Prints the time until every partition is owned and balanced, hand-overs, coordination records and bytes
    per second, per phase, and whether every invariant held (docs/simulation.md).  Exits 16 if one broke.
    With --shared-topics / --amo-topics, also range-lease and batch-claim records per second, offsets handled
    again and offsets lost at most once.
    """
    from marshal_workers.core.durations import parse_duration, parse_heartbeat_interval
    from marshal_workers.simulation.faults import parse_fault
    from marshal_workers.simulation.report import run as run_simulation
    from marshal_workers.simulation.report import sweep, sweep_text, text
    from marshal_workers.simulation.sim_config import SimConfig

    config = SimConfig(
        partitions=partitions, members=members, heartbeat_s=parse_heartbeat_interval(heartbeat_interval),
        duration_s=parse_duration(duration), seed=seed, faults=tuple(parse_fault(f) for f in faults), balance=balance,
        topics=min(topics, partitions), coordination_partitions=coordination_partitions,
        checkpoint_interval_s=0.0 if checkpoint_interval.strip() in ("0", "0s") else parse_duration(checkpoint_interval),
        shared_topics=shared_topics, amo_topics=amo_topics, pending_timeout_s=parse_duration(pending_timeout),
        start_spread_s=parse_duration(start_spread),
        position_lookup_s=0.0 if position_lookup == "none" else parse_duration(position_lookup),
    )  # fmt: skip
    if max(shared_topics, amo_topics) > config.topics:
        raise click.UsageError(f"--shared-topics and --amo-topics name topics among --topics: at most {config.topics}")
    if seeds > 1:
        started = time.perf_counter()
        swept = sweep(config, seeds)
        swept["wall"] = {"seconds": round(time.perf_counter() - started, 3)}
        click.echo(orjson.dumps(swept).decode() if as_json else sweep_text(swept))
        if swept["broken"]:
            sys.exit(ExitCode.INVARIANT_BROKEN)
        return
    report = run_simulation(config, time.perf_counter, shrink_failures)
    click.echo(orjson.dumps(report).decode() if as_json else text(report))
    if report["violations"]:
        sys.exit(ExitCode.INVARIANT_BROKEN)


def _parse_timestamp(text: str, option: str = "--timestamp") -> int:
    """A time option: ms since epoch, or ISO 8601 (UTC if no zone)."""
    from marshal_workers.kafka.positions import iso_time_ms

    if text.isdigit():
        return int(text)
    try:
        return iso_time_ms(text)
    except ValueError:
        raise ConfigError(f"{option}: expected ms since epoch or ISO 8601 (2026-11-22T10:00:00), got {text!r}") from None
