"""Reading the coordination topic: tail every partition into a WorldState.

The I/O shell around the fold.  A background thread consumes all partitions
of the coordination topic from the beginning, decodes each value, and folds
it into the state under a lock.  It remembers, per partition, the offset it
has folded up to, so that a writer can wait for its own record to be folded
and learn whether the rules accepted it (the read-your-write fence: never
ListOffsets, which Tansu under-reports).  "Caught up" means every partition was
read up to the end it had when reading began (ListOffsets then), or reported
end-of-partition: a reader catching up never waits for an empty fetch, which the
embedded broker holds for the whole fetch wait.  It reads up to there with the
wait of a catch-up (guarded_consumer.catch_up_wait_ms), and a tail then goes
on with the short one (docs/brokers.md, "Stalled fetches on a long partition").
Where it begins on each partition, at a checkpoint or the beginning, is
reader_start.py's.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, Message

from marshal_workers.core.config import Settings
from marshal_workers.core.stopping import ShouldStop, check_stop, never
from marshal_workers.errors import DecodeError, KafkaUnavailable
from marshal_workers.kafka.catch_up import KnownEnds, partition_ended, read_record
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import take_fetched, topic_partition_count
from marshal_workers.kafka.reader_start import begin_catching_up, learn_groups_before, log_consumer
from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.codec import Release
from marshal_workers.protocol.world_state import WorldState

log = logging.getLogger(__name__)

T = TypeVar("T")
GARBAGE_LOG_INTERVAL_S = 60.0
PROGRESS_LOG_INTERVAL_S = 3.0  # how often a supervisor's long start-up read says how far it has got
_BATCH = 2000  # records the tail takes per consume
_FOLD_SLICE = 64  # records folded per hold of the state's lock
_MAX_UNCLAIMED_VERDICTS = 100_000


class RateLimitedLog:
    """Logs at most once per interval, counting what it held back."""

    def __init__(self, logger: logging.Logger, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self._interval, self._clock = logger, interval_s, clock
        self._next_at = 0.0
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        if now < self._next_at:
            self._held += 1
            return
        held, self._held = self._held, 0
        suffix = f" ({held} more since the last report)" if held else ""
        self._logger.warning(message + suffix, *args)
        self._next_at = now + self._interval


class CoordinationLog:
    """Tails the coordination topic of one group into a WorldState.

    ``start()`` launches the tail thread; ``wait_caught_up()`` blocks until
    the state reflects the whole log as it was when reading began;
    ``wait_verdict(p, o)`` blocks until the record at partition p, offset o,
    written by ``own_instance``, is folded and returns whether it was accepted.  Read the state only
    through ``read()``, which holds the lock.
    """

    def __init__(
        self,
        settings: Settings,
        group: str,
        partition_count: int,
        own_instance: str | None = None,
        from_beginning: bool = False,
        progress_every: float = 0.0,
        tail: bool = True,
        consumer: GuardedConsumer | None = None,
    ) -> None:
        """``consumer``: its reader (reader_start.log_consumer), if the caller made it already (to ask it for the
        cluster's metadata first: cluster_metadata); else one is made here."""
        self.settings = settings
        self.topic = settings.coordination_topic
        self.partition_count = partition_count
        self._state = WorldState(group, settings.heartbeat_ms, partition_count)
        self._lock = threading.Condition()
        self._next_offset = [0] * partition_count  # next offset to fold, per partition
        # Per partition, the end as reading began, and whether it was read up to it (catch_up.py): caught up.
        self._ends = KnownEnds([-1] * partition_count)
        # ``tail``: the reader goes on after it caught up (a member, the dashboard, ``serve``), with the short fetch
        # wait from then on; a one-shot reader (``status``) is closed once caught up.
        self._tail = tail
        # Verdicts on the records this process wrote, by (partition, offset), until their writer takes them.
        self.own_instance = own_instance
        self._verdicts: dict[tuple[int, int], bool] = {}
        # Readable when a partition of the group was released: claimants need not wait for their next tick.
        self.releases, self._releases_w = wakeup_pair()
        # Readable when a record of own_instance was folded (for writers that do not block: Coordinator.collect).
        self.own_folds, self._own_folds_w = wakeup_pair()
        # Woken only once someone asked for it (watch_own_folds): a process whose writers all block on their
        # verdicts (Coordinator.write) would otherwise pay two socket sends per record for a wake-up nobody reads.
        self._own_folds_watched = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._learning: threading.Thread | None = None  # learn_directories
        self._garbage_log = RateLimitedLog(log, GARBAGE_LOG_INTERVAL_S)
        self.from_beginning = from_beginning
        # fold_delivered: the timestamp kind last read per partition, what it folded (time used), on or off.
        self._timestamp_kinds: list[int | None] = [None] * partition_count
        self._folded_early: dict[tuple[int, int], int | None] = {}
        self.fast_verdicts = True
        self.early_folds = 0  # records fold_delivered folded
        # Valid records folded that another instance wrote: a reader that mirrors part of the state (the HTTP
        # service's held ranges) need not look again while this stands still, since its own records it knows.
        self.foreign_folds = 0
        self.started_at: list[int] = [0] * partition_count  # where reading began, per partition
        self.starts: list[checkpoints.Start] = [checkpoints.BEGINNING] * partition_count
        # A supervisor's start-up says how far it has read, every ``progress_every`` seconds (0: never) from its
        # beginning (the search for checkpoints included), until it is caught up.
        self.report_progress = progress_every > 0
        self._progress_every = progress_every
        self._next_report = time.monotonic() + progress_every
        self._consumer = consumer if consumer is not None else log_consumer(settings, group, reader_purpose(tail))

    # ------------------------------------------------------------ lifecycle

    def start(self, should_stop: ShouldStop = never) -> CoordinationLog:
        """Start tailing each partition at the group's latest checkpoint there, else at the latest checkpoint of
        any group whose directory does not list it, else at the beginning (checkpoints.Start).

        StopRequested if ``should_stop`` says so while it looks for checkpoints.
        """
        catching_up = begin_catching_up(
            self._consumer,
            self.settings,
            self.partition_count,
            self._state.group,
            self.from_beginning,
            should_stop=should_stop,
            report=self.report_progress,
        )
        self.starts, self._ends = catching_up.starts, catching_up.ends
        with self._lock:
            for partition, start in enumerate(self.starts):
                checkpoints.begin(self._state, start, partition)
                if start.offset is not None:
                    self._next_offset[partition] = self.started_at[partition] = start.offset
            for message in catching_up.read_ahead:  # already counted read in the ends
                self._fold_record(message)
        self._thread = threading.Thread(target=self._run, name="coordination-log", daemon=True)
        self._thread.start()
        return self

    def learn_directories(self) -> None:
        """Learn, in the background, the groups before where reading began on each partition whose directory this
        reader does not know (it started at a checkpoint without one: written before release 0.7.0, or by a
        reader that did not know it either), so that its checkpoints carry one from then on (checkpoints.py).

        Reads each such partition from its start to where the tail began, noting only group names: once per
        member and partition, while directories do not exist yet, and never in the way of the tail.
        """
        known = self.read(lambda world: set(world.directory_known))
        unknown = {p: self.started_at[p] for p in range(self.partition_count) if p not in known}
        if not unknown:
            return
        self._learning = threading.Thread(
            target=self._learn_directories, args=(unknown,), name="coordination-directories", daemon=True
        )
        self._learning.start()

    def _learn_directories(self, stops: dict[int, int]) -> None:
        group = self._state.group
        consumer = log_consumer(self.settings, group, "directories")
        try:
            learned = learn_groups_before(consumer, self.topic, stops, self.settings, self._stopping.is_set)
        except KafkaException as exc:
            log.warning(
                "group %s: could not read which groups wrote to %s before our start (%s): our checkpoints carry no "
                "directory until a restart; other groups' new members read as before 0.7.0",
                group,
                self.topic,
                exc,
            )
            return
        finally:
            consumer.close()
        with self._lock:
            for partition, names in learned.items():
                self._state.learn_groups_before(partition, names)
        if learned:
            log.info(
                "group %s: learned which groups wrote to %s before our start (%s): our checkpoints carry a directory",
                group,
                self.topic,
                ", ".join(f"[{p}]: {len(names)} groups in {stops[p]} records" for p, names in sorted(learned.items())),
            )

    def describe_starts(self) -> str:
        """Where reading began, for the start-up log line: "from the latest checkpoints", ..."""
        kinds = [start.kind for start in self.starts]
        if all(kind == "beginning" for kind in kinds):
            return "the whole log: no checkpoint yet"
        if all(kind == "checkpoint" for kind in kinds):
            return "from the latest checkpoints"
        words = {
            "checkpoint": "at the group's checkpoint",
            "directory": "at another group's checkpoint (this group had no record before it)",
            "beginning": "from the beginning",
        }
        return ", ".join(f"{words[kind]} on {kinds.count(kind)}" for kind in words if kind in kinds)

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._learning is not None:
            self._learning.join(timeout=10)
        self._consumer.close()
        for end in (self.releases, self._releases_w, self.own_folds, self._own_folds_w):
            end.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                messages = self._next_messages()
                # In slices, the lock let go between them: a reader (an HTTP request's query on the event loop)
                # waits for at most a slice's fold, not for a whole batch of up to _BATCH records.
                for start in range(0, len(messages), _FOLD_SLICE):
                    with self._lock:
                        for message in messages[start : start + _FOLD_SLICE]:
                            self._fold_message(message)
                        self._lock.notify_all()
                if self.report_progress:
                    self._report_progress(time.monotonic())
                if self._consumer.catching_up and self._tail and self.caught_up():
                    self._consumer.begin_tail()  # on this thread: the only one that polls the consumer
            except Exception:  # nothing may silently kill the tail: log it and go on
                log.exception("coordination log %s: reading failed", self.topic)
                time.sleep(0.5)

    def _report_progress(self, now: float) -> None:
        """Until every partition was read to its end once: every ``progress_every`` seconds, how far reading got.
        (On the tail's thread, which alone uses the consumer: the ends are those of its last fetch responses.)"""
        if now < self._next_report:
            return
        self._next_report = now + self._progress_every
        with self._lock:
            behind = [p for p, done in enumerate(self._ends.at_end) if not done]
            read = [self._next_offset[p] - self.started_at[p] for p in range(self.partition_count)]
        if not behind:
            self.report_progress = False
            return
        about: dict[int, int] = {}
        for p in behind:
            about[p] = max(self._consumer.fetched_end(self.topic, p) - self.started_at[p], read[p])
        shown = "; ".join(f"{self.topic}[{p}]: {read[p]} of about {about[p]}" for p in behind[:4])
        more = f"; {len(behind) - 4} more partitions" if len(behind) > 4 else ""
        log.info(
            "group %s: read %d of about %d records of %s so far (%s%s)",
            self._state.group,
            sum(read),
            sum(read) + sum(about[p] - read[p] for p in behind),
            self.topic,
            shown,
            more,
        )

    def _next_messages(self) -> list[Message]:
        """Wait up to 100 ms for one message, then take what else is already fetched."""
        return take_fetched(self._consumer, _BATCH, 0.1)

    def _fold_message(self, message: Message) -> None:
        partition = message.partition()
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                partition_ended(self._ends, self._consumer, self.topic, partition)
            else:
                log.warning("coordination log %s: %s", self.topic, error)
            return
        offset = message.offset()
        assert partition is not None and offset is not None  # a record, not an error event: it has both
        self._fold_record(message)
        read_record(self._ends, self._consumer, self.topic, partition, offset)

    def _fold_record(self, message: Message) -> None:
        """Fold a record read from the log (not an error event), under the lock."""
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None  # a record, not an error event: it has both
        kind, stamp = message.timestamp()
        self._timestamp_kinds[partition] = kind
        at = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None
        if offset < self._next_offset[partition]:
            self._check_folded_early(partition, offset, at)
            return
        if offset > self._next_offset[partition] and self._next_offset[partition] > self.started_at[partition]:
            log.error(
                "coordination log %s[%d]: records %d..%d were never read (a gap in the log): this member's state "
                "may differ from the others'",
                self.topic,
                partition,
                self._next_offset[partition],
                offset - 1,
            )
        self._fold_value(partition, offset, message.value(), at)

    def _fold_value(self, partition: int, offset: int, value: bytes | None, log_append_time: int | None) -> None:
        """Fold the record at (partition, offset): the one place the tail and fold_delivered both fold through."""
        try:
            record, accepted = self._state.apply_value(value, partition, log_append_time)
            record_instance: str | None = record.instance
            if accepted and isinstance(record, Release):
                _wake(self._releases_w)
        except DecodeError as exc:
            self._garbage_log.warning(
                "coordination log %s[%d]@%d: skipped a record that is not valid: %s", self.topic, partition, offset, exc
            )
            accepted, record_instance = False, None
        self._next_offset[partition] = offset + 1
        if record_instance is not None and record_instance != self.own_instance:
            self.foreign_folds += 1
        if self.own_instance is not None and record_instance == self.own_instance:
            self._verdicts[(partition, offset)] = accepted
            if self._own_folds_watched:
                _wake(self._own_folds_w)
            if len(self._verdicts) > _MAX_UNCLAIMED_VERDICTS:  # writers that gave up waiting
                del self._verdicts[next(iter(self._verdicts))]

    # ------------------------------------------------- folding our own writes

    def fold_delivered(self, partition: int, offset: int, value: bytes, timestamp: tuple[int, int]) -> bool:
        """Fold a record we wrote from its delivery report, if the tail has folded everything before it.

        The fast path of a verdict (docs/protocol.md): the record's place in the log is known, and
        so is every record before it, so folding it now gives exactly the state and verdict the tail
        would reach when it reads it, without waiting for that read.  The tail then skips it.  Only
        when the report's timestamp is of the kind the tail sees in that partition: a broker that
        stamps LogAppendTime but does not return it in its produce response (seen in Redpanda) would
        give a different record time.  Returns True if folded.
        """
        kind, stamp = timestamp
        with self._lock:
            if (
                not self.fast_verdicts
                or self._next_offset[partition] != offset
                or self._timestamp_kinds[partition] != kind
            ):
                return False
            at = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None
            self._fold_value(partition, offset, value, at)
            self._folded_early[(partition, offset)] = at
            self.early_folds += 1
            if len(self._folded_early) > _MAX_UNCLAIMED_VERDICTS:  # cannot happen while the tail reads
                del self._folded_early[next(iter(self._folded_early))]
            self._lock.notify_all()
            return True

    def notify_own_folds(self) -> None:
        """Wake whoever waits on own_folds: a delivery report came, a verdict may now be complete."""
        if self._own_folds_watched:
            _wake(self._own_folds_w)

    def watch_own_folds(self) -> socket.socket:
        """``own_folds``, woken from now on whenever a record of ours is folded or a delivery report came."""
        self._own_folds_watched = True
        return self.own_folds

    def _check_folded_early(self, partition: int, offset: int, at: int | None) -> None:
        """The tail reached a record fold_delivered folded: it must have folded it at the same time."""
        used = self._folded_early.pop((partition, offset), at)
        if used != at:
            self.fast_verdicts = False
            log.error(
                "coordination log %s[%d]@%d: the delivery report gave record time %s, the log %s: this member's "
                "state may differ from the others' for this record; verdicts now always wait for the log",
                self.topic,
                partition,
                offset,
                used,
                at,
            )

    # -------------------------------------------------------------- reading

    def read(self, query: Callable[[WorldState], T]) -> T:
        """Run ``query`` on the state under the lock (keep it short)."""
        with self._lock:
            return query(self._state)

    def read_folded(self, query: Callable[[WorldState, Sequence[int]], T]) -> T:
        """Run ``query`` on the state and the offsets it is folded up to, per partition, under the lock."""
        with self._lock:
            return query(self._state, self._next_offset)

    def snapshot(self) -> WorldState:
        return self.read(WorldState.snapshot)

    def checkpoint(self, partition: int, common: dict[str, object]) -> list[codec.Checkpoint]:
        """The checkpoint records of a partition: the state as folded, and the offset it is folded to."""
        with self._lock:
            return checkpoints.state_records(self._state, partition, self._next_offset[partition], common)

    def caught_up(self) -> bool:
        """Has every partition been read up to its end as reading began (or reported its end)?"""
        return self._ends.all_read()

    def wait_caught_up(self, stall_timeout: float, should_stop: ShouldStop = never) -> None:
        """Block until every partition was read up to its end as reading began; give up after ``stall_timeout``
        without progress, or (StopRequested) as soon as ``should_stop`` says so."""
        with self._lock:
            last_progress, folded = time.monotonic(), sum(self._next_offset)
            while not self._ends.all_read():
                self._lock.wait(0.1)
                check_stop(should_stop)
                if sum(self._next_offset) != folded:
                    last_progress, folded = time.monotonic(), sum(self._next_offset)
                elif time.monotonic() - last_progress > stall_timeout:
                    raise KafkaUnavailable(
                        f"could not read the coordination topic {self.topic} at {self.settings.brokers} "
                        f"(no progress for {stall_timeout:g}s)"
                    )

    @property
    def fetch_stalls(self) -> int:
        """Times the tail found the broker answering without records while the log went on (guarded_consumer.py)."""
        return self._consumer.stalls

    def records_read(self) -> int:
        """Records folded (or skipped as garbage) since reading began: a bounded number when it began at checkpoints."""
        with self._lock:
            return sum(end - start for end, start in zip(self._next_offset, self.started_at))

    def take_verdict(self, partition: int, offset: int) -> bool | None:
        """The verdict of our record at (partition, offset) if it is folded already, else None."""
        with self._lock:
            return self._verdicts.pop((partition, offset), None)

    def wait_verdict(self, partition: int, offset: int, deadline: float) -> bool | None:
        """The verdict of the record at (partition, offset), or None if it was not folded by ``deadline``."""
        key = (partition, offset)
        with self._lock:
            while key not in self._verdicts:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(min(remaining, 0.1))
            return self._verdicts.pop(key)


def reader_purpose(tail: bool) -> str:
    """What a CoordinationLog's reader is for, as its log lines and throwaway group name say."""
    return "tail" if tail else "one-shot read"


def read_group_state(settings: Settings, group: str) -> WorldState:
    """The group's world state as of now, read from the latest checkpoints on (read-only).

    A coordination topic that does not exist yet is an empty log: it is not created here.  The reader asks for the
    cluster's metadata itself: no admin client, and one round trip fewer before it lists the log's bounds.
    """
    consumer = log_consumer(settings, group, reader_purpose(tail=False))
    try:
        count = topic_partition_count(consumer, settings, settings.coordination_topic)
    except BaseException:
        consumer.close()
        raise
    if count is None:
        consumer.close()
        return WorldState(group, settings.heartbeat_ms, None)
    reader = CoordinationLog(settings, group, count, tail=False, consumer=consumer).start()
    try:
        reader.wait_caught_up(stall_timeout=settings.connect_timeout)
        log.debug(
            "group %s: read %d records of %s, %s",
            group,
            reader.records_read(),
            settings.coordination_topic,
            reader.describe_starts(),
        )
        return reader.snapshot()
    finally:
        reader.close()


def wakeup_pair() -> tuple[socket.socket, socket.socket]:
    """A non-blocking (read end, write end) pair: a byte written wakes whoever waits on the read end."""
    read_end, write_end = socket.socketpair()
    for end in (read_end, write_end):
        end.setblocking(False)
    return read_end, write_end


def _wake(sock: socket.socket) -> None:
    """Make the other end readable; if it already is, one wake-up is enough."""
    try:
        sock.send(b"!")
    except (BlockingIOError, OSError):
        pass


def drain(sock: socket.socket) -> None:
    """Read every wake-up byte waiting on a socket."""
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, OSError):
        pass
