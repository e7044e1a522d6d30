"""The tools beside a running group: ``simulate`` (a fleet on a virtual clock), ``replay`` and ``audit`` (an
application over a topic's history, and a group's coordination log, on Spark) and ``asyncapi`` (an application's
AsyncAPI document)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from marshal_workers.cli.shared import app_at, configure, kafka_options, reports_errors, settings_options, spark_options
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.errors import ConfigError, ReplayFailedError


def _fault_kinds() -> str:
    from marshal_workers.simulation.faults import FAULT_KINDS

    kinds = "\n".join(f"  {kind}: {what}" for kind, (what, _) in FAULT_KINDS.items())
    return f"\b\nFault kinds (--fault KIND@T[:ARGS], e.g. crash@60s:members=40, freeze@30s:member=3,for=5s):\n{kinds}"


@click.command(epilog=_fault_kinds())
@click.option(
    "--partitions", type=click.IntRange(1), default=256, show_default=True, help="Partitions of the group's topics."
)
@click.option("--members", type=click.IntRange(1), default=4, show_default=True, help="Members at the start.")
@click.option("--heartbeat-interval", default="2s", show_default=True, help="HB of the group.")
@click.option("--duration", default="10m", show_default=True, help="Simulated time, e.g. 90s or 10m.")
@click.option(
    "--fault", "faults", multiple=True, metavar="KIND@T[:ARGS]", help="A fault to inject (repeatable; kinds below)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="One seed, one run, byte for byte.")
@click.option(
    "--seeds",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="A sweep: run the seeds from --seed on, print how many broke an invariant and the first.",
)
@click.option("--balance", type=click.Choice(["fair", "greedy"]), default="fair", show_default=True)
@click.option(
    "--topics", type=click.IntRange(1), default=1, show_default=True, help="Topics the partitions are spread over."
)
@click.option(
    "--coordination-partitions",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Partitions of the coordination topic.",
)
@click.option(
    "--checkpoint-interval",
    default="0",
    show_default=True,
    help="Members write checkpoints this often, and a member that starts loads the latest (0: none).",
)
@click.option(
    "--shared-topics",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The first N topics are shared (shared=True): range leases, never claimed whole.",
)
@click.option(
    "--amo-topics",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The last N topics are at most once: batch claims (whole) or amo leases (shared).",
)
@click.option(
    "--pending-timeout",
    default="6s",
    show_default=True,
    help="The shared handlers' pending timeout: how long a range lease lasts unless renewed.",
)
@click.option(
    "--shrink/--no-shrink",
    "shrink_failures",
    default=True,
    show_default=True,
    help="When an invariant breaks, look for a smaller run that breaks it too.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--start-spread",
    default="100ms",
    show_default=True,
    help="The members' first passes are spread over this (calibrated on a real fleet: 300ms).",
)
@click.option(
    "--position-lookup",
    default="none",
    show_default=True,
    help="What a claim of a partition with no position in the log costs its member before the worker "
    "starts, its loop waiting (calibrated on a real fleet: 100ms).",
)
@reports_errors
def simulate(
    partitions: int,
    members: int,
    heartbeat_interval: str,
    duration: str,
    faults: tuple[str, ...],
    seed: int,
    seeds: int,
    balance: str,
    topics: int,
    coordination_partitions: int,
    checkpoint_interval: str,
    shared_topics: int,
    amo_topics: int,
    pending_timeout: str,
    shrink_failures: bool,
    as_json: bool,
    start_spread: str,
    position_lookup: str,
) -> None:
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
        partitions=partitions,
        members=members,
        heartbeat_s=parse_heartbeat_interval(heartbeat_interval),
        duration_s=parse_duration(duration),
        seed=seed,
        faults=tuple(parse_fault(f) for f in faults),
        balance=balance,
        topics=min(topics, partitions),
        coordination_partitions=coordination_partitions,
        checkpoint_interval_s=0.0
        if checkpoint_interval.strip() in ("0", "0s")
        else parse_duration(checkpoint_interval),
        shared_topics=shared_topics,
        amo_topics=amo_topics,
        pending_timeout_s=parse_duration(pending_timeout),
        start_spread_s=parse_duration(start_spread),
        position_lookup_s=0.0 if position_lookup == "none" else parse_duration(position_lookup),
    )
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


@click.command("replay")
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
@spark_options
@kafka_options
@reports_errors
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
    app = app_at(app_path)
    settings = configure(config_file, app_defaults=app.settings, **options)
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


@click.command("audit")
@settings_options
@click.option("--out", metavar="DIR", help="Write the tables as Parquet under DIR (or a URL Spark writes to).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Audit the whole log still kept, not only what came after the latest checkpoints.",
)
@spark_options
@reports_errors
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
    settings = configure(config_file, **options)
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


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.option("--title", help="The document's title (default: the app's group).")
@click.option(
    "--version", "doc_version", default="1.0.0", show_default=True, help="The document's (the API's) version."
)
@click.option("--brokers", help="Name these bootstrap servers (host:port[,host:port]) as the document's servers.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
@reports_errors
def asyncapi(app_path: str, title: str | None, doc_version: str, brokers: str | None, output: str | None) -> None:
    """Print the AsyncAPI 3.0 document of MODULE:APP: the topics it handles and sends to, and their payloads."""
    from marshal_workers.handlers.asyncapi import asyncapi_json

    text = asyncapi_json(app_at(app_path), title, doc_version, brokers)
    if output is None:
        click.echo(text.decode(), nl=False)
    else:
        Path(output).write_bytes(text)
