"""Wire format of the coordination topic, version 1 (docs/protocol.md).

One Kafka record per protocol message: the value is a JSON object, the key
``"{group}/{topic}/{partition}"`` is for people and tools only.

Records are decoded straight into typed, frozen structs by msgspec, which
checks every field (types, ``>= 0`` bounds, non-empty names, ``v == 1``, a
known ``type``) in C.  Everything read from the topic is untrusted: whatever
the bytes, :func:`decode` returns a record or raises :class:`DecodeError`,
nothing else.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Annotated, Any, Final, Literal

import msgspec

from marshal_workers.errors import DecodeError

VERSION: Final = 1

# Kafka offsets and timestamps are int64: a larger number is garbage, not a record.
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# Names are bounded so a hostile record cannot make every reader keep megabytes.
MAX_NAME_LENGTH: Final = 1024
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)]


class _Record(msgspec.Struct, frozen=True, gc=False, tag_field="type", kw_only=True):
    """Fields every record carries."""

    v: Literal[1]
    ts: NonNegative
    group: Name
    client: Name
    instance: Name

    def common_fields(self) -> dict[str, Any]:
        """The fields above, for the records a multi-partition record stands for."""
        return {"v": self.v, "ts": self.ts, "group": self.group, "client": self.client, "instance": self.instance}


class _PartitionRecord(_Record, frozen=True, gc=False, kw_only=True):
    topic: Name
    partition: NonNegative


class Claim(_PartitionRecord, frozen=True, gc=False, kw_only=True, tag="claim"):
    """A client asks to own a partition."""


class Heartbeat(_PartitionRecord, frozen=True, gc=False, kw_only=True, tag="heartbeat", omit_defaults=True):
    """The owner is alive; ``offset`` is the next offset it will process.

    ``lag`` (messages behind the partition's end) and ``rate`` (messages/s)
    are optional extras for ``status`` (section 2 allows extra fields).  They
    are typed loosely on purpose: another writer's malformed extra must not
    turn a valid heartbeat into garbage; the fold keeps them only if
    :func:`reported_number` accepts them.  (One limit: a number beyond the
    double range, such as 1e999, is not valid JSON to the decoder, so the
    whole record is skipped, as orjson would.)

    ``done`` (optional, same loose typing) lists the offsets done above
    ``offset`` when messages finish out of order (docs/concurrency.md), as
    :mod:`marshal_workers.protocol.done_set` runs; the fold keeps it only if
    ``done_set.parse`` accepts it.
    """

    offset: NonNegative
    lag: Any = None
    rate: Any = None
    done: Any = None
    in_flight: Any = None  # handler calls running (concurrency inside a worker), for ``status``
    window_used: Any = None  # offsets from the lowest unfinished message to the furthest fetched one
    call_age_s: Any = None  # seconds the oldest handler call in flight has been running, for ``status``


class Release(_PartitionRecord, frozen=True, gc=False, kw_only=True, tag="release", omit_defaults=True):
    """The owner gives the partition up; the next owner resumes at ``offset``.

    ``done``: the offsets done above ``offset``, as in :class:`Heartbeat`.
    """

    offset: NonNegative
    done: Any = None


class Beat(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One partition's entry in a :class:`Heartbeats` record: the fields of a :class:`Heartbeat` about it."""

    partition: NonNegative
    offset: NonNegative
    lag: Any = None
    rate: Any = None
    done: Any = None
    in_flight: Any = None
    window_used: Any = None
    call_age_s: Any = None


# A member heartbeats every partition of a topic it owns in one record; more than this many entries is
# not a member's heartbeat but a hostile record, skipped as garbage (it would make every reader work).
MAX_BEATS: Final = 65536


class Heartbeats(_Record, frozen=True, gc=False, kw_only=True, tag="heartbeats"):
    """Heartbeats of several partitions of one topic by one owner (docs/protocol.md).

    Folded exactly as one :class:`Heartbeat` per entry, in order, at the record's time: the
    coordination traffic of a member grows with its topics, not with its partitions.
    """

    topic: Name
    beats: Annotated[tuple[Beat, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]

    def heartbeats(self) -> list[Heartbeat]:
        """The entries as the single-partition heartbeats they stand for."""
        common = self.common_fields()
        return [
            Heartbeat(
                **common,
                topic=self.topic,
                partition=b.partition,
                offset=b.offset,
                lag=b.lag,
                rate=b.rate,
                done=b.done,
                in_flight=b.in_flight,
                window_used=b.window_used,
                call_age_s=b.call_age_s,
            )
            for b in self.beats
        ]


class Position(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One partition's state in a :class:`Checkpoint`: what the fold knows about it (world_view.PartitionState)."""

    topic: Name
    partition: NonNegative
    owner_client: Name | None = None
    owner_instance: Name | None = None
    last_ts: NonNegative = 0
    offset: NonNegative | None = None
    amo_offset: NonNegative | None = None
    done: Any = None
    lag: Any = None
    rate: Any = None
    in_flight: Any = None
    window_used: Any = None
    call_age_s: Any = None
    release_requested: bool = False


class PausePosition(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A group pause as a Checkpoint carries it (world_view.Pause)."""

    until: NonNegative
    client: Name


class LeasePosition(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A live range lease as a Checkpoint carries it (range_leases.Lease)."""

    offset: NonNegative
    end: NonNegative
    client: Name
    instance: Name
    expires: NonNegative
    claimed_at: NonNegative
    amo: bool = False
    # The Read / Ack / Cancel service's messages of the lease: (offset, pending deadline, hand-outs)
    # and the offsets clients acked.
    handed: Annotated[tuple[tuple[NonNegative, NonNegative, NonNegative], ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    acked: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    # The holder's progress inside the lease: the runs ``[start, end)`` it reported done, and of
    # those the offsets it dead-lettered.
    progress: Annotated[tuple[tuple[NonNegative, NonNegative], ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    dead: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()


class SharedPosition(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One shared partition's range bookkeeping in a :class:`Checkpoint` (range_leases.SharedPartition; 0.4.0)."""

    topic: Name
    partition: NonNegative
    low: NonNegative | None = None
    done: tuple[tuple[NonNegative, NonNegative], ...] = ()
    leases: tuple[LeasePosition, ...] = ()
    tries: tuple[tuple[NonNegative, NonNegative, NonNegative], ...] = ()
    acked: NonNegative = 0
    dead_letters: NonNegative = 0
    lost: NonNegative = 0
    lapsed: NonNegative = 0
    high: NonNegative = 0


MAX_POSITIONS: Final = 65536


class ControlPosition(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """The operators' orders a Checkpoint carries for its coordination partition (world_view.Controls; 0.5.0)."""

    drained: Annotated[tuple[tuple[Name, NonNegative], ...], msgspec.Meta(max_length=MAX_POSITIONS)] = ()
    shutdowns: Annotated[tuple[tuple[Name, NonNegative], ...], msgspec.Meta(max_length=MAX_POSITIONS)] = ()
    topic_pauses: Annotated[tuple[tuple[Name, NonNegative], ...], msgspec.Meta(max_length=MAX_POSITIONS)] = ()


# The most group names a checkpoint's directory holds.  A reader that has seen more groups on a
# coordination partition forgets that partition's directory and writes none: readers then start as before 0.7.0.
MAX_DIRECTORY: Final = 10_000


class Checkpoint(_Record, frozen=True, gc=False, kw_only=True, tag="checkpoint", omit_defaults=True):
    """The fold's state of one coordination partition, so a reader need not read the log before it.

    Release 0.2.0 (docs/protocol.md).  Written to coordination partition
    ``source``: part ``part`` of ``parts`` (a large state takes several
    records) of the state folded from every record of that partition before
    log offset ``as_of``.  A reader that starts here seeds its state from all
    the parts and folds the log from ``as_of``; a reader that has read the
    log before it learns nothing from it (its state already holds it all).
    """

    source: NonNegative
    as_of: NonNegative
    part: NonNegative = 0
    parts: Annotated[int, msgspec.Meta(ge=1, le=MAX_POSITIONS)] = 1
    positions: Annotated[tuple[Position, ...], msgspec.Meta(max_length=MAX_POSITIONS)] = ()
    pause: PausePosition | None = None
    shared: Annotated[tuple[SharedPosition, ...], msgspec.Meta(max_length=MAX_POSITIONS)] = ()
    controls: ControlPosition | None = None
    # Release 0.7.0: this part's share of the names of every group with a record on ``source`` before ``as_of``
    # (checkpoints.directory_of).  Typed loosely, as the extras of a heartbeat are: a malformed directory is
    # ignored by readers, it does not make the checkpoint garbage.
    directory: Any = None


class ClaimMessages(_PartitionRecord, frozen=True, gc=False, kw_only=True, tag="claim_messages"):
    """At-most-once: the owner claims every message before ``offset``."""

    offset: NonNegative


class MessageClaim(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One partition's entry in a :class:`MessageClaims` record: the fields of a :class:`ClaimMessages` about it."""

    partition: NonNegative
    offset: NonNegative


class MessageClaims(_Record, frozen=True, gc=False, kw_only=True, tag="message_claims"):
    """At-most-once claims of several partitions of one topic by one owner (docs/protocol.md).

    Folded exactly as one :class:`ClaimMessages` per entry, in order, at the record's time: a
    supervisor writes one record per topic for every claim its workers asked for at once.
    """

    topic: Name
    claims: Annotated[tuple[MessageClaim, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]

    def claim_messages(self) -> list[ClaimMessages]:
        """The entries as the single-partition claims they stand for."""
        common = self.common_fields()
        return [ClaimMessages(**common, topic=self.topic, partition=c.partition, offset=c.offset) for c in self.claims]


# A lease lasts at most a day: a longer pending timeout is a mistake, not a plan.
LeaseMs = Annotated[int, msgspec.Meta(ge=1, le=86_400_000)]


class RangeEntry(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The offsets ``[offset, end)`` of one partition, in a range record (docs/shared-partitions.md)."""

    partition: NonNegative
    offset: NonNegative
    end: NonNegative


class AckEntry(RangeEntry, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A lease settled: every offset of the range is done except ``failed`` ones (tried, to be tried again).

    ``dead``: the offsets written to the dead-letter topic (done, and counted).  Both strictly increasing.
    ``high``: the partition's end offset as the holder's fetches saw it: every member learns from it how far
    ranges may be claimed (ListOffsets may under-report the end; docs/brokers.md).
    """

    failed: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    dead: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    high: NonNegative | None = None  # the partition's end as the holder's fetches saw it (for the claimers)


class ProgressEntry(RangeEntry, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Progress inside a live lease: ``offset`` is the lease's first offset, and every offset of
    ``[offset, end)`` is done except ``failed`` ones; ``dead``: those of them written to the dead-letter topic.
    Both strictly increasing.  Cumulative: a later entry about the same lease never takes back what one before it
    marked done."""

    failed: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()
    dead: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=MAX_BEATS)] = ()


RangeEntries = Annotated[tuple[RangeEntry, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]


class ClaimRanges(_Record, frozen=True, gc=False, kw_only=True, tag="claim_ranges", omit_defaults=True):
    """Range claims of a shared topic's partitions (docs/shared-partitions.md).

    Each accepted entry is a lease for ``lease_ms`` from the record's time.  ``amo``: the writer handles the
    offsets at most once, so a lapse makes them lost rather than claimable again.
    """

    topic: Name
    lease_ms: LeaseMs
    amo: bool = False
    ranges: RangeEntries


class RenewRanges(_Record, frozen=True, gc=False, kw_only=True, tag="renew_ranges"):
    """The holder extends its leases on these exact ranges to ``lease_ms`` from the record's time (0.4.0)."""

    topic: Name
    lease_ms: LeaseMs
    ranges: RangeEntries


class AckRanges(_Record, frozen=True, gc=False, kw_only=True, tag="ack_ranges"):
    """The holder settles its leases on these exact ranges (0.4.0): see :class:`AckEntry`."""

    topic: Name
    ranges: Annotated[tuple[AckEntry, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]


class CancelRanges(_Record, frozen=True, gc=False, kw_only=True, tag="cancel_ranges"):
    """The holder gives its leases on these exact ranges back untried: claimable again at once (0.4.0)."""

    topic: Name
    ranges: RangeEntries


class ProgressRanges(_Record, frozen=True, gc=False, kw_only=True, tag="progress_ranges"):
    """The holder's progress inside its live leases: see :class:`ProgressEntry`.  What it marks done
    is done when the lease ends, however it ends (ack, cancel, lapse), so a lapse or a crash gives back only the
    offsets not done."""

    topic: Name
    ranges: Annotated[tuple[ProgressEntry, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]


class MessageEntry(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One message of a shared topic: ``[partition, offset]``."""

    partition: NonNegative
    offset: NonNegative


MessageEntries = Annotated[tuple[MessageEntry, ...], msgspec.Meta(min_length=1, max_length=MAX_BEATS)]


# The Read / Ack / Cancel service (docs/http-service.md).  A server hands the messages of its range
# leases to HTTP clients one by one and writes each hand-out before the client sees it, so a client's ack or cancel
# may reach any server of the group: every server judges it by the same fold.


class DeliverMessages(_Record, frozen=True, gc=False, kw_only=True, tag="deliver_messages"):
    """The holder of the messages' leases hands them to a client until ``pending_ms`` after the record's time."""

    topic: Name
    pending_ms: LeaseMs
    messages: MessageEntries


class AckMessages(_Record, frozen=True, gc=False, kw_only=True, tag="ack_messages"):
    """A client acked these pending messages (written by whichever server the client asked)."""

    topic: Name
    messages: MessageEntries


class CancelMessages(_Record, frozen=True, gc=False, kw_only=True, tag="cancel_messages"):
    """A client gave these pending messages back: their holder may hand them out again at once."""

    topic: Name
    messages: MessageEntries


RANGE_RECORD_TYPES: Final = (ClaimRanges, RenewRanges, AckRanges, CancelRanges, ProgressRanges)
MESSAGE_RECORD_TYPES: Final = (DeliverMessages, AckMessages, CancelMessages)


class ReleaseGroup(_Record, frozen=True, gc=False, kw_only=True, tag="release_group"):
    """An operator pauses the whole group until ``expires`` (ms since epoch)."""

    expires: NonNegative


# Remote control: an operator's orders, written by ``marshal-workers admin`` and obeyed by every
# member of the group.  They are folded like the rest, so ``status``, ``log`` and the audit see them too.

ControlAction = Literal["drain", "resume", "shutdown"]


class Control(_Record, frozen=True, gc=False, kw_only=True, tag="control"):
    """An order to every supervisor of client ``target``, written to every coordination partition.

    ``drain``: release everything and claim nothing (whole partitions or ranges) until a ``resume``.
    ``shutdown``: stop as on SIGTERM (a supervisor started after the order is not affected).
    """

    target: Name
    action: ControlAction


class PauseTopic(_Record, frozen=True, gc=False, kw_only=True, tag="pause_topic"):
    """No claim of ``topic``'s partitions or ranges until ``expires`` (ms since epoch).

    Owners keep what they hold until they release it, which they do on reading this; a later record about
    the topic replaces it (``expires`` 0 ends a pause).
    """

    topic: Name
    expires: NonNegative


class ReleasePartition(_PartitionRecord, frozen=True, gc=False, kw_only=True, tag="release_partition"):
    """The partition's current owner is asked to release it: it hands it over cleanly."""


Record = (
    Claim
    | Heartbeat
    | Heartbeats
    | Release
    | ClaimMessages
    | MessageClaims
    | ReleaseGroup
    | Checkpoint
    | ClaimRanges
    | RenewRanges
    | AckRanges
    | CancelRanges
    | Control
    | PauseTopic
    | ReleasePartition
    | DeliverMessages
    | AckMessages
    | CancelMessages
    | ProgressRanges
)
PartitionRecord = Claim | Heartbeat | Release | ClaimMessages
RECORD_TYPES: Final = (
    Claim,
    Heartbeat,
    Heartbeats,
    Release,
    ClaimMessages,
    MessageClaims,
    ReleaseGroup,
    Checkpoint,
    ClaimRanges,
    RenewRanges,
    AckRanges,
    CancelRanges,
    Control,
    PauseTopic,
    ReleasePartition,
    DeliverMessages,
    AckMessages,
    CancelMessages,
    ProgressRanges,
)
# Records about no topic: written to every coordination partition, so they are ordered against every topic's claims.
GROUP_RECORD_TYPES: Final = (ReleaseGroup, Control)

_decoder = msgspec.json.Decoder(Record)
_encoder = msgspec.json.Encoder()


def encode(record: Record) -> bytes:
    """The record's Kafka value: a compact JSON object.

    Raises ValueError for a record that readers would skip as invalid (structs
    are not checked when built, e.g. an expiry beyond int64): never write one.
    """
    value = _encoder.encode(record)
    try:
        _decoder.decode(value)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not a valid coordination record, readers would skip it: {exc}") from None
    return value


def decode(value: bytes | None) -> Record:
    """Parse and validate one Kafka value; raise DecodeError if it is not a valid record."""
    if value is None:
        raise DecodeError("record has no value (a tombstone)")
    try:
        return _decoder.decode(value)
    except msgspec.MsgspecError as exc:
        raise DecodeError(str(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:  # defensive: msgspec documents only MsgspecError
        raise DecodeError(f"{type(exc).__name__}: {exc}") from None


class _Named(msgspec.Struct, frozen=True, gc=False):
    """The one field of any record, valid or not, that says whose it is."""

    group: Name


_named_decoder = msgspec.json.Decoder(_Named)


def group_named(value: bytes | None) -> str | None:
    """The ``group`` a value names if it is a JSON object with a valid group name, whatever else it holds or lacks.

    For values that are not valid records (checkpoints.py): a record of a newer release, unknown to this one, is
    still a record of its group for the checkpoints' directory.
    """
    if value is None:
        return None
    try:
        return _named_decoder.decode(value).group
    except (msgspec.MsgspecError, ValueError, TypeError, RecursionError):
        return None


def expand(record: Record) -> list[Record]:
    """The record as the single-partition records it stands for (Heartbeats, MessageClaims: their entries)."""
    if isinstance(record, Heartbeats):
        return record.heartbeats()  # type: ignore[return-value]
    if isinstance(record, MessageClaims):
        return record.claim_messages()  # type: ignore[return-value]
    return [record]


def reported_number(value: Any) -> int | float | None:
    """An optional extra (``lag``, ``rate``) if it is a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if math.isnan(value) or value < 0 or value > 2**63 - 1:  # NaN cannot come from JSON, but a struct can hold it
        return None
    return value


def record_key(record: Record) -> bytes:
    """The Kafka key: ``group/topic/partition``, ``group/topic`` for records about several partitions (heartbeats,
    message_claims, range records), the group for release_group."""
    if isinstance(record, ReleaseGroup):
        return record.group.encode()
    if isinstance(record, Control):
        return f"{record.group}/client/{record.target}".encode()
    if isinstance(record, Checkpoint):
        return f"{record.group}/checkpoint/{record.source}".encode()
    if isinstance(record, (Heartbeats, MessageClaims, PauseTopic, *RANGE_RECORD_TYPES, *MESSAGE_RECORD_TYPES)):
        return f"{record.group}/{record.topic}".encode()
    return f"{record.group}/{record.topic}/{record.partition}".encode()


@lru_cache(maxsize=65536)
def coordination_partition(topic: str, partition_count: int) -> int:
    """The coordination partition that carries every record about ``topic``.

    The Go Marshal rule: the first 8 bytes of md5(topic), little-endian,
    modulo the coordination topic's partition count.  One topic, one log:
    every claim about it is totally ordered.
    """
    if partition_count < 1:
        raise ValueError(f"partition_count must be >= 1, got {partition_count}")
    digest = hashlib.md5(topic.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "little") % partition_count
