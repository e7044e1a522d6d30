"""Where a reader of the coordination log starts, and what it learns of the log before that.

A reader of one group need not read the whole log: on each coordination partition it starts at the latest
complete checkpoint of its group, else at the latest one of any group whose directory does not list it (its
group had no record before), else at the beginning (checkpoints.Start, docs/protocol.md).  :func:`find_starts`
searches the log's last records for them, further back each time; :func:`begin_catching_up` places a reader
there, hands it the records the search read from there on (SearchedRecords), and says up to where it catches up
(catch_up.py); :func:`learn_groups_before` reads the group names
written before a start, for a reader whose start had no directory.  Every such reader is a
:func:`log_consumer`, as the tail of coordination_reader.py is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.core.stopping import ShouldStop, check_stop, never
from marshal_workers.errors import DecodeError, StopRequested
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.catch_up import KnownEnds, fetch_only_those_behind, listed_bounds, read_record
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.kafka_clients import take_fetched
from marshal_workers.protocol import checkpoints, codec

log = logging.getLogger(__name__)

_BATCH = 2000  # records taken per consume while reading spans


def log_consumer(settings: Settings, group: str, purpose: str, catch_up: bool = True) -> GuardedConsumer:
    """A reader of the coordination topic for ``group``: it first reads up to ends it knows with the catch-up's
    long fetch wait (``catch_up``), then (``begin_tail()``) gets each new record as soon as the broker has it; and
    it gets past the embedded broker's stalled fetches on a long log (guarded_consumer.py).  ``purpose`` names it
    in the log."""
    return GuardedConsumer(
        client_profiles.coordination_reader(settings, purpose),
        f"group {group}: coordination log reader ({purpose}) of {settings.coordination_topic}",
        settings.heartbeat_interval,
        contiguous=True,  # no transactions, no compaction: a gap is a record not read yet (guarded_consumer.py)
        catch_up=catch_up,
    )


@dataclass
class CatchingUp:
    """Where a catching-up reader starts and what it reads up to: ``starts`` (checkpoints.Start, per partition) to
    seed its state from, ``read_ahead`` the records from those starts that the checkpoint search had read already
    (per partition in offset order; the reader folds them first, and its consumer begins after them), and ``ends``
    (catch_up.py), which counts them read."""

    starts: list[checkpoints.Start]
    ends: KnownEnds
    read_ahead: list[Message]


def begin_catching_up(
    consumer: GuardedConsumer,
    settings: Settings,
    partition_count: int,
    group: str,
    from_beginning: bool,
    should_stop: ShouldStop = never,
    report: bool = False,
) -> CatchingUp:
    """Place a catching-up reader of ``group``'s coordination log (the tail of CoordinationLog, the ``log``
    command) where it starts on each partition (find_starts, or the beginning), and say up to where it reads
    (catch_up.py).  Each partition's bounds are listed once: a ListOffsets per partition, which the embedded broker
    answers by listing its batches, serves both the ends and the checkpoint search.  The records the search read
    from a start on are handed over (``read_ahead``), not fetched again: on a log written one record per batch a
    fetch costs the embedded broker a listing of the partition's batches, and a start-up read them twice."""
    topic = settings.coordination_topic
    bounds = listed_bounds(consumer, topic, partition_count, settings.connect_timeout)
    starts = [checkpoints.BEGINNING] * partition_count
    searched = SearchedRecords(partition_count)
    if not from_beginning:
        starts = find_starts(
            settings,
            topic,
            partition_count,
            group,
            should_stop=should_stop,
            report=report,
            bounds=bounds if all(high >= 0 for _, high in bounds) else None,
            searched=searched,
            consumer=consumer,  # connected already: no second client to start
        )
    ends = KnownEnds([high for _, high in bounds])
    positions = [_offset(s.offset, bounds[p][0]) for p, s in enumerate(starts)]
    read_ahead: list[Message] = []
    for partition, position in enumerate(positions):
        run = searched.run_from(partition, position)
        if run:
            last = run[-1].offset()
            assert last is not None  # a record: it has one
            ends.fetched_end(partition, searched.fetched_ends[partition])
            ends.read(partition, last)
            positions[partition] = last + 1
            read_ahead.extend(run)
    consumer.assign([TopicPartition(topic, p, position) for p, position in enumerate(positions)])
    fetch_only_those_behind(ends, consumer, topic)
    return CatchingUp(starts, ends, read_ahead)


def _offset(start: int | None, low: int) -> int:
    """Where to assign a reader that starts at ``start`` (None: the beginning) of a partition whose first offset is
    ``low`` (-1: not listed).  A number, where one is known: librdkafka looks a logical offset (OFFSET_BEGINNING)
    up first, and a partition paused while that look-up is in flight (fetch_only_those_behind pauses the empty
    ones) drops its answer and asks again only 500 ms later, when it is resumed to be tailed.  A supervisor on a
    new coordination topic read its own first claim that much later.  A start gone meanwhile (retention) is
    fetched from the earliest offset (``auto.offset.reset``)."""
    if start is not None:
        return start
    return low if low >= 0 else OFFSET_BEGINNING


# How many records before the end a reader first looks for a checkpoint; each next look goes 4 times as far (and
# reads only what the one before did not).  A checkpoint is written every checkpoint_interval (1 minute), or once
# checkpoints.CHECKPOINT_RECORDS records came after the last: twice that finds one in a busy partition too, while a
# further look costs a fetch round trip and reading 20,000 records first cost a status call about 0.3 s on the
# embedded broker (bench_long_log.py).
_FIRST_LOOK = 2 * checkpoints.CHECKPOINT_RECORDS
# Most records a checkpoint search keeps for the catch-up after it (SearchedRecords): a few megabytes.  A search
# that reads more (a long log without a checkpoint) keeps none, and the catch-up reads them again.
_MOST_KEPT = 50_000


class SearchedRecords:
    """The records a checkpoint search read, by partition and offset, and each partition's end as its fetches saw
    it: what the catch-up after the search need not fetch again (begin_catching_up)."""

    def __init__(self, partition_count: int, most: int = _MOST_KEPT) -> None:
        self._records: list[dict[int, Message]] = [{} for _ in range(partition_count)]
        # Per partition, the end as the fetch that brought its first record saw it (catch_up.py: the end read up to)
        self.fetched_ends = [-1] * partition_count
        self._most = most
        self._kept = 0
        self.full = False  # more than ``most`` were read: none is kept

    def add(self, partition: int, offset: int, message: Message) -> None:
        if self.full:
            return
        if offset not in self._records[partition]:
            self._kept += 1
        self._records[partition][offset] = message
        if self._kept > self._most:
            self.full = True
            self._records = [{} for _ in self._records]

    def run_from(self, partition: int, offset: int) -> list[Message]:
        """The records kept of ``partition`` from ``offset`` on, up to the first one not kept (none: [])."""
        kept = self._records[partition]
        run = []
        while offset in kept:
            run.append(kept[offset])
            offset += 1
        return run


def find_checkpoints(
    settings: Settings, topic: str, partition_count: int, group: str
) -> list[list[codec.Checkpoint] | None]:
    """The latest complete checkpoint of ``group`` on each coordination partition (None: it has none)."""
    starts = find_starts(settings, topic, partition_count, group, use_directories=False)
    return [start.checkpoint for start in starts]


def find_starts(
    settings: Settings,
    topic: str,
    partition_count: int,
    group: str,
    use_directories: bool = True,
    should_stop: ShouldStop = never,
    report: bool = False,
    bounds: Sequence[tuple[int, int]] | None = None,
    searched: SearchedRecords | None = None,
    consumer: GuardedConsumer | None = None,
) -> list[checkpoints.Start]:
    """Where a reader of ``group`` starts on each coordination partition (checkpoints.Start).

    Looks at the last records of every partition at once, then 4 times as far back each time where it found
    neither a complete checkpoint of ``group`` nor (``use_directories``) a complete checkpoint of
    another group whose directory does not list ``group``, so the cost is the records since the last checkpoint
    of any group.  (Offsets, not times: Tansu answers every "offset for a time" with the log start.)
    ``report``: say at INFO where the search goes further back.  StopRequested as soon as ``should_stop`` says so.
    ``bounds``: each partition's (start, end), if the caller listed them already.  ``searched``: keeps what was
    read, and the ends the first look's fetches saw.  ``consumer``: the reader that goes on from the starts found
    (it is placed there afterwards; an own one is made, and closed, without it).
    """
    starts = [checkpoints.BEGINNING] * partition_count
    made_here = consumer is None
    reader = log_consumer(settings, group, "checkpoint search") if consumer is None else consumer
    try:
        if bounds is None:
            answers = list(reader.listed_watermarks(topic, range(partition_count), settings.connect_timeout).values())
            failed = next((answer for answer in answers if isinstance(answer, KafkaException)), None)
            if failed is not None:
                raise failed  # below: no search, the whole log is read
            bounds = [answer for answer in answers if not isinstance(answer, KafkaException)]
        assemblers = [checkpoints.Assembler() for _ in range(partition_count)]
        finders = [checkpoints.DirectoryFinder(group) if use_directories else None for _ in range(partition_count)]
        looking = {p for p, (low, high) in enumerate(bounds) if high > low}  # an empty partition has none
        stops: dict[int, int | None] = {p: None for p in looking}  # None: to the end
        look = _FIRST_LOOK
        while looking:
            begins = {p: max(bounds[p][0], bounds[p][1] - look) for p in looking}
            spans = {p: (begins[p], stops[p]) for p in looking}
            _scan(reader, topic, group, spans, assemblers, finders, settings, should_stop, searched)
            for p in sorted(looking):
                low, high = bounds[p]
                own = assemblers[p].latest
                finder = finders[p]
                elsewhere = None if finder is None else finder.latest
                start = checkpoints.choose_start(
                    own if own is not None and own[0].as_of >= low else None,
                    elsewhere if elsewhere is not None and elsewhere[0] >= low else None,
                )
                if start.offset is not None:
                    starts[p] = start
                    looking.discard(p)
                elif begins[p] <= low:
                    looking.discard(p)  # read back to the start: no checkpoint
                else:
                    stops[p] = begins[p]
                    if report:
                        log.info(
                            "group %s: no checkpoint that tells where to start in the last %d records of %s[%d] "
                            "(of %d): looking further back",
                            group,
                            high - begins[p],
                            topic,
                            p,
                            high - low,
                        )
            look *= 4
        return starts
    except KafkaException as exc:
        log.warning("coordination log %s: cannot look for checkpoints (%s): reading it all", topic, exc)
        return [checkpoints.BEGINNING] * partition_count
    finally:
        if made_here:
            reader.close()


def _scan(
    consumer: GuardedConsumer,
    topic: str,
    group: str,
    spans: dict[int, tuple[int, int | None]],
    assemblers: list[checkpoints.Assembler],
    finders: list[checkpoints.DirectoryFinder | None],
    settings: Settings,
    should_stop: ShouldStop,
    searched: SearchedRecords | None = None,
) -> None:
    """Feed the checkpoints in [begin, stop) of each partition (stop None: to its end) to its assembler (the group's
    own) and its directory finder (other groups'); keep every record in ``searched``."""
    starts = {p: begin for p, (begin, _) in spans.items()}
    stops = {p: stop for p, (_, stop) in spans.items()}
    for message in _records_in_spans(consumer, topic, starts, stops, settings, should_stop, "looking for checkpoints"):
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None  # records only, no error events
        if searched is not None:
            if searched.fetched_ends[partition] < 0:  # its first record: the end its fetch saw, up to which it is read
                searched.fetched_ends[partition] = consumer.fetched_end(topic, partition)
            searched.add(partition, offset, message)
        value = message.value()
        if value is None or b'"checkpoint"' not in value:
            continue
        try:
            record = codec.decode(value)
        except DecodeError:
            continue
        # A checkpoint of this partition, describing the log before itself.
        if not isinstance(record, codec.Checkpoint) or record.source != partition or record.as_of > offset:
            continue
        if record.group == group:
            assemblers[partition].add(record)
        else:
            finder = finders[partition]
            if finder is not None:
                finder.add(record)


def learn_groups_before(
    consumer: GuardedConsumer, topic: str, stops: dict[int, int], settings: Settings, should_stop: ShouldStop = never
) -> dict[int, set[str]]:
    """The names of the groups with a record before offset ``stops[p]`` on each partition p of ``topic`` (every
    value that names a group, valid record or not: codec.group_named).  {} if ``should_stop`` said so first."""
    names: dict[int, set[str]] = {p: set() for p in stops}
    lows = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=settings.connect_timeout)[0] for p in stops
    }
    starts = {p: _offset(None, lows[p]) for p, stop in stops.items() if stop > lows[p]}
    full: set[int] = set()  # partitions with too many groups for a directory: no need to read on
    try:
        for message in _records_in_spans(
            consumer, topic, starts, dict(stops), settings, should_stop, "reading group names", skip=full
        ):
            partition = message.partition()
            assert partition is not None  # records only, no error events
            group = codec.group_named(message.value())
            if group is not None and group not in names[partition]:
                names[partition].add(group)
                if len(names[partition]) > codec.MAX_DIRECTORY:
                    full.add(partition)
    except StopRequested:
        return {}
    return names


def _records_in_spans(
    consumer: GuardedConsumer,
    topic: str,
    starts: dict[int, int],
    stops: dict[int, int | None],
    settings: Settings,
    should_stop: ShouldStop,
    doing: str,
    skip: set[int] | None = None,
) -> Iterator[Message]:
    """The records of each partition p from ``starts[p]`` up to ``stops[p]`` (None: to its end as the fetch that
    brought its first record saw it, never waiting for an empty fetch: catch_up.py), as they come.
    KafkaException when nothing comes for the connect timeout; StopRequested when ``should_stop`` says so.
    A partition added to ``skip`` meanwhile is read no further."""
    if not starts:
        return
    ends = KnownEnds([-1] * (max(starts) + 1))
    consumer.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
    reading = set(starts)
    last_progress = time.monotonic()
    while reading:
        check_stop(should_stop)
        batch = take_fetched(consumer, _BATCH, 0.1)
        if batch:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > settings.connect_timeout:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no progress while {doing}"))
        for message in batch:
            partition = message.partition()
            if partition is None:
                continue  # an error about no partition (the broker away): the timeout above judges the progress
            if skip and partition in skip:
                _done_with(partition, reading, consumer, topic)
            if partition not in reading:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    _done_with(partition, reading, consumer, topic)  # read to its end
                continue
            stop = stops[partition]
            offset = message.offset()
            assert offset is not None  # a record, not an error event
            if stop is not None and offset >= stop:
                _done_with(partition, reading, consumer, topic)
                continue
            yield message
            if stop is None:
                read_record(ends, consumer, topic, partition, offset)  # no longer fetched at its end
                if ends.at_end[partition]:
                    reading.discard(partition)
            elif offset + 1 >= stop:
                _done_with(partition, reading, consumer, topic)


def _done_with(partition: int, reading: set[int], consumer: GuardedConsumer, topic: str) -> None:
    """A span read: its partition is no longer fetched (GuardedConsumer.read_up_to_end says why)."""
    if partition in reading:
        reading.discard(partition)
        consumer.read_up_to_end(topic, partition)
