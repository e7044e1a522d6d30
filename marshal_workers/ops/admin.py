"""Operator actions on a group: pause it, set its position, read its coordination log.

The operator writes as its own client (``admin@<client_id>``), never as a
supervisor's: during a pause, the releases of the client that wrote the
``release_group`` set the group's positions (docs/protocol.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from marshal_workers.core.config import Settings
from marshal_workers.errors import ConfigError, DecodeError, UnknownGroupError
from marshal_workers.kafka.catch_up import partition_ended, read_record
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.kafka_clients import admin_client, require_topic, topic_partition_count
from marshal_workers.kafka.partition_positions import (
    Bound,
    chosen_partitions,
    offsets_at,
    partition_bounds,
    position_consumer,
)
from marshal_workers.kafka.reader_start import begin_catching_up, log_consumer
from marshal_workers.observe.status import utc_iso
from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.refusals import refusals
from marshal_workers.protocol.world_state import WorldState, record_time

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
    unknown = unknown_group(settings)
    if topic_partition_count(admin_client(settings), settings, settings.coordination_topic) is None:
        raise unknown
    with Coordinator(admin_settings(settings)) as coordinator:
        if not coordinator.read(WorldState.has_records):
            raise unknown
        yield coordinator


def unknown_group(settings: Settings) -> UnknownGroupError:
    """The error of every command given a group the coordination log holds nothing of (WorldState.has_records)."""
    return UnknownGroupError(
        f"group {settings.require_group()!r} has no record in {settings.coordination_topic} on {settings.brokers}; "
        "check --group and --coordination-topic"
    )


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


# ------------------------------------------------------------------ remote control
# Orders every member obeys (remote_control.py): written, then followed until the fleet has done what they ask,
# so the operator sees the result, not just the request.

Report = Callable[[str], None]


def drain(settings: Settings, client: str, wait_s: float, report: Report = print) -> bool:
    """Order ``client``'s supervisors to release everything and claim nothing until resumed."""
    said = f"client {client} drained: it releases everything and claims nothing until `admin resume --client`"
    return _order_client(settings, client, "drain", said, wait_s, report)


def shutdown(settings: Settings, client: str, wait_s: float, report: Report = print) -> bool:
    """Order ``client``'s running supervisors to stop as on SIGTERM (one started later is not affected)."""
    said = f"client {client}: shutdown ordered; its supervisors release everything and exit"
    return _order_client(settings, client, "shutdown", said, wait_s, report)


def _order_client(
    settings: Settings, client: str, action: codec.ControlAction, said: str, wait_s: float, report: Report
) -> bool:
    """Write an order to a known client's supervisors, then follow the log until they hold nothing."""
    with known_group(settings) as coordinator:
        _require_client(coordinator, client)
        coordinator.write_everywhere(codec.Control(**coordinator.record_fields(), target=client, action=action))
        report(said)
        return _wait(coordinator, wait_s, report, lambda world, now: _holdings_of(world, now, client=client))


def resume(settings: Settings, client: str | None = None, topic: str | None = None, report: Report = print) -> None:
    """End a drain (``client``), a topic pause (``topic``) or, with neither, the group's pause."""
    with known_group(settings) as coordinator:
        now_ms = coordinator.now_ms()
        if client is not None:
            if not coordinator.read(lambda world: world.is_drained(client)):
                raise ConfigError(f"client {client!r} is not drained in group {settings.group}: nothing to resume")
            coordinator.write_everywhere(codec.Control(**coordinator.record_fields(), target=client, action="resume"))
            report(f"client {client} resumed: it claims again")
        elif topic is not None:
            if not coordinator.read(lambda world: world.topic_paused(topic, now_ms)):
                raise ConfigError(f"topic {topic!r} is not paused in group {settings.group}: nothing to resume")
            coordinator.write([codec.PauseTopic(**coordinator.record_fields(), topic=topic, expires=0)])
            report(f"topic {topic} resumed: its partitions are claimed again")
        else:
            if not coordinator.read(lambda world: world.is_paused(now_ms)):
                raise ConfigError(
                    f"group {settings.group} is not paused; to resume a drained client or a paused topic, "
                    "give --client or --topic"
                )
            coordinator.release_group(now_ms)
            report(f"group {settings.group} resumed")


def pause_topic(settings: Settings, topic: str, seconds: float | None, wait_s: float, report: Report = print) -> bool:
    """Pause one topic of the group (until ``admin resume --topic``, or for ``seconds``): owners release it."""
    if seconds is not None and time.time() * 1000 + seconds * 1000 > MAX_TIMESTAMP_MS:
        raise ConfigError(f"a pause of {seconds:g}s ends past what the protocol can write (int64 ms); use less")
    require_topic(admin_client(settings), settings, topic)
    with known_group(settings) as coordinator:
        expires = MAX_TIMESTAMP_MS if seconds is None else coordinator.now_ms() + int(seconds * 1000)
        coordinator.write([codec.PauseTopic(**coordinator.record_fields(), topic=topic, expires=expires)])
        until = "until `admin resume --topic`" if seconds is None else f"until {utc_iso(expires)}"
        report(f"topic {topic} paused {until}: its owners release it and nobody claims it")
        return _wait(coordinator, wait_s, report, lambda world, now: _holdings_of(world, now, topic=topic))


def release_partitions(
    settings: Settings, topic: str, partitions: Sequence[int], wait_s: float, report: Report = print
) -> bool:
    """Ask the owners of these partitions to hand them over (to another member, if there is one)."""
    count = require_topic(admin_client(settings), settings, topic)
    chosen = chosen_partitions(count, topic, partitions, ConfigError)
    with known_group(settings) as coordinator:
        now_ms = coordinator.now_ms()
        owners = coordinator.read(lambda world: {p: _live_owner(world, topic, p, now_ms) for p in chosen})
        ownerless = [p for p, owner in owners.items() if owner is None]
        if ownerless:
            raise ConfigError(
                f"{topic}{ownerless} has no live owner in group {settings.group}: nothing to release "
                "(see `marshal-workers status`)"
            )
        common = coordinator.record_fields()
        coordinator.write([codec.ReleasePartition(**common, topic=topic, partition=p) for p in chosen])
        for p, owner in owners.items():
            report(f"{topic}[{p}]: its owner {owner.client}/{owner.instance} is asked to hand it over")  # type: ignore[union-attr]

        def still_held(world: WorldState, now: int) -> list[str]:
            return [f"{topic}[{p}]" for p, owner in owners.items() if _live_owner(world, topic, p, now) == owner]

        return _wait(coordinator, wait_s, report, still_held)


def _require_client(coordinator: Coordinator, client: str) -> None:
    """Refuse an order about a client the group has never heard of: most likely a typo."""
    known = coordinator.read(_known_clients)
    if client not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"client {client!r} has no member in group {coordinator.group} (known clients: {listed})")


def _known_clients(world: WorldState) -> set[str]:
    known = set(world.clients.values()) | set(world.drained_clients())
    known.update(state.owner.client for state in world.partitions.values() if state.owner is not None)
    for shared in world.shared.values():
        known.update(lease.holder.client for lease in shared.leases.values())
    return known


def _live_owner(world: WorldState, topic: str, partition: int, now_ms: int) -> MemberId | None:
    state = world.get(topic, partition)
    if state is None or state.owner is None or now_ms - state.last_ts > 2 * world.heartbeat_ms:
        return None
    return state.owner


def _holdings_of(world: WorldState, now_ms: int, client: str | None = None, topic: str | None = None) -> list[str]:
    """What a client (or anyone, on a topic) still holds: live partitions and live range leases."""
    held = [
        f"{t}[{p}]"
        for owner, keys in world.holdings(now_ms).items()
        for t, p in keys
        if (client is None or owner.client == client) and (topic is None or t == topic)
    ]
    for (t, p), shared in world.shared.items():
        if topic is None or t == topic:
            held += [
                f"{t}[{p}]@{lease.start}..{lease.end - 1}"
                for lease in shared.live_leases(now_ms)
                if client is None or lease.holder.client == client
            ]
    return sorted(held)


def _wait(
    coordinator: Coordinator, wait_s: float, report: Report, held: Callable[[WorldState, int], list[str]]
) -> bool:
    """Follow the log until nothing is ``held`` (True) or ``wait_s`` passes (False; 0: do not wait)."""
    if wait_s <= 0:
        return True
    deadline = time.monotonic() + wait_s
    while True:
        now_ms = coordinator.now_ms()
        left = coordinator.read(lambda world: held(world, now_ms))  # noqa: B023 (called at once)
        if not left:
            report("done: nothing of it is held any more")
            return True
        if time.monotonic() >= deadline:
            report(f"still held after {wait_s:g}s: {', '.join(left)} (the order stands; see `marshal-workers status`)")
            return False
        time.sleep(0.2)


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

    From the latest checkpoint of each partition on (the checkpoint included; for a group with none there, the
    latest checkpoint of another group whose directory does not list it), or the whole log.
    Each record is folded as every member folds it, from the checkpoint's state: one the rules refused says why at
    its end.  UnknownGroupError once the log's end is reached (with ``follow``, the first time) if it holds nothing of
    the group, as the admin commands refuse it.
    """
    group = settings.require_group()
    # Its reader asks for the cluster's metadata itself: no admin client, and its leaders known before it lists.
    consumer = log_consumer(settings, group, "log command")
    try:
        count = topic_partition_count(consumer, settings, settings.coordination_topic)
        if count is None:
            raise unknown_group(settings)
        state = WorldState(group, settings.heartbeat_ms, count)
        # Read up to the ends listed now, never waiting for an empty fetch (a busy partition may never answer one,
        # and the embedded broker holds one for the whole wait); with ``follow``, tail from there with the short wait.
        catching_up = begin_catching_up(consumer, settings, count, group, from_beginning)
        ends = catching_up.ends
        for partition, start in enumerate(catching_up.starts):
            checkpoints.begin(state, start, partition)
        topic = settings.coordination_topic
        caught_up = False
        for searched in catching_up.read_ahead:  # read by the checkpoint search, already counted in the ends
            line = _record_line(state, searched)
            if line is not None:
                yield line
        while not stop():
            if not caught_up and ends.all_read():
                caught_up = True
                if not state.has_records():
                    raise unknown_group(settings)
                if not follow:
                    break
                consumer.begin_tail()
            message = consumer.poll(0.2)
            if message is None:
                continue
            source, offset = message.partition(), message.offset()
            if message.error() is not None:
                if source is not None:  # not an error of the whole client (the broker away)
                    partition_ended(ends, consumer, topic, source)
                continue
            assert source is not None and offset is not None  # a record, not an error event: it has both
            read_record(ends, consumer, topic, source, offset)
            line = _record_line(state, message)
            if line is not None:
                yield line
    finally:
        consumer.close()


def _record_line(state: WorldState, message: Message) -> str | None:
    """fold_record of a record read from the log (not an error event)."""
    source, offset = message.partition(), message.offset()
    assert source is not None and offset is not None  # a record: it has both
    kind, stamp = message.timestamp()
    log_append_time = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None
    return fold_record(state, message.value(), source, offset, log_append_time)


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
    if isinstance(record, codec.Control):
        return f"{where} {stamp} {kind} {who} {record.action} {record.target}"
    if isinstance(record, codec.PauseTopic):
        until = f"until={utc_iso(record.expires)}" if record.expires > record.ts else "(ends its pause)"
        return f"{where} {stamp} {kind} {who} {record.topic} {until}"
    if isinstance(record, codec.Checkpoint):
        return (
            f"{where} {stamp} {kind} {who} part {record.part + 1}/{record.parts} as_of={record.as_of} "
            f"positions={len(record.positions)}"
        )
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
    if isinstance(record, codec.MESSAGE_RECORD_TYPES):
        pending = f" pending={record.pending_ms}ms" if isinstance(record, codec.DeliverMessages) else ""
        messages = " ".join(f"[{m.partition}]{m.offset}" for m in record.messages)
        return f"{where} {stamp} {kind} {who} {record.topic}{pending} {messages}"
    detail = f" offset={record.offset}" if not isinstance(record, (codec.Claim, codec.ReleasePartition)) else ""
    return f"{where} {stamp} {kind} {who} {record.topic}[{record.partition}]{detail}"


def _range_text(entry: codec.RangeEntry) -> str:
    """``[partition]first..last``, with an ack's (or a progress entry's) failed, dead-lettered offsets and an ack's seen
    end."""
    text = f"[{entry.partition}]{entry.offset}..{entry.end - 1}"
    if isinstance(entry, (codec.AckEntry, codec.ProgressEntry)):
        text += "".join(
            f" {name}={','.join(map(str, found))}"
            for name, found in (("failed", entry.failed), ("dead", entry.dead))
            if found
        )
    if isinstance(entry, codec.AckEntry):
        text += f" high={entry.high}" if entry.high is not None else ""
    return text
