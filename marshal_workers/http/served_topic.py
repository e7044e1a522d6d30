"""One topic served over HTTP (``marshal-workers serve``, docs/http-service.md): leases, messages, hand-outs.

The server takes part in the topic as a shared-partition member
(docs/shared-partitions.md): it leases ranges of offsets in the coordination log, reads their
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

The parts, each in its module: a held range and what the server knows of its
messages (served_lease.py), when to lease more (lease_ahead.py), the reading of
the held ranges from Kafka (range_reader.py), acks and cancels
(settlements.py); the lease decisions are the shared pool's
(protocol/range_member.py), and operators' orders are obeyed as a supervisor
obeys them (member/obeying.py, through served_orders.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.core.logs import group_log
from marshal_workers.errors import CoordinationWriteError, MaxDeliveriesExceeded, UnknownTopicError
from marshal_workers.http.group_commit import GroupCommit, Kind, WriteStats
from marshal_workers.http.http_messages import BadRequest, MessageId, message_json
from marshal_workers.http.lease_ahead import READERS_RECENT_S, HandOutRate, range_size, ranges_wanted
from marshal_workers.http.range_reader import RangeReader
from marshal_workers.http.serve_counters import ServeCounters
from marshal_workers.http.served_lease import ServedLease, given_back, reserve_dead_letters
from marshal_workers.http.served_orders import ServedOrders
from marshal_workers.http.settlements import Settlement, Settlements, log_may_lag, settlement
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.committed_offsets import OffsetStore, PartitionEnds
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.dead_letter_writer import DeadLetterWriter, letter_headers
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import admin_client
from marshal_workers.kafka.metadata_refresh import MetadataRefresh, followed_partition_count
from marshal_workers.member.obeying import Held, Obeying
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.partition_end import partition_end
from marshal_workers.protocol.range_member import RangeMember, cancel_entry, handled_entry
from marshal_workers.protocol.world_state import WorldState, per_entry
from marshal_workers.runtime.channel import monotonic_ms

_log = logging.getLogger(__name__)

LOOP_PAUSE_S = 0.01
# The loop mirrors what others did to our ranges only when the log folded another instance's record since the last
# look (our own records we apply as we write them), and at least this often whatever it folded (an ack whose request
# gave up waiting for its verdict is applied locally by nobody else).
FULL_SYNC_S = 0.5
ORDERS_INTERVAL_S = 0.25  # how often the operators' orders are looked at
IDLE_GIVE_BACK_MS = 2000  # a held range no reader wanted for this long goes back to the group


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


class ServedTopic:
    def __init__(self, settings: Settings, options: ServeOptions) -> None:
        self.settings = settings
        self.options = options
        self.topic = options.topic
        self.log = group_log(_log, settings.require_group())
        self.counters = ServeCounters()
        self.ranges: dict[tuple[int, int], ServedLease] = {}
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
        self._obeying: Obeying[Held] | None = None  # the looks at operators' orders, once started
        self.last_loop = time.monotonic()  # for /healthz: the loop is alive
        self._coordinator: Coordinator | None = None
        self._offsets: OffsetStore | None = None
        self._consumer: GuardedConsumer | None = None
        self._dlq = DeadLetterWriter(settings)
        self._ends = PartitionEnds()  # as ListOffsets says, asked without blocking
        self._initial: dict[int, int] = {}
        self._next_renewal = 0.0
        self._synced_foreign = -1  # coordinator.foreign_records at the last _sync_from_log
        self._next_full_sync = 0.0
        self._rng = random.Random()
        self._stop_loop = threading.Event()
        self._wake_loop = threading.Event()  # a read found nothing to hand out: the loop's next pass now
        self._thread: threading.Thread | None = None
        self._holder: MemberId | None = None
        self._group_commit: GroupCommit | None = None
        self._metadata: MetadataRefresh | None = None  # the topic's partition count, followed (_follow_partitions)
        self._reader = RangeReader(
            self.topic, settings.require_group(), self.ranges, self.lock, self.counters, self.log
        )
        self._settlements = Settlements(
            self.ranges, self.lock, self.counters, lambda: self.coordinator, lambda: self._commit
        )
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
        self._holder = MemberId(self._coordinator.client, self._coordinator.instance)
        self._obeying = Obeying(self._holder, self.started_ms, ORDERS_INTERVAL_S, (self.topic,), ServedOrders(self))
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
        self._wake_loop.set()
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
        self._group_commit = GroupCommit(
            self.coordinator, self.coordinator.record_fields, self.topic, self.options.pending_ms, loop
        )

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
                1
                for held in self.ranges.values()
                if held.deadline_ms > now
                for offset in held.messages
                if held.eligible(offset, now)
            )

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

    def _answer_written(
        self,
        picked: list[tuple[ServedLease, int, bool]],
        written: asyncio.Future[list[bool]],
        since_ms: int,
        since_wall: int,
    ) -> list[dict[str, Any]]:
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

    def _pick(self, most: int, now: int) -> list[tuple[ServedLease, int, bool]]:
        """Up to ``most`` messages to hand out, reserved: (range, offset, never handed out under this lease)."""
        picked: list[tuple[ServedLease, int, bool]] = []
        with self.lock:
            for held in sorted(self.ranges.values(), key=lambda r: (r.partition, r.start)):
                if len(picked) >= most:
                    break
                if not self.member.usable(held, now, promise_ms=self.options.pending_ms // 3):
                    continue  # its lease may not outlive what we would promise
                for offset in held.pick(most - len(picked), now, self.options.max_deliveries):
                    picked.append((held, offset, offset not in held.handed))
        return picked

    def _handed_out(self, held: ServedLease, offset: int, since_ms: int, since_wall: int) -> dict[str, Any]:
        """A reserved message is out with a client from ``since_ms`` (monotonic; ``since_wall`` the wall clock's ms)
        until the pending timeout: its answer.  Under the lock."""
        held.handed_until(offset, since_ms + self.options.pending_ms)
        held.handed[offset] = held.handed.get(offset, 0) + 1
        self._settlements.handed_out(MessageId(self.topic, held.partition, offset))
        held.last_used = since_ms
        self.counters.delivered += 1
        self._hand_outs.count += 1
        message = held.messages[offset]
        kind, stamp = message.timestamp()
        return message_json(
            self.topic,
            held.partition,
            offset,
            message.key(),
            message.value(),
            message.headers() or [],
            stamp if kind != 0 else None,
            since_wall + self.options.pending_ms,
            held.tries + held.handed[offset],
        )

    def _write_hand_outs(self, picked: list[tuple[ServedLease, int]], entries: list[codec.MessageEntry]) -> None:
        """Queue the hand-outs answered already; their verdicts come back on the event loop."""
        self._commit.submit(Kind.DELIVER, entries, linger=True).add_done_callback(
            lambda done: self._hand_outs_written(picked, done)
        )

    def _hand_outs_written(self, picked: list[tuple[ServedLease, int]], done: asyncio.Future[list[bool]]) -> None:
        """Hand-outs answered before their record: confirmed, refused (our lease had lapsed in the log: another
        member may hand them out; at least once allows it), or not written (tried again while the lease lasts)."""
        error = done.exception()
        now = monotonic_ms()
        again: list[tuple[ServedLease, int]] = []
        with self.lock:
            verdicts = done.result() if error is None else [None] * len(picked)
            for (held, offset), accepted in zip(picked, verdicts):
                if (
                    accepted is None
                    and self.member.usable(held, now)
                    and self.ranges.get((held.partition, held.start)) is held
                ):
                    again.append((held, offset))
                    continue
                held.unwritten.discard(offset)
                if accepted is False:
                    self.counters.refused += 1
        refused = [(h.partition, o) for (h, o), ok in zip(picked, verdicts) if ok is False]
        if refused:
            self.log.warning(
                "%s: hand-outs %s refused by the log (the lease had lapsed): they may be handed to another client",
                self.topic,
                refused,
            )
        if error is not None:
            self.log.warning(
                "%s: hand-outs of %d messages not confirmed (%s): %s",
                self.topic,
                len(picked),
                error,
                "writing them again" if again else "their lease ran out: they are delivered again",
            )
        if again:
            self._write_hand_outs(again, [codec.MessageEntry(h.partition, o) for h, o in again])

    # An ack or a cancel (settlements.py), in steps the HTTP handler awaits between.

    def message_states(self, ids: Sequence[MessageId]) -> list[str]:
        """Each message's state (Settlements.states); BadRequest 404 for a message not of the served topic."""
        for found in ids:
            if found.topic != self.topic:
                raise BadRequest(404, "unknown_topic", f"this server serves {self.topic!r}, not {found.topic!r}")
            if found.partition >= self.partition_count:
                raise BadRequest(
                    404,
                    "unknown_partition",
                    f"{self.topic} has partitions 0 to {self.partition_count - 1}, not {found.partition}",
                )
        return self._settlements.states(ids)

    @staticmethod
    def log_may_lag(states: Sequence[str]) -> bool:
        """Worth waiting for our view of the log before answering (settlements.log_may_lag)."""
        return log_may_lag(states)

    def settlement(self, ids: Sequence[MessageId], states: Sequence[str], kind: Kind) -> Settlement:
        """What an ack or cancel of ``ids`` writes (settlements.settlement); BadRequest 409 if any cannot be."""
        return settlement(ids, states, kind)

    def write_settlement(self, settlement: Settlement) -> asyncio.Future[list[bool]]:
        """The settlement's record, in the next group commit: its verdicts."""
        return self._settlements.write(settlement)

    def settled(self, settlement: Settlement, verdicts: Sequence[bool]) -> dict[str, Any]:
        """The answer once the log judged the settlement; BadRequest 409 if it refused some."""
        return self._settlements.settled(settlement, verdicts)

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
            # A pause between passes, cut short by a read that found nothing to hand out: it waits for what the
            # next pass leases and fetches.
            self._wake_loop.wait(LOOP_PAUSE_S)
            self._wake_loop.clear()

    def wake_loop(self) -> None:
        """A read found nothing to hand out: the loop's next pass at once (from the event loop)."""
        self._wake_loop.set()

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
        if self._obeying is not None:
            self._obeying.step(now)
        if not self.stopping:
            self._ask_high_watermarks(now)
            if not self.held_back:
                self._claim()
        assert self._consumer is not None
        self._reader.fetch(self._consumer)
        if self.waiting_readers:  # the count is for reads that wait (a read tries the held messages first anyway):
            self.available_now = self.available()  # nobody waiting, no scan of every held message each pass
            if self.available_now and self.on_news is not None:
                self.on_news()  # wake the reads waiting for a message

    def _follow_partitions(self, now: float) -> None:
        """The topic's partition count as the cluster says now: a partition added is served, and one gone (the
        topic deleted and created again, smaller) is answered 404 unknown_partition, not 409 as never handed out."""
        metadata = None if self._metadata is None else self._metadata.poll(now)
        if metadata is not None:
            self.partition_count = followed_partition_count(metadata, self.topic, self.partition_count, self.log)

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
                    self.log.warning(
                        "%s[%d]: the lease on %d..%d ran out before it was settled (renewals not "
                        "confirmed): it lapses, and its messages not acked are delivered again",
                        self.topic,
                        held.partition,
                        held.start,
                        held.end - 1,
                    )
                    del self.ranges[key]
                    self.counters.ranges_lost += 1

    def _dead_letter(self) -> None:
        """Messages handed out ``max_deliveries`` times (counting earlier leases) and not acked, once their last
        pending time is over: to the dead-letter topic, so their range can be settled."""
        now = monotonic_ms()
        with self.lock:
            todo = reserve_dead_letters(self.ranges.values(), self.options.max_deliveries, now)
        for held, offset, message in todo:
            deliveries = held.deliveries(offset)
            error = MaxDeliveriesExceeded(
                f"delivered {deliveries} times and never acked (max_deliveries={self.options.max_deliveries})"
            )
            try:
                headers = letter_headers("serve", message, error, deliveries)
                self._dlq.write(self.options.dead_letter_topic, [message], [headers])
            except Exception as exc:  # noqa: BLE001 - try again next pass
                self.log.warning(
                    "%s[%d]: writing offset %d to %s failed: %s",
                    self.topic,
                    held.partition,
                    offset,
                    self.options.dead_letter_topic,
                    exc,
                )
                with self.lock:
                    held.reserved.discard(offset)
                    held.free_again(offset)
                continue
            self.log.error(
                "%s[%d]: offset %d sent to %s after %d deliveries",
                self.topic,
                held.partition,
                offset,
                self.options.dead_letter_topic,
                deliveries,
            )
            with self.lock:
                held.reserved.discard(offset)
                held.dead.add(offset)
                held.messages.pop(offset, None)
                self.counters.dead_lettered += 1

    def _settle(self) -> None:
        """Ack the ranges that are complete; give back those no client holds a message of when stopping, or when
        no reader has wanted them for a while (so another server, or a Python worker, may serve them)."""
        now = monotonic_ms()
        acks: list[ServedLease] = []
        give_back: list[ServedLease] = []
        with self.lock:
            for held in self.ranges.values():
                if held.settling:
                    continue
                if held.complete():
                    acks.append(held)
                elif (
                    self.stopping
                    or self.held_back
                    or (not self.waiting_readers and now - held.last_used > IDLE_GIVE_BACK_MS)
                ) and not held.holds_a_client_message(now):
                    give_back.append(held)
            for held in acks + give_back:
                held.settling = True
        member = self.member
        if acks:
            record: codec.Record = member.acks(
                self.coordinator.record_fields(),
                [
                    handled_entry(h, h.end, (), tuple(sorted(h.dead)), self._reader.fetched_high.get(h.partition))
                    for h in acks
                ],
            )
            self._write_settlement(record, acks, "ranges_acked")
        going_back = [(h, given_back(h)) for h in give_back]
        settle = [(h, entry) for h, entry in going_back if entry is not None]
        if settle:
            record = member.acks(self.coordinator.record_fields(), [entry for _, entry in settle])
            self._write_settlement(record, [h for h, _ in settle], "ranges_cancelled")
        cancels = [h for h, entry in going_back if entry is None]
        if cancels:
            record = member.cancels(self.coordinator.record_fields(), [cancel_entry(h) for h in cancels])
            self._write_settlement(record, cancels, "ranges_cancelled")

    def _write_settlement(self, record: codec.Record, held: list[ServedLease], counter: str) -> None:
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
                    self.log.warning(
                        "%s[%d]: settling %d..%d refused: its lease had lapsed",
                        self.topic,
                        h.partition,
                        h.start,
                        h.end - 1,
                    )

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
        """Ranges to claim now: only while there are readers (_readers), as lease_ahead.ranges_wanted says."""
        if not self._readers():
            return 0
        now = monotonic_ms()
        with self.lock:
            held = len(self.ranges)
            active = sum(
                1 for h in self.ranges.values() if not h.fetched() or any(h.eligible(o, now) for o in h.messages)
            )
        rate = self._hand_outs.per_second(time.monotonic())
        return ranges_wanted(held, active, available, rate, self._range_size(), self.options.max_leases)

    def _range_size(self) -> int:
        """Offsets of the next ranges: the configured size, or more for fast readers (lease_ahead.range_size)."""
        return range_size(self._hand_outs.per_second(time.monotonic()), self.options.range_size)

    def _claim(self) -> None:
        if not self._readers():
            return  # nobody to claim for (_want): spare the count
        available = self.available()
        want = self._want(available)
        if not want or not self._ends.ends:
            return
        now_ms = self.coordinator.now_ms()
        size = self._range_size()
        high = {p: partition_end(end, self._reader.fetched_high.get(p, -1)) for p, end in self._ends.ends.items()}
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
                held = self.ranges[(partition, start)] = ServedLease(partition, start, end, tries, deadline, start)
                self._reader.take_ahead(held)

    # --------------------------------------------------------------- status

    def held_summary(self) -> dict[str, Any]:
        now = monotonic_ms()
        with self.lock:
            pending = sum(
                1
                for h in self.ranges.values()
                for o, until in h.pending_until.items()
                if until > now and o not in h.acked
            )
            return {
                "leases": len(self.ranges),
                "pending": pending,
                "buffered": sum(len(h.messages) for h in self.ranges.values()),
            }
