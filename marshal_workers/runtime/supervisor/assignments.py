"""What a supervisor holds: whole partitions (Assignment), its phase, its timers, and the state its parts share.

Shared by the supervisor's parts: the partition policy (partition_claims.py), the
worker pool (worker_pool.py) and the loop (supervisor.py).  Leased ranges of
shared partitions are the shared pool's (shared_pool.py).
"""

from __future__ import annotations

import collections
import enum
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from marshal_workers.protocol.health import CallInFlight, PartitionHealth
from marshal_workers.runtime.channel import Field, Slot

if TYPE_CHECKING:
    from marshal_workers.core.config import Settings
    from marshal_workers.handlers.app import App
    from marshal_workers.kafka.coordinator import Coordinator
    from marshal_workers.kafka.in_flight import InFlightWrites
    from marshal_workers.kafka.offsets import OffsetStore
    from marshal_workers.observe.metrics import Counters
    from marshal_workers.protocol.balance import BalanceState
    from marshal_workers.protocol.health import HealthPolicy
    from marshal_workers.protocol.restarts import RestartPolicy
    from marshal_workers.protocol.world_state import Owner

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


@dataclass
class Timers:
    """Monotonic times at which periodic work is next due."""

    heartbeat: float = 0.0
    claim: float = 0.0
    ask: float = 0.0  # the next time we may ask another member for a partition
    topics: float = 0.0
    checkpoint: float = 0.0
    stop_deadline: float | None = None


def signal_process(process: BaseProcess | None, signum: int) -> None:
    """Send a signal to a worker process, if it is (still) there."""
    if process is not None and process.pid is not None:
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            pass


MessageClaim = tuple[Assignment, Connection | None, int]  # who asked (which worker's pipe), for what end offset


class SupervisorState:
    """The state the supervisor's parts share (set in Supervisor.__init__), declared once for them."""

    app: App
    app_path: str
    settings: Settings
    log: Any
    hb_s: float
    assignments: dict[Key, Assignment]
    cooldown_until: dict[Key, float]
    partition_counts: dict[str, int]
    phase: Phase
    exit_code: int
    claiming: bool
    drained: bool  # an operator drained our client (remote_control.py): claim nothing
    timers: Timers
    counters: Counters
    restart_policy: RestartPolicy
    health_policies: dict[str, HealthPolicy]  # by topic: the handler's time limit judges its long calls
    time_limits: dict[str, tuple[float, float]]
    shared: Any
    _context: BaseContext | None
    rate_buckets: dict[str, Any]
    _claiming: set[Key]
    _releasing: set[Key]
    _stop_signalled: bool
    _announced: bool
    _to_start: collections.deque[Assignment]
    _balance: BalanceState
    _free_since: dict[Key, float]
    ready: set[object]  # what the loop's last wait found readable (workers' pipes and sentinels)
    _held_claims: list[MessageClaim]  # AMO batch claims asked while a message-claim write is in flight
    _message_claims_in_flight: bool

    if TYPE_CHECKING:  # provided by the Supervisor and its other parts

        def _require_coordinator(self) -> Coordinator: ...
        def _require_writes(self) -> InFlightWrites: ...
        def _require_offsets(self) -> OffsetStore: ...
        def _begin_graceful_stop(self) -> None: ...
        def _me(self) -> Owner: ...
        def _give_back(self, assignment: Assignment) -> None: ...
