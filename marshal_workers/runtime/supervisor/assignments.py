"""What a supervisor holds: whole partitions (Assignment), its phase, and the Table its components share.

The Table is handed to each component of the supervisor (component.py): the
claims (partition_claims.py, message_claims.py), the worker pool
(worker_pool.py), remote control (remote_control.py) and the loop
(supervisor.py).  Leased ranges of shared partitions are the shared pool's
(shared_pool.py).
"""

from __future__ import annotations

import collections
import enum
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from marshal_workers.observe.metrics import PartitionStats
from marshal_workers.protocol.health import CallInFlight, PartitionHealth, watch_call
from marshal_workers.runtime.channel import Field, Slot, monotonic_ms

Key = tuple[str, int]


class Phase(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # graceful: workers finish what they hold, then we release
    STOPPED = "stopped"


@dataclass
class Assignment:
    """A partition we own, and its worker."""

    topic: str
    partition: int
    slot: Slot
    process: BaseProcess | None = None
    connection: Connection | None = None
    started_offset: int = 0
    claimed_end: int = -1  # AMO: end of the last batch claim accepted; a restart never starts before it
    crashes_in_a_row: int = 0
    restart_at: float | None = None  # monotonic time of a pending restart
    lost: bool = False  # someone else owns it now: stop the worker, release nothing
    unhealthy: bool = False  # its worker cannot keep up: stop it and release the partition as sick
    handing_over: bool = False  # balance="fair": we hold more than our share; stop it and release it
    ordered: str | None = None  # handed over on an operator's order (remote_control.py): drain, pause, release
    timed_out: tuple[int, int] | None = None  # messages [start, end) whose call the hard time limit is killing
    last_killed: tuple[int, int] | None = None  # the messages of the previous kill
    time_limit_kills: int = 0  # kills in a row on those same messages
    give_up_on: tuple[int, int] | None = None  # for the next worker: apply on_error to these, don't call
    give_up_reason: str = "time_limit"  # why: "time_limit" or "worker_lost" (a poison message)
    restart_reason: str = "crash"  # why the pending restart (the worker_restarts metric's label)
    claimed_at: float = field(default_factory=time.monotonic)
    health: PartitionHealth = field(default_factory=PartitionHealth)
    call: CallInFlight | None = None  # its worker's handler call in flight, as last seen (health.watch_call)

    @property
    def key(self) -> Key:
        return (self.topic, self.partition)

    @property
    def calls_in_flight(self) -> int:
        """Handler calls running in its worker: the lanes' count, or the one call of a one-at-a-time worker."""
        return max(self.slot.get(Field.IN_FLIGHT), 0 if self.call is None else 1)

    def call_age(self, now: float) -> float | None:
        """Seconds its worker's call in flight (with concurrency, the oldest) has been running; None: no call."""
        call = self.call
        return None if call is None else call.age(now)

    @property
    def next_offset(self) -> int:
        return self.slot.get(Field.NEXT_OFFSET)

    @property
    def high_watermark(self) -> int | None:
        """The partition's end as its worker's last fetch saw it; None before the first fetch."""
        high = self.slot.get(Field.HIGH_WATERMARK)
        return None if high < 0 else high

    @property
    def lag(self) -> int | None:
        high = self.high_watermark
        return None if high is None else max(high - self.next_offset, 0)

    def state(self, now: float) -> dict[str, Any]:
        """For the state document (SIGUSR1, /state)."""
        call_age = self.call_age(now)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "worker_pid": None if self.process is None else self.process.pid,
            "next_offset": self.next_offset,
            "high_watermark": self.high_watermark,
            "lag": self.lag,
            "processed": self.slot.get(Field.PROCESSED),
            "dead_lettered": self.slot.get(Field.DEAD_LETTERED),
            "in_flight": self.calls_in_flight,
            "call_age_s": None if call_age is None else round(call_age, 3),
            "window_used": self.slot.get(Field.WINDOW_USED),
            "lease_left_s": round((self.slot.get(Field.LEASE_UNTIL_MS) - monotonic_ms()) / 1000, 3),
            "crashes_in_a_row": self.crashes_in_a_row,
            "claimed_end": self.claimed_end,
            "lost": self.lost,
            "unhealthy": self.unhealthy,
            "handing_over": self.handing_over,
        }

    def stats(self, now: float) -> PartitionStats:
        """For the metrics endpoint."""
        return PartitionStats(
            topic=self.topic,
            partition=self.partition,
            next_offset=self.next_offset,
            high_watermark=self.high_watermark,
            lag=self.lag,
            messages_per_second=self.health.consume_rate,
            handled=self.slot.get(Field.PROCESSED),
            dead_lettered=self.slot.get(Field.DEAD_LETTERED),
            in_flight=self.calls_in_flight,
            call_age_s=self.call_age(now) or 0.0,
            window_used=self.slot.get(Field.WINDOW_USED),
            fetch_stalls=self.slot.get(Field.FETCH_STALLS),
            latency_counts=self.slot.latency_counts(),
            latency_sum_s=self.slot.get(Field.LATENCY_SUM_NS) / 1e9,
        )

    def ask_worker_to_stop(self) -> None:
        """Ask its worker to finish the message or batch in hand and exit: the flag first, then the signal.

        A worker forked a moment ago still ignores SIGTERM (inherited from the fork server) until it
        installs its handler; it reads the flag right after doing so, so the request is never lost.
        """
        self.slot.set(Field.STOP_REQUESTED, 1)
        signal_process(self.process, signal.SIGTERM)

    def signal_worker(self, signum: int) -> None:
        signal_process(self.process, signum)

    def watch_call(self, now: float) -> None:
        """Note its worker's handler call in flight, and when it was first seen if the worker does not say when
        it began (a few reads of shared memory)."""
        slot = self.slot
        if self.process is None:
            self.call = None
            return
        self.call = watch_call(
            self.call, slot.get(Field.CALL_STARTED_MS), slot.get(Field.HANDLING_END), slot.get(Field.NEXT_OFFSET), now
        )

    @property
    def lease_until_ms(self) -> int:
        """Its worker handles nothing at or after this (monotonic_ms): the lease the member core keeps
        (member/partition_holding.py ``extend_lease``), in the slot for the worker to read."""
        return self.slot.get(Field.LEASE_UNTIL_MS)

    @lease_until_ms.setter
    def lease_until_ms(self, value: int) -> None:
        self.slot.set(Field.LEASE_UNTIL_MS, value)


def signal_process(process: BaseProcess | None, signum: int) -> None:
    """Send a signal to a worker process, if it is (still) there."""
    if process is not None and process.pid is not None:
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            pass


MessageClaim = tuple[Assignment, Connection | None, int]  # who asked (which worker's pipe), for what end offset


@dataclass
class Table:
    """What the supervisor's components share, one object handed to each (they hold no state of one another).

    Written by: the claims (assignments won, released, lost: the member core keeps them), the worker pool (workers
    started from ``to_start``), the topic watch (``partition_counts``), the loop (``phase``, ``stop_signalled``,
    ``ready``).
    """

    assignments: dict[Key, Assignment] = field(default_factory=dict)
    phase: Phase = Phase.RUNNING
    stop_signalled: bool = False  # SIGTERM/SIGINT/SIGHUP received, perhaps not handled yet: fork nothing more
    ready: set[object] = field(default_factory=set)  # what the loop's last wait found readable: pipes, sentinels
    to_start: collections.deque[Assignment] = field(default_factory=collections.deque)  # claimed, no worker yet
    partition_counts: dict[str, int] = field(default_factory=dict)  # topics whose partitions are claimed whole
    shared_partition_counts: dict[str, int] = field(default_factory=dict)  # shared handlers' topics (shared_pool)

    @property
    def running(self) -> bool:
        return self.phase is Phase.RUNNING

    def holds(self, assignment: Assignment) -> bool:
        """Is this assignment (not a later one of the same partition) still in the table?"""
        return self.assignments.get(assignment.key) is assignment
