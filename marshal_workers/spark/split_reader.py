"""Reading one split in a Spark task: its own consumer, assign() at the start, stop at the planned end.

Runs on executors; it needs no pyspark.  The consumer is created inside the
task (Kafka clients cannot be pickled) and closed when the split is done.  It
never joins a group and never commits: a throwaway group id, no auto commit,
so reading history changes nobody's position.  The end is the plan's, never
the broker's answer at read time: a split is the same records every time it
is read, which is what makes a retried task at-least-once and no more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from confluent_kafka import Consumer, KafkaError, TopicPartition

from marshal_workers.core.config import Settings
from marshal_workers.kafka import client_profiles
from marshal_workers.spark.planner import Split

_CONSUME_WAIT_S = 0.5


class SplitReadError(RuntimeError):
    """A split could not be read to its end (the broker is gone, or the log no longer reaches the planned end)."""


class SplitReader:
    """The records of one split, in offset order, in batches:

    with SplitReader(settings, split) as reader:
        for records in reader.batches(500):
            ...
    """

    def __init__(self, settings: Settings, split: Split, stall_timeout: float | None = None) -> None:
        self.settings = settings
        self.split = split
        # A broker that says nothing for this long is an error, not a slow split.
        self.stall_timeout = 3 * settings.connect_timeout if stall_timeout is None else stall_timeout
        self.next_offset = split.start  # the offset after the last record handed out (or gone from the log)
        self._consumer: Consumer | None = None

    def __enter__(self) -> Self:
        self._consumer = Consumer(client_profiles.split_reader(self.settings))
        self._consumer.assign([TopicPartition(self.split.topic, self.split.partition, self.split.start)])
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def batches(self, most: int) -> Iterator[list[Any]]:
        """Lists of at most ``most`` records (confluent_kafka Messages) until the split's end."""
        assert self._consumer is not None, "use SplitReader as a context manager"
        consume, end = self._consumer.consume, self.split.end
        last_progress = time.monotonic()
        while self.next_offset < end:
            # Never ask for more than is left: consume() waits its whole timeout for a count that cannot come.
            records = consume(min(most, end - self.next_offset), _CONSUME_WAIT_S)
            batch = self._keep(records)
            if batch:
                last_progress = time.monotonic()
                yield batch
            elif self.next_offset < end and time.monotonic() - last_progress > self.stall_timeout:
                raise SplitReadError(
                    f"reading {self.split} from {self.settings.brokers}: no record after offset "
                    f"{self.next_offset - 1} for {self.stall_timeout:g}s (the broker is unreachable, or the log "
                    "no longer reaches the planned end)"
                )

    def _keep(self, records: list[Any]) -> list[Any]:
        """The split's records among those fetched; moves ``next_offset``, also past an end the log confirms."""
        end = self.split.end
        kept = []
        for record in records:
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if record.offset() >= end:  # the log ends at or past the plan: the last offsets were not records
                        self.next_offset = end
                elif error.fatal():
                    raise SplitReadError(f"reading {self.split} from {self.settings.brokers}: {error}")
                continue
            offset = record.offset()
            if offset >= end:
                self.next_offset = end  # past the plan (offsets before it were compacted away or control records)
                break
            if offset >= self.next_offset:
                kept.append(record)
                self.next_offset = offset + 1
        return kept
