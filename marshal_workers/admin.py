"""Operator actions on a group: pause it, set its position, read its coordination log.

The operator writes as its own client (``admin@<client_id>``), never as a
supervisor's: during a pause, the releases of the client that wrote the
``release_group`` set the group's positions (DESIGN.md section 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

from marshal_workers import checkpoints, codec
from marshal_workers.config import Settings
from marshal_workers.coordination_log import find_checkpoints
from marshal_workers.coordinator import Coordinator
from marshal_workers.errors import ConfigError, DecodeError, UnknownGroupError
from marshal_workers.kafka_clients import admin_client, reader_config, require_topic, topic_partition_count
from marshal_workers.positions import Bound, chosen_partitions, offsets_at, partition_bounds, position_consumer
from marshal_workers.status import utc_iso
from marshal_workers.world_state import WorldState, record_time, refusals

MAX_TIMESTAMP_MS = 2**63 - 1
_HINT = "use --earliest, --latest, --timestamp, or --partition to pick partitions"


def admin_settings(settings: Settings) -> Settings:
    return replace(settings, client_id=f"admin@{settings.client_id}")


@contextmanager
def known_group(settings: Settings) -> Iterator[Coordinator]:
    """The operator's coordinator, once its reading of the log shows the group.

    A group the coordination log has never heard of is most likely a typo:
    refuse it and write nothing, not even a coordination topic.  (The log is
    read once, by the coordinator that then writes.)
    """
    group = settings.require_group()
    unknown = UnknownGroupError(
        f"group {group!r} has no record in {settings.coordination_topic} on {settings.brokers}; "
        "check --group and --coordination-topic"
    )
    if topic_partition_count(admin_client(settings), settings, settings.coordination_topic) is None:
        raise unknown
    with Coordinator(admin_settings(settings)) as coordinator:
        if not coordinator.read(lambda state: bool(state.partitions or state.pauses)):
            raise unknown
        yield coordinator


def pause(settings: Settings, seconds: float) -> int:
    """Pause the group for ``seconds``: every owner is dropped and nobody may claim. Returns the expiry (ms)."""
    duration_ms = int(seconds * 1000)
    if time.time() * 1000 + duration_ms > MAX_TIMESTAMP_MS:  # checked before anything is read or opened
        raise ConfigError(f"a pause of {seconds:g}s ends past what the protocol can write (int64 ms); use less")
    with known_group(settings) as coordinator:
        expires = coordinator.now_ms() + duration_ms
        coordinator.release_group(expires)
        return expires


def set_position(
    settings: Settings,
    topic: str,
    partitions: Sequence[int] | None,
    target: Bound,
    report: Callable[[str], None] = print,
) -> dict[int, int]:
    """Move the group on ``topic`` (all partitions, or those given) to ``target``.

    Every check comes first (the group's last), so a bad request writes nothing.  Then: pause the
    group, wait 2*HB (every worker's lease lapses, none handles anything more),
    write the positions as the operator's releases, and end the pause; running
    supervisors claim again and resume there.  Returns partition -> offset.
    """
    count = require_topic(admin_client(settings), settings, topic)
    chosen = chosen_partitions(count, topic, partitions, ConfigError)
    positions = resolve_positions(settings, topic, chosen, target)

    with known_group(settings) as coordinator:
        hold_ms = 2 * settings.heartbeat_ms + 1000
        coordinator.release_group(coordinator.now_ms() + 2 * hold_ms)
        report(f"group {settings.group} paused; waiting {hold_ms / 1000:g}s for every worker to stop")
        time.sleep(hold_ms / 1000)
        for partition, offset in positions.items():
            if not coordinator.release(topic, partition, offset):
                raise ConfigError(f"the position of {topic}[{partition}] was refused (did the pause end early?)")
            report(f"{topic}[{partition}] -> {offset}")
        coordinator.release_group(coordinator.now_ms())  # ends the pause now
    report(f"group {settings.group} resumed")
    return positions


def resolve_positions(settings: Settings, topic: str, partitions: Sequence[int], target: Bound) -> dict[int, int]:
    """The offset for each partition, checked against the partition's log: nothing beyond its end."""
    consumer = position_consumer(settings)
    try:
        bounds = partition_bounds(consumer, settings, topic, partitions)
        return offsets_at(consumer, settings, topic, bounds, target, "--offset", ConfigError, _HINT)
    finally:
        consumer.close()


def log_lines(
    settings: Settings, follow: bool, stop: Callable[[], bool] = lambda: False, from_beginning: bool = False
) -> Iterator[str]:
    """The group's coordination records, decoded, one line each, in log order per coordination partition.

    From the latest checkpoint of each partition on (the checkpoint included), or the whole log.  Each record is
    folded as every member folds it, from the checkpoint's state: one the rules refused says why at its end.
    """
    group = settings.require_group()
    admin = admin_client(settings)
    count = topic_partition_count(admin, settings, settings.coordination_topic)
    if count is None:
        return
    consumer = Consumer(reader_config(settings, "log"))
    starts = [OFFSET_BEGINNING] * count
    state = WorldState(group, settings.heartbeat_ms, count)
    if not from_beginning:
        found = find_checkpoints(settings, settings.coordination_topic, count, group)
        starts = [OFFSET_BEGINNING if parts is None else parts[0].as_of for parts in found]
        for partition, parts in enumerate(found):
            if parts is not None:
                checkpoints.seed(state, parts, partition)
    consumer.assign([TopicPartition(settings.coordination_topic, p, starts[p]) for p in range(count)])
    at_end: set[int] = set()
    try:
        while not stop() and (follow or len(at_end) < count):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                at_end.add(message.partition())
                continue
            kind, stamp = message.timestamp()
            log_append_time = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None
            line = fold_record(state, message.value(), message.partition(), message.offset(), log_append_time)
            if line is not None:
                yield line
    finally:
        consumer.close()


def fold_record(
    state: WorldState, value: bytes | None, partition: int, offset: int, log_append_time: int | None = None
) -> str | None:
    """Fold one record into ``state`` and show it as ``format_record`` does, with the fold's verdict when it
    refused the record (or some of its entries): ``... refused: owned by a/a1, ...``, ``... (ignored: not the owner;
    ...)``.  None if it belongs to another group."""
    where = f"{partition}@{offset}"
    try:
        record, verdict = state.apply_value(value, partition, log_append_time)
    except DecodeError as exc:
        return f"{where} garbage: {exc}"
    if record.group != state.group:
        return None
    why = refusals(state, record, record_time(record, log_append_time), partition, verdict)
    return _describe(record, where) + ("" if not why else " " + "; ".join(why))


def format_record(value: bytes | None, partition: int, offset: int, group: str) -> str | None:
    """One record as a line for people; None if it belongs to another group.  Garbage is shown as such."""
    where = f"{partition}@{offset}"
    try:
        record = codec.decode(value)
    except DecodeError as exc:
        return f"{where} garbage: {exc}"
    if record.group != group:
        return None
    return _describe(record, where)


def _describe(record: codec.Record, where: str) -> str:
    who = f"{record.client}/{record.instance}"
    kind = type(record).__struct_config__.tag
    stamp = utc_iso(record.ts)
    if isinstance(record, codec.ReleaseGroup):
        return f"{where} {stamp} {kind} {who} expires={utc_iso(record.expires)}"
    if isinstance(record, codec.Checkpoint):
        return f"{where} {stamp} {kind} {who} part {record.part + 1}/{record.parts} as_of={record.as_of} " \
               f"positions={len(record.positions)}"  # fmt: skip
    if isinstance(record, codec.Heartbeats):
        beats = " ".join(f"[{b.partition}]={b.offset}" for b in record.beats)
        return f"{where} {stamp} {kind} {who} {record.topic} {beats}"
    if isinstance(record, codec.MessageClaims):
        claims = " ".join(f"[{c.partition}]<{c.offset}" for c in record.claims)
        return f"{where} {stamp} {kind} {who} {record.topic} {claims}"
    if isinstance(record, codec.RANGE_RECORD_TYPES):
        lease = f" lease={record.lease_ms}ms" if isinstance(record, (codec.ClaimRanges, codec.RenewRanges)) else ""
        amo = " amo" if isinstance(record, codec.ClaimRanges) and record.amo else ""
        ranges = " ".join(_range_text(entry) for entry in record.ranges)
        return f"{where} {stamp} {kind} {who} {record.topic}{lease}{amo} {ranges}"
    detail = f" offset={record.offset}" if not isinstance(record, codec.Claim) else ""
    return f"{where} {stamp} {kind} {who} {record.topic}[{record.partition}]{detail}"


def _range_text(entry: codec.RangeEntry) -> str:
    """``[partition]first..last``, with an ack's failed, dead-lettered offsets and seen end."""
    text = f"[{entry.partition}]{entry.offset}..{entry.end - 1}"
    if isinstance(entry, codec.AckEntry):
        text += "".join(f" {name}={','.join(map(str, found))}" for name, found in (("failed", entry.failed),
                        ("dead", entry.dead)) if found)  # fmt: skip
        text += f" high={entry.high}" if entry.high is not None else ""
    return text
