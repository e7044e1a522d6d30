"""A simulated member's shared topics: its simulated workers, driving the member core's range leasing.

For every shared topic a member runs ``shared_workers`` simulated workers and keeps each supplied with leased
ranges through member/range_leasing.py's ``RangeLeasing``, the object a supervisor's shared pool
(runtime/supervisor/shared_pool.py) drives too: what to claim, when to renew, what progress to report, how a range
is settled.  This module is the world around it: the workers, their rate, the partitions' ends, the oracle's
view of the leases.  The fold's range rules run in every member's ``WorldState`` and the oracle's.

A worker handles its first range at the handler's rate, never past the partition's end nor past the lease's
deadline (as a real shared worker: it abandons the range there); a range done is acked, one read to the
partition's end while another waits (or a stop) is settled where it stands; a stop gives back the ranges not
begun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from marshal_workers.member.range_leasing import RangeLeasing
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_member import RangeMember
from marshal_workers.protocol.range_sizing import RangeSizing
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.sim_config import SimConfig

Key = tuple[str, int]
T = TypeVar("T")


class RangeEnvironment(Protocol):
    """What the pool needs of the simulation around it."""

    clock: VirtualClock
    config: SimConfig

    def high_watermark(self, key: Key, now: float) -> int: ...

    def lease_taken(self, owner: object, topic: str, leased: PoolLease) -> None: ...

    def lease_dropped(self, owner: object, topic: str, leased: PoolLease) -> None: ...

    def range_handled(self, topic: str, partition: int, start: int, end: int) -> None: ...


class RangeWriter(Protocol):
    """What the pool needs of its member: its fold, clocks, record fields and writes."""

    world: WorldState
    frozen: bool
    slow_rate: float | None

    def now_ms(self) -> int: ...

    def common(self) -> dict[str, Any]: ...

    def write(
        self, records: list[codec.Record], on_verdicts: Callable[[list[Any]], None], on_failure: Callable[[], None]
    ) -> None: ...


@dataclass(eq=False)
class SimSharedWorker:
    """A simulated shared worker: ``leases`` in order, the first in hand; ``at`` its position in it."""

    index: int
    leases: list[PoolLease] = field(default_factory=list)
    alive: bool = True
    at: float = 0.0  # the next offset of the range in hand (fractional: a message partly handled)
    since: float = 0.0  # virtual seconds: handled up to here
    settled_at: tuple[int, int] | None = None

    @property
    def running(self) -> bool:
        return self.alive


class NotConfirmed(Exception):
    """A simulated write whose verdicts did not come in time."""


class SimSharedTopic:
    """One shared topic of one member: its simulated workers, and the shell its ``RangeLeasing`` drives."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        amo: bool,
        env: RangeEnvironment,
        member: RangeWriter,
        holder: MemberId,
        rng: Any,
    ) -> None:
        config = env.config
        self.topic = topic
        self.partitions = partitions
        self.env = env
        self.member = member
        self._holder = holder
        self._initial = dict.fromkeys(range(partitions), 0)  # every partition starts at 0
        lease_ms = round(config.pending_timeout_s * 1000)
        self.workers = [SimSharedWorker(i, since=env.clock.now) for i in range(config.shared_workers)]
        self.leasing = RangeLeasing(
            RangeMember(topic, lease_ms, amo), RangeSizing(config.range_size, lease_ms), self.workers, self, rng
        )

    # ------------------------------------------------------------- the loop

    def step(self, now: float) -> None:
        """One pass of the member's loop, as SharedPool.step: the workers' handling, then the leases' writes."""
        for worker in self.workers:
            self.advance(worker, now)
        clock = self.env.clock
        self.leasing.step(now, clock.now_ms, self.member.now_ms())

    def stopped(self) -> bool:
        return self.leasing.stopped()

    # ------------------------------------------------------------ workers

    def advance(self, worker: SimSharedWorker, now: float) -> None:
        """The worker's handling up to ``now``: at its rate, within the partition and the lease's deadline."""
        if self.member.frozen or not worker.alive:
            return
        config = self.env.config
        rate = config.handler_rate if self.member.slow_rate is None else self.member.slow_rate
        leasing = self.leasing
        while worker.leases:
            leased = worker.leases[0]
            key = (self.topic, leased.partition)
            if not leased.started:
                leased.started, leased.upto, worker.at = True, leased.start, float(leased.start)
            until = min(now, leased.deadline_ms / 1000)
            before = int(worker.at)
            if until > worker.since:
                high = self.env.high_watermark(key, until)
                worker.at = min(float(leased.end), float(max(high, before)), worker.at + rate * (until - worker.since))
            handled = int(worker.at)
            if handled > before:
                self.env.range_handled(self.topic, leased.partition, before, handled)
                leased.upto = handled
            if handled >= leased.end:  # done: when the last message was, at the rate and as it arrived
                done_at = max(worker.since + (leased.end - worker.at) / rate, leased.end / config.produce_rate)
                worker.since = min(max(worker.since, done_at), now)
                self._settled(worker, leased, leased.end, rate)
                continue
            worker.since = max(worker.since, min(now, until))
            if now * 1000 >= leased.deadline_ms:  # the lease ran out first: left alone (it lapses in the log)
                leasing.abandoned(worker, leased)
                worker.settled_at = None
                continue
            at_end = self.env.high_watermark(key, now) <= handled
            if at_end and (leasing.stopping or len(worker.leases) > 1):  # don't wait at the end: settle where it stands
                if handled > leased.start:
                    self._settled(worker, leased, handled, rate)
                else:
                    leasing.returned(worker, leased)
                    worker.settled_at = None
                continue
            return

    def _settled(self, worker: SimSharedWorker, leased: PoolLease, end: int, rate: float) -> None:
        messages = end - leased.start
        now = self.env.clock.now
        high = self.env.high_watermark((self.topic, leased.partition), now)
        self.leasing.settled(worker, leased, end, (), (), high, messages, messages / rate * 1000, now)

    def begin_stop(self) -> None:
        """A graceful stop: each worker finishes the range in hand; the others go back untried."""
        leasing = self.leasing
        leasing.stopping = True
        for worker in self.workers:
            for leased in worker.leases[1:]:
                leasing.returned(worker, leased)

    def crash(self) -> None:
        """The member died: its workers with it; their leases lapse in the log."""
        for worker in self.workers:
            worker.alive = False
            self.leasing.lapse(worker)

    def freeze(self, now: float) -> None:
        for worker in self.workers:
            self.advance(worker, now)

    def thaw(self, now: float) -> None:
        for worker in self.workers:
            worker.since = now  # nothing was handled while frozen

    # ------------------------------------------- the shell RangeLeasing drives

    def holder(self) -> MemberId:
        return self._holder

    def fields(self) -> dict[str, Any]:
        return self.member.common()

    def read(self, query: Callable[[WorldState], T]) -> T:
        return query(self.member.world)

    def ends(self, topic: str) -> dict[int, int]:
        now = self.env.clock.now
        return {p: self.env.high_watermark((topic, p), now) for p in range(self.partitions)}

    def initial(self, topic: str) -> dict[int, int]:
        return self._initial

    def learn_starts(self, topic: str, partitions: list[int]) -> None:
        pass  # never asked: every partition's start is known (0)

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        self.member.write(records, on_verdicts, lambda: on_failure(NotConfirmed(what)))

    def leased(self, worker: SimSharedWorker, leased: PoolLease) -> None:
        if len(worker.leases) == 1:  # its first: it handles from now on
            worker.since = max(worker.since, self.env.clock.now)
        self.env.lease_taken(self, self.topic, leased)

    def renewed(self, worker: SimSharedWorker, leased: PoolLease) -> None:
        pass  # a simulated worker reads its lease's deadline itself

    def dropped(self, worker: SimSharedWorker, leased: PoolLease) -> None:
        self.env.lease_dropped(self, self.topic, leased)

    def progress_of(self, worker: SimSharedWorker, leased: PoolLease) -> int:
        return max(leased.upto, leased.start)
