"""The commands that run until stopped: ``run`` (the supervisor of an application's workers), ``serve`` (a shared
topic over HTTP), ``demo`` and ``broker`` (the embedded broker)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import click

from marshal_workers.cli.shared import DRAIN_TARGET, app_at, configure, reports_errors, settings_options
from marshal_workers.core.logs import configure_logging
from marshal_workers.errors import ConfigError, EmbeddedBrokerError
from marshal_workers.kafka.embedded_broker import EmbeddedBroker


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9092,
    show_default=True,
    help="Port on 127.0.0.1 (0: any free port).",
)
@reports_errors
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
                raise EmbeddedBrokerError(
                    f"the broker exited with code {embedded.process.returncode}; see {embedded.log_path}"
                )
            time.sleep(0.2)
    click.echo("embedded broker stopped")


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@settings_options
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
@DRAIN_TARGET
@reports_errors
def run(app_path: str, config_file: str | None, **options: Any) -> None:
    """Run the handlers of MODULE:APP: one worker process per claimed partition, and --processes workers per
    shared handler."""
    from marshal_workers.runtime.supervisor.supervisor import Supervisor

    app = app_at(app_path)
    settings = configure(config_file, app_defaults=app.settings, **options)
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


@click.command()
@settings_options
@click.option("--client-id", help="Stable name of this server (default: hostname); unique per server of the group.")
@click.option("--topic", "serve_topic", help="The shared topic to serve.")
@click.option("--port", "serve_port", type=click.IntRange(0, 65535), help="HTTP port (default 8080).")
@click.option("--host", "serve_host", help="Address to listen on (default 127.0.0.1; another needs a token).")
@click.option("--pending-timeout", "serve_pending_timeout", help="How long a read message stays pending (default 30s).")
@click.option(
    "--max-deliveries",
    "serve_max_deliveries",
    type=click.IntRange(1),
    help="Hand-outs of a message before it is dead-lettered (default 5).",
)
@click.option(
    "--range-size",
    "serve_range_size",
    type=click.IntRange(1, 65536),
    help="Offsets per range lease, at least (default 100; larger for readers that empty one in 0.1 s, up to 2,000).",
)
@click.option("--dlq-topic", "serve_dlq_topic", help="The dead-letter topic (default: <topic>.dlq).")
@click.option(
    "--token", "serve_token", help="Require Authorization: Bearer TOKEN (visible to ps: prefer --token-file)."
)
@click.option(
    "--token-file", "serve_token_file", help="Read the token from this file (or MARSHAL_WORKERS_SERVE_TOKEN)."
)
@click.option("--tls-cert", "serve_tls_cert", help="PEM certificate (chain): serve HTTPS.")
@click.option("--tls-key", "serve_tls_key", help="The certificate's PEM private key.")
@click.option("--allow-unauthenticated", is_flag=True, help="Listen on a non-loopback address without a token.")
@click.option("--shutdown-timeout", help="On SIGTERM, how long clients may ack what they hold, e.g. 30s.")
@reports_errors
def serve(config_file: str | None, allow_unauthenticated: bool, **options: Any) -> None:
    """Serve a shared topic over HTTP: POST /read, /ack and /cancel, for processes with no Kafka client."""
    import asyncio

    from marshal_workers.http.http_service import check_bind, tls_context
    from marshal_workers.http.http_service import serve as serve_http
    from marshal_workers.http.served_topic import ServedTopic, ServeOptions

    settings = configure(config_file, **options)
    group = settings.require_group()
    if not settings.serve_topic:
        raise ConfigError("no topic given: pass --topic (or set serve_topic)")
    token = settings.serve_token_value()
    check_bind(settings.serve_host, token, allow_unauthenticated)
    context = tls_context(settings.serve_tls_cert, settings.serve_tls_key)
    topic = ServedTopic(
        settings,
        ServeOptions(
            topic=settings.serve_topic,
            pending_timeout=settings.serve_pending_timeout,
            max_deliveries=settings.serve_max_deliveries,
            range_size=settings.serve_range_size,
            dlq_topic=settings.serve_dlq_topic or "",
        ),
    ).start()
    try:
        asyncio.run(
            serve_http(
                topic,
                settings.serve_host,
                settings.serve_port,
                token,
                context,
                settings.shutdown_timeout,
                lambda url: click.echo(
                    f"serving {settings.serve_topic} of group {group} on {url}"
                    f"{' (token required)' if token else ''}   (Ctrl-C stops it)",
                    err=True,
                ),
            )
        )
    finally:
        topic.close()
    click.echo("serve stopped", err=True)


@click.command()
@click.option(
    "--partitions", type=click.IntRange(1, 256), default=8, show_default=True, help="Partitions of the demo topic."
)
@click.option("--rate", type=click.IntRange(1), default=2000, show_default=True, help="Messages produced per second.")
@click.option("--supervisors", type=click.IntRange(1, 8), default=2, show_default=True, help="Supervisor processes.")
@click.option("--duration", type=click.FloatRange(0), default=0, help="Stop after this many seconds (0: at Ctrl-C).")
@reports_errors
def demo(partitions: int, rate: int, supervisors: int, duration: float) -> None:
    """Everything on the embedded broker: a stream, supervisors sharing it, a live view; Ctrl-C hands over."""
    from marshal_workers.ops.demo import DemoOptions, run_demo

    configure_logging("warning")
    options = DemoOptions(partitions=partitions, rate=rate, supervisors=supervisors, duration=duration)
    sys.exit(run_demo(options))
