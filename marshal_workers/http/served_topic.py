"""One topic served over HTTP (``marshal-workers serve``, docs/http-service.md): leases, messages, hand-outs.

The server takes part in the topic as a shared-partition member (section
11): it leases ranges of offsets in the coordination log, reads their
messages from Kafka and hands them to HTTP clients one by one.  Everything a
client does is written to the log before the client hears back:

* a read writes ``deliver_messages`` (the messages are pending until their
  deadline), and only the messages the fold accepted are answered;
* an ack writes ``ack_messages`` and a cancel ``cancel_messages``, from
  whichever server the client asked: every server judges them by the same
  fold, so an ack may reach any server of the group;
* a range whose every message is acked (or dead-lettered after
  ``max_deliveries``) is settled with ``ack_ranges``; on SIGTERM, ranges no
  client holds a message of are given back at once (``cancel_ranges``).

A server killed with -9 leaves its leases to lapse: what clients acked is
done, the rest is delivered again by whoever leases it next.

Threads: a background loop (:meth:`ServedTopic.run_loop`) claims, reads
Kafka, renews and settles; HTTP requests call :meth:`hand_out`,
:meth:`settlement` and the rest from the server's event loop, which also
runs the group commit of their records (group_commit.py).  A lock guards the
local mirror of the held ranges; the fold is the judge of every verdict.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.core.logs import group_log
from marshal_workers.errors import CoordinationWriteError, MaxDeliveriesExceeded, UnknownTopicError
from marshal_workers.http.group_commit import GroupCommit, Kind, WriteStats
from marshal_workers.http.http_messages import BadRequest, MessageId, message_json
from marshal_workers.http.read_ahead import ReadAhead
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.coordinator import Coordinator
from marshal_workers.kafka.dead_letters import DeadLetterWriter, letter_headers
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import admin_client
from marshal_workers.kafka.metadata_refresh import MetadataRefresh
from marshal_workers.kafka.offsets import OffsetStore, PartitionEnds
from marshal_workers.protocol import codec
from marshal_workers.protocol.dead_letter_groups import OtherGroups
from marshal_workers.protocol.orders import orders_for
from marshal_workers.protocol.partition_end import partition_end
from marshal_workers.protocol.range_leases import Holder, SharedPartition
from marshal_workers.protocol.range_member import RangeMember, cancel_entry, given_back_entry, handled_entry
from marshal_workers.protocol.world_state import WorldState, per_entry
from marshal_workers.protocol.world_view import Owner
from marshal_workers.runtime.channel import monotonic_ms

_log = logging.getLogger(__name__)

LOOP_PAUSE_S = 0.01
# The loop mirrors what others did to our ranges only when the log folded another instance's record since the last
# look (our own records we apply as we write them), and at least this often whatever it folded (an ack whose request
# gave up waiting for its verdict is applied locally by nobody else).
FULL_SYNC_S = 0.5
ORDERS_INTERVAL_S = 0.25  # how often the operators' orders are looked at
FETCH_MOST = 500
LOG_LAG_GRACE_S = 1.0  # how long an ack of a message our log view has not seen handed out waits for the log
IDLE_GIVE_BACK_MS = 2000  # a held range no reader wanted for this long goes back to the group
# Readers that read this recently count as readers still: the loop leases the next ranges before the held ones run
# dry (a read answered at once waits for nothing, so counting only the reads that wait claimed every range after its
# readers found nothing: each range's first reads waited a loop pass, a claim and a fetch, 10 to 30 ms).
READERS_RECENT_S = 1.0
# Messages at hand for this long at the readers' recent rate: the next ranges are leased when fewer wait (a loop pass,
# a claim's write and a fetch of the range take 10 to 30 ms; at 64 clients half a range lasted 10).
LEASE_AHEAD_S = 0.05
HAND_OUT_WINDOW_S = 0.25  # the readers' rate is measured over windows this long
_NEVER = 2**62
MAX_HELD = 64  # ranges held at once, whatever is pending in them (bounds what a server keeps)
# Messages cancelled through this server and not handed out since, remembered (the latest ones, at most this many)
# only to tell a client that cancels one again that it was cancelled: the log has the cancel as a deadline passed.
MAX_CANCELLED_KEPT = 100_000


@dataclass(frozen=True)
class ServeOptions:
    topic: str
    pending_timeout: float = 30.0  # seconds a read message stays pending
    max_deliveries: int = 5  # hand-outs before a message is dead-lettered instead
    range_size: int = 100
    max_leases: int = 4  # ranges with messages still to hand out, held at once
    dlq_topic: str = ""  # default: "<topic>.dlq"

    @property
    def pending_ms(self) -> int:
        return round(self.pending_timeout * 1000)

    @property
    def dead_letter_topic(self) -> str:
        return self.dlq_topic or f"{self.topic}.dlq"


@dataclass
class HandOutRate:
    """Messages handed out per second in the last full window of HAND_OUT_WINDOW_S: ``count`` is raised as they go
    (under the ServedTopic's lock), ``per_second`` asked by the serve loop."""

    count: int = 0
    _since: float | None = None  # monotonic: the start of the current window
    _counted: int = 0  # ``count`` at that start
    _rate: float = 0.0

    def per_second(self, now: float) -> float:
        if self._since is None:
            self._since, self._counted = now, self.count
        elif now - self._since >= HAND_OUT_WINDOW_S:
            self._rate = (self.count - self._counted) / (now - self._since)
            self._since, self._counted = now, self.count
        return self._rate


@dataclass
class HeldRange:
    """A range whose lease we hold, and what we know of its messages."""

    partition: int
    start: int
    end: int
    tries: int  # deliveries of its offsets before this lease
    deadline_ms: int  # monotonic: past it the lease may have lapsed, so nothing more is handed out
    fetched_to: int  # the next offset to read from Kafka
    messages: dict[int, Any] = field(default_factory=dict)  # offset -> Kafka message, until acked or dead
    pending_until: dict[int, int] = field(default_factory=dict)  # offset -> monotonic ms: handed out until then
    handed: dict[int, int] = field(default_factory=dict)  # offset -> hand-outs in this lease (the fold's)
    acked: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    reserved: set[int] = field(default_factory=set)  # being handed out: a deliver_messages write for them is in flight
    unwritten: set[int] = field(default_factory=set)  # answered to a client; their deliver_messages not confirmed yet
    settling: bool = False
    last_used: int = field(default_factory=monotonic_ms)  # claimed, or a message handed out: monotonic ms
    # Where the next pick looks from: no message below it could be handed out at the last look (each was acked, dead,
    # reserved, pending or out of deliveries), so a read does not step over every pending message again. Lowered
    # when one of them may go out again (free_again); back to the start once a pending deadline below it passes.
    scan_from: int = -1
    rescan_at: int = _NEVER  # monotonic ms: the earliest pending deadline among the offsets below scan_from

    def __post_init__(self) -> None:
        if self.scan_from < 0:
            self.scan_from = self.start

    def fetched(self) -> bool:
        return self.fetched_to >= self.end

    def eligible(self, offset: int, now: int) -> bool:
        return (
            offset not in self.acked
            and offset not in self.dead
            and offset not in self.reserved
            and self.pending_until.get(offset, 0) <= now
        )

    def pick(self, most: int, now: int, max_deliveries: int) -> list[int]:
        """Up to ``most`` offsets that may be handed out now, in offset order, reserved."""
        if now >= self.rescan_at:  # a message handed out may be handed out again: look from the start
            self.scan_from, self.rescan_at = self.start, _NEVER
        picked: list[int] = []
        messages, pending_until, handed = self.messages, self.pending_until, self.handed
        offset = self.scan_from
        while offset < self.fetched_to and len(picked) < most:
            if offset in messages:
                if self.eligible(offset, now):
                    if self.tries + handed.get(offset, 0) < max_deliveries:
                        self.reserved.add(offset)
                        picked.append(offset)
                elif (until := pending_until.get(offset, 0)) > now:
                    self.rescan_at = min(self.rescan_at, until)  # out with a client: may go out again then
            offset += 1
        self.scan_from = offset
        return picked

    def handed_until(self, offset: int, until: int) -> None:
        """A reserved message is out with a client until ``until`` (monotonic ms)."""
        self.reserved.discard(offset)
        self.pending_until[offset] = until
        if offset < self.scan_from:
            self.rescan_at = min(self.rescan_at, until)

    def free_again(self, offset: int) -> None:
        """``offset`` may be handed out again (cancelled, or its hand-out refused): the next pick looks from it."""
        self.scan_from = min(self.scan_from, offset)

    def complete(self) -> bool:
        """Every message read, and each acked or dead-lettered (offsets without a message need nothing)."""
        return self.fetched() and all(o in self.acked or o in self.dead for o in self.messages)

    def holds_a_client_message(self, now: int) -> bool:
        return (any(until > now and o not in self.acked for o, until in self.pending_until.items())
                or bool(self.reserved) or bool(self.unwritten))  # fmt: skip


@dataclass(frozen=True)
class Settlement:
    """An ack or cancel that passed the checks: the messages to write (pending ones) and those done already."""

    kind: Kind
    verb: str  # "acked" or "cancelled": the answer's key
    todo: list[MessageId]
    already: int


@dataclass
class ServeCounters:
    delivered: int = 0
    acked: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    refused: int = 0  # verdicts the fold refused after our checks passed (a race with a deadline or a lease)
    other_group: int = 0  # messages redriven for another group: never handed out, done
    ranges_claimed: int = 0
    ranges_refused: int = 0
    ranges_acked: int = 0
    ranges_cancelled: int = 0
    ranges_lost: int = 0  # our lease ran out before we settled it (it lapses in the log)


class ServedTopic:
    def __init__(self, settings: Settings, options: ServeOptions) -> None:
        self.settings = settings
        self.options = options
        self.topic = options.topic
        self.log = group_log(_log, settings.require_group())
        self.counters = ServeCounters()
        self.ranges: dict[tuple[int, int], HeldRange] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.partition_count = 0
        self.waiting_readers = 0  # long polls waiting for a message: the loop leases more when they wait
        self.last_read = -READERS_RECENT_S  # monotonic: the latest read (the loop leases ahead for recent readers)
        self._hand_outs = HandOutRate()  # messages handed out per second, lately (how far ahead to lease)
        self.available_now = 0  # messages that could be handed out, as of the loop's last pass with readers waiting
        self.on_news: Callable[[], None] | None = None  # called (from the loop's thread) when messages wait for readers
        self.on_shutdown_order: Callable[[], object] | None = None  # called (from the loop's thread) at admin shutdown
        self.held_back = False  # an operator drained this client or paused the topic: no claims
        self.started_ms = int(time.time() * 1000)  # an admin shutdown ordered before is old news
        self._next_orders = 0.0
        self.last_loop = time.monotonic()  # for /healthz: the loop is alive
        self._coordinator: Coordinator | None = None
        self._offsets: OffsetStore | None = None
        self._consumer: GuardedConsumer | None = None
        self._dlq = DeadLetterWriter(settings)
        self._other_groups = OtherGroups(settings.require_group())  # messages redriven for another group
        self._positions: dict[int, int] = {}  # partition -> the next offset the consumer reads there
        self._ends = PartitionEnds()  # as ListOffsets says, asked without blocking
        self._fetched_high: dict[int, int] = {}  # partition -> its end as fetches saw it
        self._ahead = ReadAhead()  # messages read past the held ranges, for the next ones claimed (read_ahead.py)
        self._initial: dict[int, int] = {}
        self._next_renewal = 0.0
        self._synced_foreign = -1  # coordinator.foreign_records at the last _sync_from_log
        self._next_full_sync = 0.0
        self._rng = random.Random()
        self._stop_loop = threading.Event()
        self._thread: threading.Thread | None = None
        self._holder: Holder | None = None
        self._group_commit: GroupCommit | None = None
        self._metadata: MetadataRefresh | None = None  # the topic's partition count, followed (_follow_partitions)
        self._cancelled_here: collections.OrderedDict[MessageId, None] = collections.OrderedDict()  # under the lock
        # Our lease decisions, the shared pool's: leases as long as the pending timeout; at a partition read to its
        # end, a whole range (its fetches hand the messages out as they come).
        self.member = RangeMember(self.topic, options.pending_ms, probe_size=options.range_size)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ServedTopic:
        self._consumer = GuardedConsumer(
            client_profiles.served_topic_consumer(self.settings),
            f"serve {self.settings.require_group()} {self.topic}",
            self.settings.heartbeat_interval,
        )
        self._consumer.read_without_gaps_if_the_broker_skips(self.settings.connect_timeout)
        metadata = self._consumer.list_topics(self.topic, timeout=self.settings.connect_timeout)
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            self._consumer.close()
            raise UnknownTopicError(f"topic {self.topic!r} does not exist on {self.settings.brokers}: create it first")
        self.partition_count = len(found.partitions)
        self._metadata = MetadataRefresh(admin_client(self.settings), self.settings, self.log)
        self._coordinator = Coordinator(self.settings).start()
        self._holder = Holder(self._coordinator.client, self._coordinator.instance)
        self._offsets = OffsetStore(self.settings)
        self._thread = threading.Thread(target=self.run_loop, name="serve-loop", daemon=True)
        self._thread.start()
        return self

    def begin_stop(self) -> None:
        """SIGTERM: hand nothing more out; give back every range no client holds a message of (at once), the
        rest once their messages are acked or their deadlines pass (the loop does it)."""
        self.stopping = True

    def stopped(self) -> bool:
        with self.lock:
            return not self.ranges

    def close(self) -> None:
        self._stop_loop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._dlq.close()
        if self._metadata is not None:
            self._metadata.close()
        if self._consumer is not None:
            self._consumer.close()
        if self._coordinator is not None:
            self._coordinator.close()

    def abandon(self) -> None:
        """Past the shutdown timeout: what is still held is left to lapse (delivered again, at least once)."""
        with self.lock:
            self.counters.ranges_lost += len(self.ranges)
            self.ranges.clear()

    def open_writes(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the group commit of the requests' records on the event loop that serves them (after start())."""
        self._group_commit = GroupCommit(self.coordinator, self.coordinator.record_fields, self.topic,
                                         self.options.pending_ms, loop)  # fmt: skip

    async def close_writes(self) -> None:
        """Write what the group commit has queued and wait for its verdicts (on the loop, before it ends)."""
        if self._group_commit is not None:
            await self._group_commit.close()

    @property
    def _commit(self) -> GroupCommit:
        assert self._group_commit is not None, "call open_writes() first"
        return self._group_commit

    def write_stats(self) -> WriteStats:
        """The group commit's writes (for /metrics)."""
        return self._commit.snapshot() if self._group_commit is not None else WriteStats()

    @property
    def coordinator(self) -> Coordinator:
        assert self._coordinator is not None, "call start() first"
        return self._coordinator

    # ----------------------------------------------------------- HTTP calls

    def available(self) -> int:
        """Messages that could be handed out now (a cheap check before a read)."""
        if self.stopping:
            return 0
        now = monotonic_ms()
        with self.lock:
            return sum(
                1 for held in self.ranges.values() if held.deadline_ms > now
                for offset in held.messages if held.eligible(offset, now)
            )  # fmt: skip

    def hand_out(self, most: int) -> list[dict[str, Any]] | asyncio.Future[list[dict[str, Any]]]:
        """Hand out up to ``most`` messages, pending from now until their deadline: the answer to a read, now, or
        a future of it done when a write's verdict comes (no wait either way; on the event loop).

        A message handed out for the first time under our lease is answered at once: the lease makes it ours
        alone, and its ``deliver_messages`` goes in the next group commit, long before the lease could pass to
        anyone else (``usable`` leaves a third of the pending timeout).  A message handed out again under the same
        lease (cancelled, or its deadline passed) waits for its record's verdict: the log may still have it
        pending with the client before (docs/http-service.md, "Reads without a wait")."""
        picked = [] if self.stopping else self._pick(most, monotonic_ms())
        if not picked:
            return []
        entries = [codec.MessageEntry(held.partition, offset) for held, offset, _ in picked]
        now, wall = monotonic_ms(), self.coordinator.now_ms()
        if all(first for _, _, first in picked):
            with self.lock:
                answer = [self._handed_out(held, offset, now, wall) for held, offset, _ in picked]
                for held, offset, _ in picked:
                    held.unwritten.add(offset)
            self._write_hand_outs([(held, offset) for held, offset, _ in picked], entries)
            return answer
        written = self._commit.submit(Kind.DELIVER, entries)
        answered: asyncio.Future[list[dict[str, Any]]] = written.get_loop().create_future()
        written.add_done_callback(lambda done: answered.set_result(self._answer_written(picked, done, now, wall)))
        return answered

    def _answer_written(self, picked: list[tuple[HeldRange, int, bool]], written: asyncio.Future[list[bool]], since_ms: int,
                        since_wall: int) -> list[dict[str, Any]]:  # fmt: skip
        """The messages the log accepted as handed out (a write not confirmed: none; the read goes on waiting)."""
        verdicts = written.result() if written.exception() is None else [False] * len(picked)
        answer = []
        with self.lock:
            for (held, offset, _), accepted in zip(picked, verdicts):
                if accepted:
                    answer.append(self._handed_out(held, offset, since_ms, since_wall))
                else:
                    held.reserved.discard(offset)
                    held.free_again(offset)
                    self.counters.refused += 1
        return answer

    def _pick(self, most: int, now: int) -> list[tuple[HeldRange, int, bool]]:
        """Up to ``most`` messages to hand out, reserved: (range, offset, never handed out under this lease)."""
        picked: list[tuple[HeldRange, int, bool]] = []
        with self.lock:
            for held in sorted(self.ranges.values(), key=lambda r: (r.partition, r.start)):
                if len(picked) >= most:
                    break
                if not self.member.usable(held, now, promise_ms=self.options.pending_ms // 3):
                    continue  # its lease may not outlive what we would promise
                for offset in held.pick(most - len(picked), now, self.options.max_deliveries):
                    picked.append((held, offset, offset not in held.handed))
        return picked

    def _handed_out(self, held: HeldRange, offset: int, since_ms: int, since_wall: int) -> dict[str, Any]:
        """A reserved message is out with a client from ``since_ms`` (monotonic; ``since_wall`` the wall clock's ms)
        until the pending timeout: its answer.  Under the lock."""
        held.handed_until(offset, since_ms + self.options.pending_ms)
        held.handed[offset] = held.handed.get(offset, 0) + 1
        if self._cancelled_here:
            self._cancelled_here.pop(MessageId(self.topic, held.partition, offset), None)
        held.last_used = since_ms
        self.counters.delivered += 1
        self._hand_outs.count += 1
        message = held.messages[offset]
        kind, stamp = message.timestamp()
        return message_json(
            self.topic, held.partition, offset, message.key(), message.value(), message.headers() or [],
            stamp if kind != 0 else None, since_wall + self.options.pending_ms, held.tries + held.handed[offset],
        )  # fmt: skip

    def _write_hand_outs(self, picked: list[tuple[HeldRange, int]], entries: list[codec.MessageEntry]) -> None:
        """Queue the hand-outs answered already; their verdicts come back on the event loop."""
        self._commit.submit(Kind.DELIVER, entries, linger=True).add_done_callback(
            lambda done: self._hand_outs_written(picked, done)
        )

    def _hand_outs_written(self, picked: list[tuple[HeldRange, int]], done: asyncio.Future[list[bool]]) -> None:
        """Hand-outs answered before their record: confirmed, refused (our lease had lapsed in the log: another
        member may hand them out; at least once allows it), or not written (tried again while the lease lasts)."""
        error = done.exception()
        now = monotonic_ms()
        again: list[tuple[HeldRange, int]] = []
        with self.lock:
            verdicts = done.result() if error is None else [None] * len(picked)
            for (held, offset), accepted in zip(picked, verdicts):
                if accepted is None and self.member.usable(held, now) and self.ranges.get((held.partition, held.start)) is held:
                    again.append((held, offset))
                    continue
                held.unwritten.discard(offset)
                if accepted is False:
                    self.counters.refused += 1
        refused = [(h.partition, o) for (h, o), ok in zip(picked, verdicts) if ok is False]
        if refused:
            self.log.warning("%s: hand-outs %s refused by the log (the lease had lapsed): they may be handed to "
                             "another client", self.topic, refused)  # fmt: skip
        if error is not None:
            self.log.warning("%s: hand-outs of %d messages not confirmed (%s): %s", self.topic, len(picked), error,
                             "writing them again" if again else "their lease ran out: they are delivered again")
        if again:
            self._write_hand_outs(again, [codec.MessageEntry(h.partition, o) for h, o in again])

    # An ack or a cancel, in steps the HTTP handler awaits between (nothing here blocks): the messages' states
    # (waiting, up to LOG_LAG_GRACE_S, while some are not yet in our view of the log), the checks, the write
    # (group commit), the answer.

    def message_states(self, ids: Sequence[MessageId]) -> list[str]:
        """Each message's state (see _message_state); BadRequest 404 for a message not of the served topic."""
        for found in ids:
            if found.topic != self.topic:
                raise BadRequest(404, "unknown_topic", f"this server serves {self.topic!r}, not {found.topic!r}")
            if found.partition >= self.partition_count:
                raise BadRequest(404, "unknown_partition", f"{self.topic} has partitions 0 to "
                                 f"{self.partition_count - 1}, not {found.partition}")  # fmt: skip
        states = self._states(ids)
        with self.lock:  # the log has a cancel as the pending deadline passed: say which it was where we know
            return ["cancelled" if state == "expired" and found in self._cancelled_here else state
                    for found, state in zip(ids, states)]  # fmt: skip

    @staticmethod
    def log_may_lag(states: Sequence[str]) -> bool:
        """Another server handed a message out and wrote so before its client heard of it, but our view of the log
        may lag by a fetch or two: worth waiting (up to LOG_LAG_GRACE_S) before calling a message never handed out
        (or, handed out again, expired; or, cancelled through us, handed out again by its holder since)."""
        return any(state in ("unknown", "undelivered", "expired", "cancelled") for state in states)

    def settlement(self, ids: Sequence[MessageId], states: Sequence[str], kind: Kind) -> Settlement:
        """What an ack (``kind`` ACK) or cancel (CANCEL) of ``ids`` writes; BadRequest 409 if any of them cannot be
        settled (then nothing is)."""
        verb = "acked" if kind is Kind.ACK else "cancelled"
        already = [m for m, state in zip(ids, states) if state == "done" or (state == "acked" and kind is Kind.ACK)]
        bad = [(m, state) for m, state in zip(ids, states) if state not in ("pending", "done", "acked")]
        bad += [(m, state) for m, state in zip(ids, states) if state in ("done", "acked") and kind is Kind.CANCEL]
        if bad:
            raise BadRequest(409, "not_pending", f"{len(bad)} of the messages cannot be {verb}: nothing was {verb}",
                             messages=[_problem(m, state) for m, state in bad])  # fmt: skip
        return Settlement(kind, verb, [m for m, state in zip(ids, states) if state == "pending"], len(already))

    def write_settlement(self, settlement: Settlement) -> asyncio.Future[list[bool]]:
        """The settlement's record, in the next group commit: its verdicts (CoordinationWriteError if not
        confirmed in time)."""
        entries = [codec.MessageEntry(m.partition, m.offset) for m in settlement.todo]
        return self._commit.submit(settlement.kind, entries)

    def settled(self, settlement: Settlement, verdicts: Sequence[bool]) -> dict[str, Any]:
        """The answer (200's body) once the log judged the settlement; BadRequest 409 if it refused some."""
        todo, verb = settlement.todo, settlement.verb
        refused = [m for m, ok in zip(todo, verdicts) if not ok]
        self._apply_locally(todo, verdicts, verb)
        late: set[MessageId] = set()  # refused by the log because another server's ack of them came first
        if refused and verb == "acked":
            # Acked meanwhile through another server (our view had not seen it): done, as the client wants.
            late = {m for m, state in zip(refused, self._log_states(refused)) if state in ("acked", "done")}
            refused = [m for m in refused if m not in late]
        if refused:
            self.counters.refused += len(refused)
            raise BadRequest(409, "partly_refused", f"{len(refused)} of the messages were no longer pending when the "
                             f"log got the request (their deadline or lease ended): the others were {verb}",
                             messages=[_problem(m, "expired") for m in refused])  # fmt: skip
        return {verb: len(todo) - len(late), "already": settlement.already + len(late)}

    def _states(self, ids: Sequence[MessageId]) -> list[str]:
        """Each message's state as the fold has it now; one we answered a read with and whose hand-out is queued
        (or in flight) in our group commit counts as pending: an ack or cancel of it is written after it.

        Messages this server handed out under a lease it holds, whose pending time it still counts, are pending
        without a look at the log (the usual ack: no wait for the log's lock).  The log still judges the record:
        one acked or cancelled meanwhile through another server is refused there, and answered as such."""
        if self._pending_here(ids, monotonic_ms()):
            return ["pending"] * len(ids)
        return self._log_states(ids)

    def _log_states(self, ids: Sequence[MessageId]) -> list[str]:
        """_states as the log has it (our hand-outs not written yet count as pending)."""
        wall = self.coordinator.now_ms()
        states = self.coordinator.read(lambda world: [_message_state(world, m, wall) for m in ids])
        if "undelivered" in states:
            with self.lock:
                for i, (found, state) in enumerate(zip(ids, states)):
                    held = self._held_covering(found.partition, found.offset) if state == "undelivered" else None
                    if held is not None and found.offset in held.unwritten:
                        states[i] = "pending"
        return states

    def _pending_here(self, ids: Sequence[MessageId], now: int) -> bool:
        """Every message is out with a client from this server, under a lease it holds, until after ``now``: our
        own pending time ends before the log's (it starts before the hand-out's record is written)."""
        with self.lock:
            for found in ids:
                held = self._held_covering(found.partition, found.offset)
                if (held is None or held.deadline_ms <= now or found.offset in held.acked
                        or held.pending_until.get(found.offset, 0) <= now):  # fmt: skip
                    return False
        return True

    def _apply_locally(self, ids: Sequence[MessageId], verdicts: Sequence[bool], verb: str) -> None:
        with self.lock:
            for found, accepted in zip(ids, verdicts):
                if not accepted:
                    continue
                if verb == "acked":
                    self.counters.acked += 1
                else:
                    self.counters.cancelled += 1
                    self._cancelled_here[found] = None
                    if len(self._cancelled_here) > MAX_CANCELLED_KEPT:
                        self._cancelled_here.popitem(last=False)
                held = self._held_covering(found.partition, found.offset)
                if held is None:
                    continue  # another server's: it learns from the log
                if verb == "acked":
                    held.acked.add(found.offset)
                    held.messages.pop(found.offset, None)
                else:
                    held.pending_until[found.offset] = 0
                    held.free_again(found.offset)

    def _held_covering(self, partition: int, offset: int) -> HeldRange | None:
        for held in self.ranges.values():
            if held.partition == partition and held.start <= offset < held.end:
                return held
        return None

    # ------------------------------------------------------------- the loop

    def run_loop(self) -> None:
        while not self._stop_loop.is_set():
            self.last_loop = time.monotonic()
            try:
                self._step()
            except CoordinationWriteError as exc:
                self.log.warning("%s: coordination write not confirmed: %s", self.topic, exc)
            except Exception:  # the loop must go on: a bug here would strand every held range
                self.log.exception("%s: the serve loop failed a step", self.topic)
            self._stop_loop.wait(LOOP_PAUSE_S)

    def _step(self) -> None:
        now = time.monotonic()
        self._follow_partitions(now)
        self._sync_from_log()
        self._drop_lapsed()
        self._dead_letter()
        self._settle()
        if now >= self._next_renewal:
            self._next_renewal = now + self.options.pending_timeout / 3
            self._renew()
        if now >= self._next_orders:
            self._next_orders = now + ORDERS_INTERVAL_S
            self._obey_operators()
        if not self.stopping:
            self._ask_high_watermarks(now)
            if not self.held_back:
                self._claim()
        self._fetch()
        if self.waiting_readers:  # the count is for reads that wait (a read tries the held messages first anyway):
            self.available_now = self.available()  # nobody waiting, no scan of every held message each pass
            if self.available_now and self.on_news is not None:
                self.on_news()  # wake the reads waiting for a message

    def _follow_partitions(self, now: float) -> None:
        """The topic's partition count as the cluster says now: a partition added is served, and one gone (the
        topic deleted and created again, smaller) is answered 404 unknown_partition, not 409 as never handed out."""
        metadata = None if self._metadata is None else self._metadata.poll(now)
        if metadata is None:
            return
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            self.log.error("%s has disappeared from the cluster: nothing to serve until it is created again",
                           self.topic)  # fmt: skip
            return
        count = len(found.partitions)
        if count != self.partition_count:
            self.log.warning("%s now has %d partitions (was %d)%s", self.topic, count, self.partition_count,
                             "" if count > self.partition_count else ": it was deleted and created again")  # fmt: skip
            self.partition_count = count

    def _obey_operators(self) -> None:
        """``admin drain``/``pause --topic``: claim nothing and give back what no client holds (acks are still
        taken); ``admin shutdown``: stop as on SIGTERM.  The same orders a supervisor obeys (remote_control.py)."""
        assert self._holder is not None
        me = Owner(self._holder.client, self._holder.instance)
        now_ms = self.coordinator.now_ms()
        orders = self.coordinator.read(lambda world: orders_for(world, me, self.started_ms, now_ms))
        held_back = orders.drained or self.topic in orders.paused_topics
        if held_back != self.held_back:
            self.log.warning("%s: %s", self.topic, "drained or paused by an operator: claiming nothing, giving back "
                             "what no client holds" if held_back else "resumed by an operator")  # fmt: skip
            self.held_back = held_back
        if orders.shutdown and not self.stopping:
            self.log.warning("%s: an operator ordered a shutdown (admin shutdown): stopping as on SIGTERM", self.topic)
            self.begin_stop()
            if self.on_shutdown_order is not None:
                self.on_shutdown_order()

    def _sync_from_log(self) -> None:
        """What other servers did to our messages (acks, cancels), as the fold has it: looked up only when the log
        folded a record of another instance since the last look (or FULL_SYNC_S passed)."""
        foreign, now_s = self.coordinator.foreign_records, time.monotonic()
        if foreign == self._synced_foreign and now_s < self._next_full_sync:
            return
        self._synced_foreign, self._next_full_sync = foreign, now_s + FULL_SYNC_S  # read before: later ones count
        with self.lock:
            keys = [(held.partition, held.start) for held in self.ranges.values()]
        if not keys:
            return
        wall = self.coordinator.now_ms()

        def leases(world: WorldState) -> dict[tuple[int, int], tuple[set[int], dict[int, tuple[int, int]]]]:
            found = {}
            for partition, start in keys:
                shared = world.shared_partition(self.topic, partition)
                lease = None if shared is None else shared.leases.get(start)
                if lease is not None and lease.holder == self._holder:
                    found[(partition, start)] = (set(lease.acked), dict(lease.handed))
            return found

        seen = self.coordinator.read(leases)
        now = monotonic_ms()
        with self.lock:
            for key, (acked, handed) in seen.items():
                held = self.ranges.get(key)
                if held is None:
                    continue
                for offset in acked - held.acked:
                    held.acked.add(offset)
                    held.messages.pop(offset, None)
                for offset, (deadline, count) in handed.items():
                    held.handed[offset] = max(held.handed.get(offset, 0), count)
                    if deadline <= wall and held.pending_until.get(offset, 0) > now:
                        held.pending_until[offset] = 0  # cancelled through another server
                        held.free_again(offset)

    def _drop_lapsed(self) -> None:
        now = monotonic_ms()
        with self.lock:
            for key, held in list(self.ranges.items()):
                if not self.member.usable(held, now) and not held.settling:
                    self.log.warning("%s[%d]: the lease on %d..%d ran out before it was settled (renewals not "
                                     "confirmed): it lapses, and its messages not acked are delivered again",
                                     self.topic, held.partition, held.start, held.end - 1)  # fmt: skip
                    del self.ranges[key]
                    self.counters.ranges_lost += 1

    def _dead_letter(self) -> None:
        """Messages handed out ``max_deliveries`` times (counting earlier leases) and not acked, once their last
        pending time is over: to the dead-letter topic, so their range can be settled."""
        now = monotonic_ms()
        todo: list[tuple[HeldRange, int, Any]] = []
        with self.lock:
            for held in self.ranges.values():
                for offset, message in held.messages.items():
                    deliveries = held.tries + held.handed.get(offset, 0)
                    if deliveries >= self.options.max_deliveries and held.eligible(offset, now):
                        held.reserved.add(offset)
                        todo.append((held, offset, message))
        for held, offset, message in todo:
            deliveries = held.tries + held.handed.get(offset, 0)
            error = MaxDeliveriesExceeded(f"delivered {deliveries} times and never acked "
                                          f"(max_deliveries={self.options.max_deliveries})")  # fmt: skip
            try:
                headers = letter_headers("serve", message, error, deliveries)
                self._dlq.write(self.options.dead_letter_topic, [message], [headers])
            except Exception as exc:  # noqa: BLE001 - try again next pass
                self.log.warning("%s[%d]: writing offset %d to %s failed: %s", self.topic, held.partition, offset,
                                 self.options.dead_letter_topic, exc)  # fmt: skip
                with self.lock:
                    held.reserved.discard(offset)
                    held.free_again(offset)
                continue
            self.log.error("%s[%d]: offset %d sent to %s after %d deliveries", self.topic, held.partition, offset,
                           self.options.dead_letter_topic, deliveries)  # fmt: skip
            with self.lock:
                held.reserved.discard(offset)
                held.dead.add(offset)
                held.messages.pop(offset, None)
                self.counters.dead_lettered += 1

    def _settle(self) -> None:
        """Ack the ranges that are complete; give back those no client holds a message of when stopping, or when
        no reader has wanted them for a while (so another server, or a Python worker, may serve them)."""
        now = monotonic_ms()
        acks: list[HeldRange] = []
        give_back: list[HeldRange] = []
        with self.lock:
            for held in self.ranges.values():
                if held.settling:
                    continue
                if held.complete():
                    acks.append(held)
                elif (self.stopping or self.held_back or (not self.waiting_readers and now - held.last_used >
                                                          IDLE_GIVE_BACK_MS)) and not held.holds_a_client_message(now):
                    give_back.append(held)
            for held in acks + give_back:
                held.settling = True
        member = self.member
        if acks:
            record: codec.Record = member.acks(self.coordinator.record_fields(), [
                handled_entry(h, h.end, (), tuple(sorted(h.dead)), self._fetched_high.get(h.partition)) for h in acks
            ])  # fmt: skip
            self._write_settlement(record, acks, "ranges_acked")
        going_back = [(h, _given_back(h)) for h in give_back]
        settle = [(h, entry) for h, entry in going_back if entry is not None]
        if settle:
            record = member.acks(self.coordinator.record_fields(), [entry for _, entry in settle])
            self._write_settlement(record, [h for h, _ in settle], "ranges_cancelled")
        cancels = [h for h, entry in going_back if entry is None]
        if cancels:
            record = member.cancels(self.coordinator.record_fields(), [cancel_entry(h) for h in cancels])
            self._write_settlement(record, cancels, "ranges_cancelled")

    def _write_settlement(self, record: codec.Record, held: list[HeldRange], counter: str) -> None:
        try:
            verdicts = per_entry(self.coordinator.write([record])[0], len(held))
        except CoordinationWriteError:
            with self.lock:
                for h in held:
                    h.settling = False  # written again next pass: the fold refuses a second settlement
            raise
        with self.lock:
            for h, accepted in zip(held, verdicts):
                self.ranges.pop((h.partition, h.start), None)
                if accepted:
                    setattr(self.counters, counter, getattr(self.counters, counter) + 1)
                else:
                    self.counters.ranges_lost += 1
                    self.log.warning("%s[%d]: settling %d..%d refused: its lease had lapsed", self.topic,
                                     h.partition, h.start, h.end - 1)  # fmt: skip

    def _renew(self) -> None:
        now = monotonic_ms()
        with self.lock:
            held = self.member.renewals_due((h for h in self.ranges.values() if not h.settling), now)
        if not held:
            return
        record = self.member.renewal(self.coordinator.record_fields(), held)
        written_ms = monotonic_ms()
        verdicts = per_entry(self.coordinator.write([record])[0], len(held))
        with self.lock:
            for h, accepted in zip(held, verdicts):
                deadline = self.member.renewed_deadline(h, written_ms, accepted)
                if deadline is not None:
                    h.deadline_ms = deadline

    # -------------------------------------------------------------- claiming

    def _ask_high_watermarks(self, now: float) -> None:
        assert self._offsets is not None
        self._ends.refresh(self._offsets, self.topic, self.partition_count, now)

    def _readers(self) -> bool:
        """Readers wait, or read lately: worth holding messages for (a server with no readers holds nothing others
        could serve)."""
        return bool(self.waiting_readers) or time.monotonic() - self.last_read < READERS_RECENT_S

    def _want(self, available: int) -> int:
        """Ranges to claim now: only while there are readers (_readers), when fewer messages wait to be handed out
        than the readers take in LEASE_AHEAD_S at their recent rate (at least half a range): enough ranges to make
        that up.  Ranges whose every message is out with clients do not count against ``max_leases`` (they only
        wait for acks), up to MAX_HELD in all."""
        if not self._readers():
            return 0
        now = monotonic_ms()
        with self.lock:
            held = len(self.ranges)
            active = sum(1 for h in self.ranges.values() if not h.fetched() or any(h.eligible(o, now) for o in h.messages))
        size = self.options.range_size
        reserve = max(1, size // 2, math.ceil(self._hand_outs.per_second(time.monotonic()) * LEASE_AHEAD_S))
        if held >= MAX_HELD or active >= self.options.max_leases or available >= reserve:
            return 0
        wanted = max(1 if active else 2, math.ceil((reserve - available) / size))
        return min(wanted, self.options.max_leases - active, MAX_HELD - held)

    def _claim(self) -> None:
        if not self._readers():
            return  # nobody to claim for (_want): spare the count
        available = self.available()
        want = self._want(available)
        if not want or not self._ends.ends:
            return
        now_ms = self.coordinator.now_ms()
        size = self.options.range_size
        high = {p: partition_end(end, self._fetched_high.get(p, -1)) for p, end in self._ends.ends.items()}
        # With readers waiting and nothing to hand out, a partition read to its end gets a range there: its fetches
        # hand the messages out as they come (and tell the true end).
        idle = self.partition_count if available == 0 else 0
        choice = self.coordinator.read(
            lambda world: self.member.choose(world, high, self._initial, now_ms, size, want, idle, self._rng)
        )
        if choice.unknown:
            assert self._offsets is not None
            self._offsets.learn_start_offsets(self.topic, choice.unknown, self._initial, self.log)
            return
        picked = choice.ranges
        if not picked:
            return
        record = self.member.claim(self.coordinator.record_fields(), picked)
        written_ms = monotonic_ms()
        verdicts = per_entry(self.coordinator.write([record])[0], len(picked))
        won = self.member.won(picked, verdicts)
        deadline = self.member.deadline(written_ms)
        with self.lock:
            self.counters.ranges_refused += len(picked) - len(won)
            self.counters.ranges_claimed += len(won)
            for partition, start, end, tries in won:
                held = self.ranges[(partition, start)] = HeldRange(partition, start, end, tries, deadline, start)
                taken = self._ahead.take(partition, start, end)  # read already: no fetch before its first read
                if taken is not None:
                    records, held.fetched_to = taken
                    for offset, record in records.items():
                        if record is None:
                            self.counters.other_group += 1  # never handed out: done, as an offset with no message
                        else:
                            held.messages[offset] = record

    # ---------------------------------------------------------------- Kafka

    def _fetch(self) -> None:
        """Read the messages of every held range not read yet: one consumer, each partition from the lowest offset
        still to read, every message routed to the range that covers it."""
        with self.lock:
            wanted: dict[int, int] = {}
            for held in self.ranges.values():
                if not held.fetched():
                    wanted[held.partition] = min(wanted.get(held.partition, held.fetched_to), held.fetched_to)
        assert self._consumer is not None
        if not wanted:
            if self._positions:
                self._consumer.unassign()
                self._positions = {}
            return
        if set(wanted) != set(self._positions) or any(wanted[p] < self._positions[p] for p in wanted):
            self._consumer.assign([TopicPartition(self.topic, p, offset) for p, offset in sorted(wanted.items())])
            self._positions = dict(wanted)
        reading_from = dict(self._positions)
        records = self._consumer.consume(FETCH_MOST, 0.01)  # short: the loop has more to do than wait here
        seen: dict[int, int] = {}  # partition -> the offset after the last message (or the end) seen
        fetched: list[tuple[int, int, Any]] = []
        for record in records:
            error = record.error()
            partition, offset = record.partition(), record.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and partition is not None and offset is not None:
                    seen[partition] = max(seen.get(partition, 0), offset)  # nothing more there for now
                else:
                    self.log.warning("%s[%s]: fetch error: %s", self.topic, partition, error)
                continue
            assert partition is not None and offset is not None  # a record, not an error event: it has both
            fetched.append((partition, offset, record))
            seen[partition] = max(seen.get(partition, 0), offset + 1)
        for partition, seen_end in seen.items():
            if partition in self._positions:
                self._positions[partition] = max(self._positions[partition], seen_end)
            high = self._consumer.fetched_end(self.topic, partition)  # the true end, where ListOffsets lists less
            if high > self._fetched_high.get(partition, -1):
                self._fetched_high[partition] = high
        not_ours = self._other_groups.keys([record for _, _, record in fetched])
        with self.lock:
            for partition, offset, record in fetched:
                covering = self._held_covering(partition, offset)
                if covering is not None and offset >= covering.fetched_to and offset not in covering.acked:
                    if not_ours and (partition, offset) in not_ours:
                        self.counters.other_group += 1  # never handed out: done, as an offset with no message
                    else:
                        covering.messages[offset] = record
            for held in self.ranges.values():
                reached = seen.get(held.partition)
                if reached is not None and reached > held.fetched_to:  # read in order from at most fetched_to
                    held.fetched_to = min(reached, held.end)
            self._keep_ahead(reading_from, seen, fetched, not_ours)

    def _keep_ahead(self, reading_from: dict[int, int], seen: dict[int, int], fetched: list[tuple[int, int, Any]],
                    not_ours: frozenset[tuple[int, int]]) -> None:  # fmt: skip
        """What this fetch read past every held range of a partition goes to the read-ahead. Under the lock."""
        for partition, reached in seen.items():
            ends = [held.end for held in self.ranges.values() if held.partition == partition]
            begin = max(reading_from.get(partition, reached), *ends)
            past = {offset: None if (partition, offset) in not_ours else record
                    for p, offset, record in fetched if p == partition and offset >= begin}  # fmt: skip
            self._ahead.note(partition, begin, reached, past)

    # --------------------------------------------------------------- status

    def held_summary(self) -> dict[str, Any]:
        now = monotonic_ms()
        with self.lock:
            pending = sum(
                1 for h in self.ranges.values() for o, until in h.pending_until.items()
                if until > now and o not in h.acked
            )  # fmt: skip
            return {"leases": len(self.ranges), "pending": pending, "buffered": sum(len(h.messages) for h in self.ranges.values())}


def _given_back(held: HeldRange) -> codec.AckEntry | None:
    """How a range no client holds a message of goes back (range_member.given_back_entry): None, a plain cancel, if
    nothing of it was handed out; else an ack of its prefix up to the first message never handed out."""
    never = [o for o in held.messages if o not in held.handed and o not in held.dead and o not in held.acked]
    return given_back_entry(held, held.fetched_to, never, held.handed, held.acked, held.dead)


def _message_state(world: WorldState, found: MessageId, wall_ms: int) -> str:
    """One message as the fold has it at ``wall_ms``: done, acked (by a client; the lease still runs), pending,
    expired (handed out, deadline passed), undelivered (leased, never handed out) or unknown (no lease)."""
    shared: SharedPartition | None = world.shared_partition(found.topic, found.partition)
    if shared is None:
        return "unknown"
    if shared.is_done(found.offset):
        return "done"
    lease = shared.covering(found.offset, wall_ms)
    if lease is None:
        return "unknown"
    if found.offset in lease.acked:
        return "acked"
    handed = lease.handed.get(found.offset)
    if handed is None:
        return "undelivered"
    return "pending" if handed[0] > wall_ms else "expired"


_WHY = {
    "unknown": "this group never handed it out, or the lease it was handed out under has ended (it will be "
    "delivered again)",
    "undelivered": "it was never handed out",
    "expired": "its pending deadline passed: it may be handed to another client",
    "cancelled": "it was cancelled (given back through this server) and not handed out since",
    "done": "it is done already (acked, or dead-lettered)",
    "acked": "it is acked already",
}


def _problem(found: MessageId, state: str) -> dict[str, Any]:
    return {"topic": found.topic, "partition": found.partition, "offset": found.offset, "state": state,
            "why": _WHY.get(state, state)}  # fmt: skip
