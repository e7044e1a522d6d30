"""What the commands share: their exit codes, the options every command of a kind takes, their settings and
logging, and the application they import (MODULE:APP)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

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


def reports_errors(command: F) -> F:
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
settings_options = _options(
    _CONFIG,
    _BROKERS,
    click.option("--group", help="The consumer group."),
    click.option("--coordination-topic", help="Coordination topic (default __marshal)."),
    click.option("--heartbeat-interval", help="HB of the group, e.g. 5s (all members must agree)."),
    _CONNECT_TIMEOUT,
    _LOG_LEVEL,
    _LOG_FORMAT,
)
# The options of a command that reads Kafka but never joins a group (replay, dlq, topics).
kafka_options = _options(_CONFIG, _BROKERS, _CONNECT_TIMEOUT, _LOG_LEVEL, _LOG_FORMAT)

# Where Spark runs (replay, audit).
spark_options = _options(
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

# Autoscaling's drain target (run, status --autoscale, dashboard).
DRAIN_TARGET = click.option(
    "--drain-target", help="Autoscaling: how soon the wanted workers should drain the backlog (default 60s)."
)


def configure(config_file: str | None, app_defaults: dict[str, Any] | None = None, **cli: Any) -> Settings:
    """The command's settings (defaults < app < file < environment < its options), and logging set up by them."""
    settings = load_settings(config_file, cli, app_defaults=app_defaults)
    configure_logging(settings.log_level, settings.log_format)
    return settings


def app_at(app_path: str) -> Any:
    """MODULE:APP imported as ``run`` imports it: from the current directory too (AppLoadError if it cannot be)."""
    from marshal_workers.handlers.loader import ensure_cwd_importable, load_app

    ensure_cwd_importable()
    return load_app(app_path)


def optional_app_at(app_path: str | None) -> Any:
    """The app of an optional MODULE:APP argument or option; None if it was not given."""
    return None if app_path is None else app_at(app_path)
