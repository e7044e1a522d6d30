"""The operator's commands: ``admin`` (orders every member obeys: pause, drain, release, resume, shut down, set
positions), ``dlq`` (what is in a dead-letter topic, and sending it back) and ``topics`` (create and list an
application's topics)."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from marshal_workers.cli.shared import configure, kafka_options, optional_app_at, reports_errors, settings_options
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.errors import ConfigError


@click.group()
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
@settings_options
@click.option("--topic", help="Pause only this topic: its owners release it, nobody claims it until resumed.")
@click.option("--for", "duration", help="How long, e.g. 30s or 5m (required for the whole group).")
@_wait_option
@reports_errors
def admin_pause(config_file: str | None, topic: str | None, duration: str | None, wait: str, **options: Any) -> None:
    """Pause the group (every owner drops its partitions; nobody claims until the pause ends), or one topic."""
    from marshal_workers.observe.status import utc_text
    from marshal_workers.ops.admin import pause, pause_topic

    settings = configure(config_file, **options)
    seconds = None if duration is None else _seconds("--for", duration)
    if topic is not None:
        _obeyed(pause_topic(settings, topic, seconds, _seconds("--wait", wait), report=click.echo))
        return
    if seconds is None:
        raise ConfigError("pausing the whole group needs --for (e.g. --for 5m); to pause one topic, give --topic")
    expires = pause(settings, seconds)
    click.echo(f"group {settings.group} paused until {utc_text(expires)}")


@admin.command("resume")
@settings_options
@click.option("--client", help="End the drain of this client.")
@click.option("--topic", help="End the pause of this topic.")
@reports_errors
def admin_resume(config_file: str | None, client: str | None, topic: str | None, **options: Any) -> None:
    """End a drain (--client), a topic's pause (--topic) or, with neither, the group's pause."""
    from marshal_workers.ops.admin import resume

    if client is not None and topic is not None:
        raise ConfigError("give --client or --topic, not both")
    resume(configure(config_file, **options), client=client, topic=topic, report=click.echo)


@admin.command("drain")
@settings_options
@click.option("--client", required=True, help="The client id (--client-id of its supervisors) to drain.")
@_wait_option
@reports_errors
def admin_drain(config_file: str | None, client: str, wait: str, **options: Any) -> None:
    """Make a client's supervisors release everything and claim nothing until `admin resume --client`."""
    from marshal_workers.ops.admin import drain

    _obeyed(drain(configure(config_file, **options), client, _seconds("--wait", wait), report=click.echo))


@admin.command("shutdown")
@settings_options
@click.option("--client", required=True, help="The client id (--client-id of its supervisors) to shut down.")
@_wait_option
@reports_errors
def admin_shutdown(config_file: str | None, client: str, wait: str, **options: Any) -> None:
    """Stop a client's running supervisors as SIGTERM does (release everything at its exact offset, exit 0)."""
    from marshal_workers.ops.admin import shutdown

    _obeyed(shutdown(configure(config_file, **options), client, _seconds("--wait", wait), report=click.echo))


@admin.command("release")
@settings_options
@click.option("--topic", required=True, help="The topic of the partitions.")
@click.option("--partition", type=click.IntRange(0), multiple=True, required=True, help="A partition (repeatable).")
@_wait_option
@reports_errors
def admin_release(config_file: str | None, topic: str, partition: tuple[int, ...], wait: str, **options: Any) -> None:
    """Ask the owners of these partitions to hand them over cleanly (to another member, if there is one)."""
    from marshal_workers.ops.admin import release_partitions

    settings = configure(config_file, **options)
    _obeyed(release_partitions(settings, topic, list(partition), _seconds("--wait", wait), report=click.echo))


@admin.command("set-position")
@settings_options
@click.option("--topic", required=True, help="The topic whose position to set.")
@click.option("--partition", type=click.IntRange(0), multiple=True, help="Only these partitions (repeatable).")
@click.option("--offset", type=click.IntRange(0), help="This offset (the next one to handle).")
@click.option("--earliest", is_flag=True, help="The start of each partition.")
@click.option("--latest", is_flag=True, help="The end of each partition (skip what is there).")
@click.option(
    "--timestamp", help="The first offset at or after this time: ms since epoch or ISO 8601 (UTC if no zone)."
)
@reports_errors
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
    from marshal_workers.kafka.partition_positions import Bound
    from marshal_workers.ops.admin import set_position

    given = [offset is not None, earliest, latest, timestamp is not None]
    if sum(given) != 1:
        raise ConfigError("give exactly one of --offset, --earliest, --latest, --timestamp")
    settings = configure(config_file, **options)
    if offset is not None:
        target = Bound("offset", offset)
    elif timestamp is not None:
        target = Bound("time", _parse_timestamp(timestamp))
    else:
        target = Bound("earliest" if earliest else "latest")
    set_position(settings, topic, list(partition) or None, target, report=click.echo)


@click.group()
def dlq() -> None:
    """Dead-letter topics: what is in one, and sending its messages back."""


_DLQ_GROUP = click.option(
    "--group", help="Only the dead letters this group wrote (default: every group's; also the group setting)."
)


@dlq.command("list")
@kafka_options
@click.option("--topic", required=True, help="The handler's topic: its dead letters are in TOPIC.dlq.")
@_DLQ_GROUP
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@reports_errors
def dlq_list(config_file: str | None, topic: str, as_json: bool, **options: Any) -> None:
    """Summarise TOPIC.dlq by error type: how many, oldest and newest, where they came from; and by group."""
    from marshal_workers.kafka.dead_letter_reader import Tally, read_dead_letters
    from marshal_workers.observe.status import utc_text

    settings = configure(config_file, **options)
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
        click.echo(
            f"{topic}.dlq: {count} dead letters of group {group} (of {sum(g['count'] for g in groups)}: "
            f"{by_group or 'none'})"
        )
    for r in rows:
        written = (
            "dead-lettered -"
            if r["written_oldest_ms"] is None
            else f"dead-lettered {utc_text(r['written_oldest_ms'])} .. {utc_text(r['written_newest_ms'])}"
        )
        span = "-" if r["oldest_ms"] is None else f"{utc_text(r['oldest_ms'])} .. {utc_text(r['newest_ms'])}"
        click.echo(
            f"  {r['error_type']}: {r['count']}   {written}   messages of {span}   from {', '.join(r['from_topics'])}"
        )


@dlq.command("redrive")
@kafka_options
@click.option("--topic", required=True, help="The handler's topic: its dead letters are in TOPIC.dlq.")
@_DLQ_GROUP
@click.option("--error-type", help="Only dead letters of this error_type (e.g. ConnectionError).")
@click.option(
    "--since",
    help="Only dead letters written (dead-lettered) at or after this time: ms since epoch or "
    "ISO 8601; a letter from before letters said when goes by its message's time.",
)
@click.option("--to", "to_topic", help="Send them here instead of each one's original topic.")
@click.option("--dry-run", is_flag=True, help="Say what would be sent; send nothing.")
@reports_errors
def dlq_redrive(
    config_file: str | None,
    topic: str,
    error_type: str | None,
    since: str | None,
    to_topic: str | None,
    dry_run: bool,
    **options: Any,
) -> None:
    """Send dead letters of TOPIC.dlq back (each once, without the error headers), each for the group that wrote
    it only; checks everything first."""
    from marshal_workers.kafka.dead_letter_reader import read_dead_letters
    from marshal_workers.ops.dlq import choose, redrive, targets

    settings = configure(config_file, **options)
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
        click.echo(
            f"note: {unnamed} dead letters of {topic}.dlq name no group (written before dead letters named "
            "their group) and were not chosen: redrive them without --group, for every group",
            err=True,
        )


@click.group()
def topics() -> None:
    """The topics an application reads and writes."""


@topics.command("create")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@kafka_options
@click.option("--topic", "names", multiple=True, metavar="NAME", help="Also this topic (repeatable).")
@click.option("--partitions", type=click.IntRange(1), required=True, help="Partitions of each topic created.")
@click.option(
    "--replication-factor",
    type=click.IntRange(1),
    default=None,
    help="Copies of each partition, at most the number of brokers (default: the cluster's default).",
)
@click.option(
    "--topic-config",
    "topic_config",
    multiple=True,
    metavar="KEY=VALUE",
    help="A topic setting for each topic created, e.g. retention.ms=604800000 (repeatable).",
)
@reports_errors
def topics_create(
    app_path: str | None,
    config_file: str | None,
    names: tuple[str, ...],
    partitions: int,
    replication_factor: int | None,
    topic_config: tuple[str, ...],
    **options: Any,
) -> None:
    """Create every topic of MODULE:APP that is missing (each handler's topic, each topic it declares it sends to
    with app.sends, each dead-letter topic) and each --topic; topics that exist are reported, not changed."""
    from marshal_workers.ops.topics import create_topics, wanted_topics

    app = optional_app_at(app_path)
    settings = configure(config_file, app_defaults=None if app is None else app.settings, **options)
    wanted = wanted_topics(names, app, partitions)
    config = dict(_key_value(item, "--topic-config") for item in topic_config)
    created = create_topics(settings, wanted, replication_factor or -1, config, click.echo)  # -1: the cluster's
    click.echo(f"{created} of {len(wanted)} topics created")


@topics.command("list")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@kafka_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@reports_errors
def topics_list(app_path: str | None, config_file: str | None, as_json: bool, **options: Any) -> None:
    """The cluster's topics with their partitions; with MODULE:APP, the app's topics and what uses each (a topic
    it needs that is missing is listed as such, and the exit code is 6)."""
    from marshal_workers.ops.topics import listed_topics

    app = optional_app_at(app_path)
    settings = configure(config_file, app_defaults=None if app is None else app.settings, **options)
    rows = listed_topics(settings, app)
    if as_json:
        click.echo(orjson.dumps({"topics": rows}).decode())
    else:
        from marshal_workers.observe.status import aligned

        cells = [
            (
                row["topic"],
                "missing" if row["partitions"] is None else str(row["partitions"]),
                ", ".join(row["used_by"]) or "-",
            )
            for row in rows
        ]
        click.echo("\n".join(aligned(("TOPIC", "PARTITIONS", "USED BY"), cells)))
    missing = [row["topic"] for row in rows if row["partitions"] is None]
    if missing:
        click.echo(f"missing: {', '.join(missing)}: marshal-workers topics create {app_path} --partitions N", err=True)
        sys.exit(ExitCode.UNKNOWN_TOPIC)


def _key_value(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{option} takes KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()


def _parse_timestamp(text: str, option: str = "--timestamp") -> int:
    """A time option: ms since epoch, or ISO 8601 (UTC if no zone)."""
    from marshal_workers.kafka.partition_positions import iso_time_ms

    if text.isdigit():
        return int(text)
    try:
        return iso_time_ms(text)
    except ValueError:
        raise ConfigError(
            f"{option}: expected ms since epoch or ISO 8601 (2026-11-22T10:00:00), got {text!r}"
        ) from None
