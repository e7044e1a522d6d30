"""Readers that never sit stuck behind a broker that answers every fetch without records, nor skip a record.

The embedded broker (Tansu, memory storage) stores every produced batch as an object of its own, never
deleted, and on every fetch lists all of a partition's batch objects, oldest first, within the time the
fetch may wait (``fetch.wait.max.ms``).  Once a partition holds more batches than that wait can list
(about 0.5 microseconds a batch on a 2-core machine: some 10,000 batches at a 5 ms wait), the listing
stops short of the reader's offset and the answer is empty, with the high watermark far ahead, on every
fetch from then on: the reader is stuck for good, and so is every partition fetched in the same request.
docs/brokers.md says how it was found and how to reproduce it.

A longer wait gets through (a fetch that finds records answers as soon as it has them, and the longer the
wait the more records it brings: reading 20,000 records of a 22,000-batch partition took 6.9 s at a 20 ms
wait and 0.2 s at 100 ms), but costs latency to a reader at the end (Tansu looks for new records again only
after half of the remaining wait).  So a reader that first reads up to ends it knows (``catch_up``: a
checkpoint search, ``status``, ``log``, a starting member's first read) reads with a catch-up wait fitted to
the longest partition it lists (``catch_up_wait_ms``) and stops at those ends without waiting for an empty
fetch; ``begin_tail()`` then gives it the short wait a tail needs.  A tail, or any reader, that meets the fault
anyway is lengthened by ``GuardedConsumer`` when, and only when, it sees it: its polls come back empty for
``stall_after`` seconds while an assigned partition's high watermark (from the last fetch response) is ahead of
its position, and the broker answers a ListOffsets request (so it is not merely down or frozen).  It then
replaces its consumer by one with a 4 times longer wait, at the same positions.  On Apache Kafka, which answers a
waiting fetch as soon as records arrive, this never happens, and would cost nothing if it did.

The same broker gives a batch its offsets before it stores it: while two producers write to one partition,
a fetch can find the later batch stored and not yet the earlier one, and a reader that takes what it is
given skips the earlier record for good.  A reader of a log with no gaps (the coordination topic: no
transactions, no compaction) is ``contiguous``: a record past the offset it expects sends it back to
read from that offset again (``Contiguity``), and only a gap that is still there after a few re-reads is
taken as a real one, and logged.  A reader of a data topic is contiguous only on a broker known to skip
(``SKIPPING_CLUSTER_IDS``): on Kafka, transaction markers and compaction leave real gaps, which it must
not read again and again.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, KafkaException, Message, TopicPartition

log = logging.getLogger(__name__)

WAIT_GROWTH = 4  # each stall multiplies the fetch wait by this
MAX_WAIT_MS = 2000  # the longest fetch wait a guard sets; a broker slower than that is reported, not waited for
# The waits of a reader while it reads up to ends it knows, rungs of the guard's ladder (5, 20, 80, 320 ms).  The
# long one lets the embedded broker list some 450,000 batches of a partition and still bring records.  But a fetch
# of a partition that is being written can take the whole wait (the broker answers once a listing finds nothing
# new, docs/brokers.md), so a partition short enough for the short one gets it: a restart on a 30,000-record log
# written 300 times a second took 0.77 s against 1.14 s (medians, bench_long_log.py, one core busy).  On Kafka
# neither costs anything: a fetch that finds records answers at once, and the reader stops at the end it knows.
SHORT_CATCH_UP_WAIT_MS = 80
CATCH_UP_WAIT_MS = 320
# A partition's records bound its batches; the broker lists one in about 0.7 us on an idle 2-core machine, and in
# over 0.8 us with a core busy (100,000 of them stalled an 80 ms wait there).  So: 2 us, a margin of 2.5 on that;
# the short wait is for partitions of up to 40,000 records.
LISTING_NS_PER_RECORD = 2000
PROBE_TIMEOUT_S = 1.0  # how long the liveness probe (ListOffsets) may take before the broker counts as down


@dataclass
class StallWatch:
    """When a reader has returned nothing for long enough to look at why.  Pure: the caller gives ``now``.

    The reader adds 1 to ``reads`` for each non-empty poll (the hot path: one integer add); the clock is
    read only on empty ones.
    """

    stall_after_s: float
    reads: int = 0  # non-empty polls so far
    _reads_seen: int = -1
    _idle_since: float = 0.0

    def empty(self, now: float) -> bool:
        """An empty poll at ``now``: True when nothing came back for ``stall_after_s``."""
        if self.reads != self._reads_seen:
            self._reads_seen, self._idle_since = self.reads, now
            return False
        return now - self._idle_since >= self.stall_after_s

    def restart(self, now: float) -> None:
        """Looked (or replaced the consumer): wait a whole ``stall_after_s`` again before the next look."""
        self._reads_seen, self._idle_since = self.reads, now

    def idle_for(self, now: float) -> float:
        """Seconds since the last non-empty poll (or the last restart), as of the last empty poll's look."""
        return now - self._idle_since


class Gap(enum.Enum):
    """What a contiguous reader does with a record (Contiguity.check)."""

    NEXT = "next"  # the offset it expected: take it
    OLD = "old"  # below it: returned already (before a re-read), drop it
    REREAD = "reread"  # past it: the expected record is missing; read again from the expected offset
    ACCEPTED = "accepted"  # past it, still after REREADS re-reads and REREAD_FOR_S: a real gap, take it


# How long a contiguous reader goes on reading a partition again for one missing offset before it takes the gap as
# real: at least REREADS times, and for at least REREAD_FOR_S.  A count alone was not enough: on a loaded machine
# the embedded broker stored a batch after 3 immediate re-reads had passed it by (a CI run skipped 4 records).
REREADS = 3
REREAD_FOR_S = 1.0
EMBEDDED_CLUSTER_ID = "marshal-workers-embedded"  # the embedded broker's (embedded_broker.py)
# Brokers known to let a reader skip a record written concurrently with a later one: Tansu on object storage
# (memory, S3), as the embedded broker runs, or as a Tansu started by hand names itself by default.
SKIPPING_CLUSTER_IDS = frozenset({EMBEDDED_CLUSTER_ID, "tansu_cluster"})


@dataclass
class Contiguity:
    """Per partition, the offset a reader expects next, and for a missing one how often it re-read and since when.
    Pure: the caller gives ``now``."""

    expected: dict[tuple[str, int], int] = field(default_factory=dict)
    _rereads: dict[tuple[tuple[str, int], int], tuple[int, float]] = field(default_factory=dict)

    def place(self, key: tuple[str, int], offset: int) -> None:
        """The reader was placed (assign, seek) at ``offset``; a logical offset (< 0) expects whatever comes."""
        if offset >= 0:
            self.expected[key] = offset
        else:
            self.expected.pop(key, None)

    def check(self, key: tuple[str, int], offset: int, now: float) -> Gap:
        expected = self.expected.get(key)
        if expected is None or offset == expected:
            self.expected[key] = offset + 1
            if self._rereads:
                self._rereads.pop((key, expected), None)  # type: ignore[arg-type]
            return Gap.NEXT
        if offset < expected:
            return Gap.OLD
        tried, since = self._rereads.get((key, expected), (0, now))
        if tried < REREADS or now - since < REREAD_FOR_S:
            self._rereads[(key, expected)] = (tried + 1, since)
            return Gap.REREAD
        del self._rereads[(key, expected)]
        self.expected[key] = offset + 1
        return Gap.ACCEPTED


def behind(positions: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The partitions whose known end is past the reader's position: {partition: records behind}."""
    return {key: ends[key] - at for key, at in positions.items() if key in ends and ends[key] > at >= 0}


def raised_wait(wait_ms: int) -> int:
    """The next fetch wait after a stall: WAIT_GROWTH times longer, at most MAX_WAIT_MS."""
    return min(MAX_WAIT_MS, max(wait_ms, 1) * WAIT_GROWTH)


def catch_up_wait_ms(records: int) -> int:
    """The catch-up wait for a reader whose longest partition holds ``records`` records: the short one where the
    embedded broker lists that many batches well within it, else the long one."""
    fits = records * LISTING_NS_PER_RECORD <= SHORT_CATCH_UP_WAIT_MS * 1_000_000
    return SHORT_CATCH_UP_WAIT_MS if fits else CATCH_UP_WAIT_MS


def stall_after(heartbeat_s: float, wait_ms: int) -> float:
    """How long a reader that is behind may get nothing before it is looked at: half a heartbeat (so that it
    recovers within one), and never less than 3 fetch waits (a fetch may legitimately take its whole wait)."""
    return max(heartbeat_s / 2, 3 * wait_ms / 1000)


@dataclass
class _Position:
    """Where a partition was last placed (assign or seek), and how many reads had happened then."""

    offset: int
    reads: int


class GuardedConsumer:
    """A confluent-kafka Consumer (assign() only) that replaces itself with a longer fetch wait when the broker
    answers its fetches without records while the end is ahead.  Offers the Consumer methods the package uses.

    ``what`` names the reader in log lines (e.g. "group G's coordination log reader (tail) on __marshal");
    ``stalls`` counts replacements, and ``on_stall`` (if given) hears the new count after each.  ``catch_up``: the
    reader first reads up to ends it knows, with SHORT_CATCH_UP_WAIT_MS, or CATCH_UP_WAIT_MS once the bounds it
    lists show a partition too long for that (``listed_watermarks``, ``fit_catch_up_wait``; the configured wait, if
    longer), until ``begin_tail()`` gives it the configured one.
    """

    def __init__(
        self,
        config: dict[str, Any],
        what: str,
        heartbeat_s: float,
        on_stall: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        contiguous: bool = False,
        catch_up: bool = False,
    ) -> None:
        self._config = dict(config)
        self.tail_wait_ms = int(self._config.get("fetch.wait.max.ms", 500))
        self.wait_ms = max(self.tail_wait_ms, SHORT_CATCH_UP_WAIT_MS) if catch_up else self.tail_wait_ms
        self.catching_up = catch_up
        self._catch_up_wait_ms = self.wait_ms  # what begin_tail() leaves: a longer wait is the guard's
        # Partitions read up to the end the reader knew, no longer fetched while it catches up (read_up_to_end).
        self._caught_up: set[tuple[str, int]] = set()
        self._config["fetch.wait.max.ms"] = self.wait_ms
        self.what = what
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._on_stall = on_stall
        self._consumer = Consumer(self._config)
        self._watch = StallWatch(stall_after(heartbeat_s, self.wait_ms))
        self._placed: dict[tuple[str, int], _Position] = {}
        self.stalls = 0
        self._contiguity = Contiguity() if contiguous else None
        self.rereads = 0  # times a missing record sent it back (contiguous readers)

    # ----------------------------------------------------------- reading

    def poll(self, timeout: float) -> Message | None:
        message = self._consumer.poll(timeout)
        if message is not None:
            self._watch.reads += 1
            if self._contiguity is not None:
                kept = self._admit([message])
                return kept[0] if kept else None
        elif self._watch.empty(self._clock()):
            self._look()
        return message

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        messages = self._consumer.consume(num_messages, timeout)
        if messages:
            self._watch.reads += 1
            if self._contiguity is not None:
                return self._admit(messages)
        elif self._watch.empty(self._clock()):
            self._look()
        return messages

    @property
    def contiguous(self) -> bool:
        return self._contiguity is not None

    def read_without_gaps_if_the_broker_skips(self, timeout: float) -> None:
        """Read as a contiguous reader does on a broker known to skip records (SKIPPING_CLUSTER_IDS); elsewhere as
        it is.  One metadata request: call it once, when the reader starts."""
        if self._contiguity is not None:
            return
        try:
            cluster = self._consumer.list_topics(timeout=timeout).cluster_id
        except KafkaException:
            return  # not known: read as it is (the worker's first fetch will say more about the broker)
        if cluster in SKIPPING_CLUSTER_IDS:
            self._contiguity = Contiguity()
            for key, placed in self._placed.items():
                self._contiguity.place(key, placed.offset)

    def _admit(self, messages: list[Message]) -> list[Message]:
        """A contiguous reader's records: in offset order per partition with none missing.  At a missing one the
        partition is read again from it, and what came after it in this batch is dropped (it comes again)."""
        assert self._contiguity is not None
        if len(self._placed) == 1 and self._in_order(messages):
            return messages  # one partition, the offsets it expected, none missing: the common case, O(1)
        kept: list[Message] = []
        again: set[tuple[str, int]] = set()
        for message in messages:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if (topic, partition) in again:
                continue
            if message.error() is not None:
                kept.append(message)
                continue
            assert topic is not None and partition is not None and offset is not None  # a record: it has all three
            key = (topic, partition)
            verdict = self._contiguity.check(key, offset, self._clock())
            if verdict is Gap.NEXT:
                kept.append(message)
            elif verdict is Gap.REREAD and self._read_again(key):
                again.add(key)
            elif verdict is not Gap.OLD:  # ACCEPTED, or a re-read the consumer refused
                log.warning(
                    "%s: %s[%d] has no record before offset %d from %d on, after %d re-reads in %gs at least: going on "
                    "past the gap",
                    self.what,
                    topic,
                    partition,
                    offset,
                    self._contiguity.expected[key] - 1,
                    REREADS,
                    REREAD_FOR_S,
                )
                kept.append(message)
        return kept

    def _in_order(self, messages: list[Message]) -> bool:
        """A batch of a one-partition reader that starts at the offset it expects and has no gap (checked at its
        ends only), which it then expects to go on after."""
        assert self._contiguity is not None
        first, last = messages[0], messages[-1]
        if first.error() is not None or last.error() is not None:
            return False
        topic, partition, start, end = first.topic(), first.partition(), first.offset(), last.offset()
        assert topic is not None and partition is not None and start is not None and end is not None  # records
        key = (topic, partition)
        expected = self._contiguity.expected.get(key)
        if (expected is not None and start != expected) or end - start + 1 != len(messages):
            return False
        self._contiguity.check(key, start, self._clock())  # takes the first and forgets any re-read of it
        self._contiguity.expected[key] = end + 1
        return True

    def _read_again(self, key: tuple[str, int]) -> bool:
        assert self._contiguity is not None
        offset = self._contiguity.expected[key]
        try:
            self._consumer.seek(TopicPartition(key[0], key[1], offset))
        except KafkaException as exc:
            log.debug("%s: cannot read %s[%d] again from %d: %s", self.what, key[0], key[1], offset, exc)
            return False
        self._placed[key] = _Position(offset, self._watch.reads)
        self.rereads += 1
        return True

    # ---------------------------------------------------- placing the reader

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        if self._resume_caught_up():
            # librdkafka keeps a partition paused across assignments; resumed and then assigned again, it was not
            # fetched for over a second here: resumed, then dropped, it is fetched at once.
            self._consumer.unassign()
        self._consumer.assign(list(partitions))  # librdkafka's binding takes a list, no other sequence
        self._placed = {(tp.topic, tp.partition): _Position(tp.offset, self._watch.reads) for tp in partitions}
        if self._contiguity is not None:
            self._contiguity = Contiguity()
            for tp in partitions:
                self._contiguity.place((tp.topic, tp.partition), tp.offset)
        self._watch.restart(self._clock())

    def unassign(self) -> None:
        self._resume_caught_up()
        self._consumer.unassign()
        self._placed = {}
        if self._contiguity is not None:
            self._contiguity = Contiguity()

    def seek(self, partition: TopicPartition) -> None:
        self._consumer.seek(partition)
        key = (partition.topic, partition.partition)
        self._placed[key] = _Position(partition.offset, self._watch.reads)
        if self._contiguity is not None:
            self._contiguity.place(key, partition.offset)

    def read_up_to_end(self, topic: str, partition: int) -> None:
        """While catching up: this partition was read up to the end the reader knew; fetch it no more until
        ``begin_tail()``.  A fetch of partitions that are all at their end is held by the embedded broker for the
        whole (long) wait, and librdkafka sends the next fetch only after it: the partitions still behind (whose
        fetched records are still queued, so not in that fetch) would wait for it."""
        if self.catching_up:
            self._caught_up.add((topic, partition))
            self._consumer.pause([TopicPartition(topic, partition)])

    def begin_tail(self) -> None:
        """The reader has read up to the ends it knew and goes on tailing: from here on its fetches wait the
        configured (short) time, so a new record is seen within it, and every partition is fetched again.  Its
        consumer is replaced at the same positions; a no-op for a reader that was not catching up (and only a
        resume for one whose guard lengthened the wait past the catch-up one: the short wait is known to stall)."""
        if not self.catching_up:
            return
        self.catching_up = False
        if not self.tail_wait_ms < self.wait_ms == self._catch_up_wait_ms:
            self._resume_caught_up()
            return
        self._caught_up = set()  # the new consumer fetches every partition
        log.debug("%s: read up to the ends it knew; tailing with fetches that wait %d ms", self.what, self.tail_wait_ms)
        self._swap(self.positions(), self.tail_wait_ms)

    def _resume_caught_up(self) -> bool:
        """Fetch again the partitions paused by read_up_to_end; True if there were any."""
        if not self._caught_up:
            return False
        self._consumer.resume([TopicPartition(topic, partition) for topic, partition in self._caught_up])
        self._caught_up = set()
        return True

    def fetched_end(self, topic: str, partition: int) -> int:
        """The partition's end as the last fetch response carried it (librdkafka's cached high watermark; no request),
        -1 before any came back.  Where ListOffsets lists less, this is the end (protocol/partition_end.py)."""
        marks = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        return -1 if marks is None else max(marks[1], -1)

    # ------------------------------------------------------ passed through

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> Any:
        if timeout is None:
            return self._consumer.get_watermark_offsets(partition, cached=cached)
        return self._consumer.get_watermark_offsets(partition, timeout=timeout, cached=cached)

    def listed_watermarks(
        self, topic: str, partitions: Sequence[int], timeout: float
    ) -> dict[int, tuple[int, int] | KafkaException]:
        """Each partition's (low, high) as ListOffsets answers them now, or why it did not.  Asked at once, a
        thread each (the client waits without the GIL): one round trip, where one after another cost as many as
        there are partitions (a start-up and ``status`` on a loaded machine paid them all)."""

        def listed(partition: int) -> tuple[int, int] | KafkaException:
            try:
                low, high = self.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
                return low, high
            except KafkaException as exc:
                return exc

        if len(partitions) <= 1:
            answers = {p: listed(p) for p in partitions}
        else:
            with ThreadPoolExecutor(max_workers=len(partitions), thread_name_prefix="list-offsets") as pool:
                answers = dict(zip(partitions, pool.map(listed, partitions), strict=True))
        self.fit_catch_up_wait([a for a in answers.values() if not isinstance(a, KafkaException)])
        return answers

    def fit_catch_up_wait(self, bounds: Sequence[tuple[int, int]]) -> None:
        """A catching-up reader that has listed its partitions' bounds takes the catch-up wait that lists the longest
        (catch_up_wait_ms): a longer one replaces its consumer, at the same positions.  Never a shorter one: a wait
        the guard lengthened is known to be needed."""
        if not self.catching_up or not bounds:
            return
        wanted = max(self.tail_wait_ms, catch_up_wait_ms(max(high - low for low, high in bounds)))
        if wanted > self.wait_ms:
            log.debug("%s: a partition is long: catching up with fetches that wait %d ms", self.what, wanted)
            self._catch_up_wait_ms = wanted
            self._swap(self.positions(), wanted)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._consumer.list_topics(*args, **kwargs)

    def offsets_for_times(self, *args: Any, **kwargs: Any) -> Any:
        return self._consumer.offsets_for_times(*args, **kwargs)

    def close(self) -> None:
        self._consumer.close()

    # ------------------------------------------------------------ the guard

    def positions(self) -> dict[tuple[str, int], int]:
        """Where this reader stands in each assigned partition: the offset after the last record it returned,
        or where it was placed if it returned none since.  A logical start (beginning, end) counts as -1."""
        keys = list(self._placed)
        reported = self._consumer.position([TopicPartition(topic, partition) for topic, partition in keys])
        found: dict[tuple[str, int], int] = {}
        for key, tp in zip(keys, reported):
            placed = self._placed[key]
            moved = tp.offset != OFFSET_INVALID and self._watch.reads > placed.reads
            found[key] = tp.offset if moved else placed.offset
        return found

    def _look(self) -> None:
        """Nothing came back for a while: if the broker answers while the end is ahead, wait longer."""
        now = self._clock()
        idle_s = self._watch.idle_for(now)
        self._watch.restart(now)
        positions = self.positions()
        marks = {key: self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True) for key in positions}
        # A reader placed at the beginning that has read nothing stands at the log's start.
        numeric = {key: max(marks[key][0], 0) if at == OFFSET_BEGINNING else at for key, at in positions.items()}
        lagging = behind(numeric, {key: high for key, (_, high) in marks.items()})
        if not lagging or not self._broker_answers(next(iter(lagging))):
            return
        if self.wait_ms >= MAX_WAIT_MS:
            log.error(
                "%s: got no record for %.1fs while %s, although the broker answers; its fetches already wait %d ms: "
                "this is the embedded broker's limit on a long partition (docs/brokers.md): restart it, or use Kafka",
                self.what,
                idle_s,
                _describe(lagging, numeric),
                self.wait_ms,
            )
            return
        self._replace(positions, numeric, raised_wait(self.wait_ms), lagging, idle_s)

    def _broker_answers(self, key: tuple[str, int]) -> bool:
        try:
            self._consumer.get_watermark_offsets(TopicPartition(*key), timeout=PROBE_TIMEOUT_S, cached=False)
            return True
        except KafkaException:
            return False  # down or frozen: not the fault this guards against; the reader resumes on its own

    def _replace(
        self,
        positions: dict[tuple[str, int], int],
        numeric: dict[tuple[str, int], int],
        wait_ms: int,
        lagging: dict[tuple[str, int], int],
        idle_s: float,
    ) -> None:
        log.warning(
            "%s: got no record for %.1fs while %s, although the broker answers: reading on from the same offsets with "
            "fetches that wait up to %d ms instead of %d (the embedded broker's fault on long partitions, "
            "docs/brokers.md)",
            self.what,
            idle_s,
            _describe(lagging, numeric),
            wait_ms,
            self.wait_ms,
        )
        self._swap(positions, wait_ms)
        self.stalls += 1
        if self._on_stall is not None:
            self._on_stall(self.stalls)

    def _swap(self, positions: dict[tuple[str, int], int], wait_ms: int) -> None:
        """Go on with a new consumer whose fetches wait ``wait_ms``, from exactly ``positions``."""
        self._config["fetch.wait.max.ms"] = self.wait_ms = wait_ms
        old, self._consumer = self._consumer, Consumer(self._config)
        starts = [TopicPartition(topic, p, positions[(topic, p)]) for topic, p in self._placed]
        old.close()
        self._consumer.assign(starts)
        if self._caught_up:  # still catching up (a stall meanwhile): the new consumer leaves them alone too
            self._consumer.pause([TopicPartition(topic, partition) for topic, partition in self._caught_up])
        self._placed = {(tp.topic, tp.partition): _Position(tp.offset, self._watch.reads) for tp in starts}
        self._watch = StallWatch(stall_after(self._heartbeat_s, wait_ms), reads=self._watch.reads)
        self._watch.restart(self._clock())


def _describe(lagging: dict[tuple[str, int], int], positions: dict[tuple[str, int], int]) -> str:
    shown = [
        f"{topic}[{partition}] is {count} records past {positions[(topic, partition)]}"
        for (topic, partition), count in sorted(lagging.items())[:3]
    ]
    more = f" (and {len(lagging) - 3} more partitions)" if len(lagging) > 3 else ""
    return ", ".join(shown) + more
