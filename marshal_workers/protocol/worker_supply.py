"""A member's pool of shared workers on one shared topic: which leases to ask for, and who gets the ranges won.

The supervisor's shared pool (runtime/supervisor/shared_pool.py) keeps each of its shared workers supplied with
``LEASES_PER_WORKER`` leased ranges; the simulator (simulation/simulated_shared_workers.py) does the same with simulated
workers.  Both decide here, over plain data, what the pool's component used to decide next to its processes:

* what one claim asks for (:func:`claim_ask`): how many ranges (``want``), for how many idle workers, where each
  hungry worker will stand (``follow``, so its consumer reads on), the size (range_sizing's backlog sizer) and
  whether a joiner starts halfway through a fast handler's backlog (``split``);
* who gets each range won (:func:`assign_won`): the worker that will stand at its start, else the hungriest;
* which leases in hand to report progress of (:func:`progress_report`).

The callers read the clocks, write the records and talk to their workers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_member import RangeChoice, RangeMember, WantedRange, progress_entry
from marshal_workers.protocol.range_sizing import LEASES_PER_WORKER, BacklogSizer, RangeSizing
from marshal_workers.protocol.world_state import WorldState

PROGRESS_EVERY_S = 0.5  # how often a shared worker reports its progress, and its pool writes progress_ranges


def renew_every_s(lease_ms: int) -> float:
    """How often a pool renews its leases: every third of the lease (the handler's pending timeout)."""
    return lease_ms / 3000


@dataclass
class PoolLease:
    """A lease this pool holds for one of its workers (a member's own record, a HeldLease; the fold's is
    range_leases.Lease), and that worker's progress in it."""

    partition: int
    start: int
    end: int
    tries: int
    deadline_ms: int  # monotonic: the worker must not handle a message past it
    started: bool = False
    # Its worker's progress inside it: every offset of [start, upto) done but ``failed`` (``dead`` dead-lettered),
    # from its Progress messages and its range slot; and what of it the log was last told (None: nothing yet).
    upto: int = -1
    failed: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    written: tuple[int, int, int] | None = None


class PoolWorker(Protocol):
    """What the pool's decisions need of one of its workers."""

    index: int
    leases: list[PoolLease]
    settled_at: tuple[int, int] | None  # (partition, end) of the last range it settled

    @property
    def running(self) -> bool: ...


def reads_next(worker: PoolWorker) -> tuple[int, int] | None:
    """(partition, offset) where a worker's consumer will stand once its ranges are handled: a range that starts
    there is read on without a seek, from what the consumer fetched ahead."""
    if worker.leases:
        return worker.leases[-1].partition, worker.leases[-1].end
    return worker.settled_at


Worker = TypeVar("Worker", bound=PoolWorker)


def hungry(workers: Sequence[Worker]) -> list[Worker]:
    """The running workers that hold fewer leases than they want."""
    return [w for w in workers if w.running and len(w.leases) < LEASES_PER_WORKER]


@dataclass(frozen=True)
class ClaimAsk:
    """What one claim asks for: ``want`` ranges, ``idle`` of the workers holding none, ``follow`` (where each
    hungry worker will stand, once per lease it wants), sized by ``sizer``; ``split``: see range_member.split_ahead."""

    want: int
    idle: int
    follow: list[tuple[int, int]]
    sizer: BacklogSizer
    split: bool

    def choose(
        self,
        member: RangeMember,
        world: WorldState,
        ends: dict[int, int],
        initial: dict[int, int],
        now_ms: int,
        rng: random.Random,
    ) -> RangeChoice:
        """The ranges to claim, as the fold has it at ``now_ms`` (the log's clock)."""
        return member.choose(
            world,
            ends,
            initial,
            now_ms,
            self.sizer.size,
            self.want,
            self.idle,
            rng,
            self.sizer,
            self.follow,
            self.split,
        )


def claim_ask(workers: Sequence[PoolWorker], sizing: RangeSizing, me: MemberId) -> ClaimAsk | None:
    """What the pool's next claim asks for, or None if no worker wants a lease."""
    wanting = hungry(workers)
    want = sum(LEASES_PER_WORKER - len(w.leases) for w in wanting)
    if not want:
        return None
    idle = sum(1 for w in wanting if not w.leases)
    live = sum(1 for w in workers if w.running)
    sizer = sizing.sizer([w.index for w in wanting], live, me)
    follow: list[tuple[int, int]] = []  # where each hungry worker will stand, once per lease it wants (pick_ranges)
    for worker in wanting:
        at = reads_next(worker)
        if at is not None:
            follow += [at] * (LEASES_PER_WORKER - len(worker.leases))
    # A handler whose ranges are at the cap handles one in less than its target span (a fast one: 10,000 messages
    # in some 10 ms), less than the fetch a worker that moves within a partition waits for: a worker that joins
    # another on a partition starts halfway through its backlog, and both read on (range_member.split_ahead).
    split = sizing.adaptive and sizer.size >= sizing.cap
    return ClaimAsk(want, idle, follow, sizer, split)


def follower(workers: Sequence[Worker], partition: int, start: int) -> Worker | None:
    """A hungry worker whose consumer will stand at ``start`` of ``partition``, if any."""
    return next((w for w in hungry(workers) if reads_next(w) == (partition, start)), None)


def hungriest(workers: Sequence[Worker]) -> Worker | None:
    return min(hungry(workers), key=lambda w: len(w.leases), default=None)


def assign_won(
    won: Sequence[WantedRange], workers: Sequence[Worker], place: Callable[[Worker, WantedRange], None]
) -> list[WantedRange]:
    """Hand the ranges won to the workers: one that starts where a worker will stand goes to that worker (it reads
    on, no seek: its read-ahead), the others to the hungriest; ``place`` gives one to a worker (adds it to its
    leases, which changes who is hungry).  The ranges no worker wants, to give back."""
    left = []
    for wanted in sorted(won, key=lambda w: follower(workers, w.partition, w.start) is None):
        worker = follower(workers, wanted.partition, wanted.start) or hungriest(workers)
        if worker is None:
            left.append(wanted)
        else:
            place(worker, wanted)
    return left


@dataclass
class ProgressReport:
    """The progress entries to write, and the marks to note once the log has them."""

    entries: list[codec.ProgressEntry] = field(default_factory=list)
    moved: list[tuple[PoolLease, tuple[int, int, int]]] = field(default_factory=list)

    def add(self, member: RangeMember, leased: PoolLease, upto: int, now_ms: int) -> None:
        """``leased``, done up to ``upto``, if it is begun, still usable and moved on since the log last heard."""
        if not leased.started or not member.usable(leased, now_ms):
            return
        mark = (upto, len(leased.failed), len(leased.dead))
        if upto > leased.start and mark != leased.written:
            failed = [o for o in leased.failed if o < upto]
            dead = [o for o in leased.dead if o < upto]
            self.entries.append(progress_entry(leased, upto, failed, dead))
            self.moved.append((leased, mark))

    def written(self, verdicts: Sequence[bool]) -> int:
        """Note what the log was told (refused: the lease is gone, no use repeating); how many it accepted."""
        accepted = 0
        for (leased, mark), ok in zip(self.moved, verdicts):
            leased.written = mark
            accepted += ok
        return accepted
