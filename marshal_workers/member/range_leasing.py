"""A member's range leases on one shared topic: what it claims, renews, settles and reports, and in what order.

A supervisor's shared pool (runtime/supervisor/shared_pool.py) keeps its shared workers supplied with leased
ranges; a simulated member (simulation/simulated_shared_workers.py) does the same with simulated workers.  Both drive this
object, so both take the same steps (docs/shared-partitions.md):

* claim: ``claim_ranges`` for the free ranges the fold shows, for the workers that want more (protocol/worker_supply.py's
  ``claim_ask``), unless the member is stopping, a claim is in flight, or an operator holds the topic back; the
  ranges won go to the workers (``assign_won``), the rest back (``cancel_ranges``);
* renew: ``renew_ranges`` every third of the lease, for the leases whose deadline has not passed;
* settle: ``ack_ranges`` for ranges done, ``cancel_ranges`` for ranges never begun; a settlement not confirmed is
  written again, unless the member has made its last tries (past its shutdown timeout);
* progress: ``progress_ranges`` every ``PROGRESS_EVERY_S`` for the ranges in hand that moved on.

The decisions are range_member.py's and worker_supply.py's; this object sequences them.  It reads no clock (``now``
comes in), writes nothing itself and talks to no process: it hands its records and its news for the workers to
the :class:`LeasingShell` it is given, and the shell hands back the verdicts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from marshal_workers.member.shell import Log, OnFailure, OnVerdicts, Quiet
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_member import RangeMember, WantedRange, cancel_entry, crashed_entry, handled_entry
from marshal_workers.protocol.range_sizing import RangeSizing
from marshal_workers.protocol.worker_supply import (
    PROGRESS_EVERY_S,
    PoolLease,
    PoolWorker,
    ProgressReport,
    assign_won,
    claim_ask,
    renew_every_s,
)
from marshal_workers.protocol.world_state import WorldState, per_entry

W = TypeVar("W", bound=PoolWorker)
W_contra = TypeVar("W_contra", bound=PoolWorker, contravariant=True)  # the shell takes workers, never gives them
T = TypeVar("T")


class LeasingShell(Protocol[W_contra]):
    """What the core needs of the member around it: its fold, its writes, its workers."""

    def holder(self) -> MemberId:
        """The member (client, instance) whose leases these are."""
        ...

    def fields(self) -> dict[str, Any]:
        """A record's common fields (client, instance, ts ...)."""
        ...

    def read(self, query: Callable[[WorldState], T]) -> T:
        """``query`` over the member's fold of the log, as it stands."""
        ...

    def ends(self, topic: str) -> dict[int, int]:
        """Each partition's end offset, as last known (empty: not known yet, nothing is claimed)."""
        ...

    def initial(self, topic: str) -> dict[int, int]:
        """Where a partition never leased starts, for the partitions whose start is known."""
        ...

    def learn_starts(self, topic: str, partitions: list[int]) -> None:
        """Look up where these partitions start (for a later claim)."""
        ...

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        """Write ``records``; the fold's verdicts (or the failure) come back later through the callbacks."""
        ...

    def leased(self, worker: W_contra, leased: PoolLease) -> None:
        """``leased`` was won and is now the last of ``worker``'s leases: tell the worker."""
        ...

    def renewed(self, worker: W_contra, leased: PoolLease) -> None:
        """``leased``'s renewal was confirmed: its deadline moved on."""
        ...

    def dropped(self, worker: W_contra, leased: PoolLease) -> None:
        """``leased`` left ``worker``'s leases (settled, given back, abandoned or lapsed)."""
        ...

    def progress_of(self, worker: W_contra, leased: PoolLease) -> int:
        """How far ``leased`` is done: every offset below it but its failed ones."""
        ...


@dataclass
class LeaseCounters:
    claimed: int = 0
    refused: int = 0
    acked: int = 0
    acks_refused: int = 0  # the lease had lapsed (or we never held it): another worker handles it again
    cancelled: int = 0
    abandoned: int = 0  # a worker's lease ran out while it handled the range
    renewed: int = 0
    progress_written: int = 0  # progress entries the log accepted


class RangeLeasing(Generic[W]):
    """One shared topic of one member: the leases its workers hold, and the writes that keep them."""

    def __init__(
        self,
        member: RangeMember,
        sizing: RangeSizing,
        workers: list[W],
        shell: LeasingShell[W],
        rng: random.Random,
        log: Log | None = None,
    ) -> None:
        """``member``: the lease decisions (topic, lease length, at most once); ``sizing``: how many offsets a
        claim covers; ``rng``: the random picks among the lowest free ranges."""
        self.member = member
        self.topic = member.topic
        self.sizing = sizing
        self.workers = workers
        self.shell = shell
        self.rng = rng
        self.log: Log = Quiet() if log is None else log
        self.stopping = False  # no more claims; ranges won meanwhile go back
        self.held_back = False  # an operator paused the topic or drained the member: no new leases
        self.last_tries = False  # past the shutdown timeout: a settlement that fails is not written again
        self.claiming = False  # a claim_ranges write is in flight
        self.progressing = False  # a progress_ranges write is in flight
        self.next_renewal = 0.0
        self.next_progress = 0.0
        self.acks: list[codec.AckEntry] = []  # to write next pass
        self.cancels: list[codec.RangeEntry] = []
        self.in_flight = 0  # writes not decided yet
        self.counters = LeaseCounters()

    # ------------------------------------------------------------- the loop

    def step(self, now: float, now_ms: int, log_now_ms: int) -> None:
        """One pass of the member's loop, after its workers' news: settlements, progress, renewals, then claims.
        ``now``: seconds and ``now_ms``: ms of the member's monotonic clock (cadences, deadlines); ``log_now_ms``:
        its wall clock, which it compares with the fold's record times."""
        self._settle()
        if now >= self.next_progress and not self.progressing:
            self.next_progress = now + PROGRESS_EVERY_S
            self._write_progress(now_ms)
        if now >= self.next_renewal:
            self.next_renewal = now + renew_every_s(self.member.lease_ms)
            self._renew(now_ms)
        self._claim(now_ms, log_now_ms)

    def stopped(self) -> bool:
        """No lease held, no write in flight, nothing left to settle."""
        return not self.in_flight and not (self.acks or self.cancels) and not any(w.leases for w in self.workers)

    def leases_held(self) -> int:
        return sum(len(w.leases) for w in self.workers)

    # ------------------------------------------------------- workers' news

    def settled(
        self,
        worker: W,
        leased: PoolLease,
        end: int,
        failed: Sequence[int],
        dead: Sequence[int],
        high: int | None,
        messages: int,
        busy_ms: float,
        now: float,
    ) -> None:
        """``worker`` is done with ``leased`` up to ``end`` (``messages`` of them in ``busy_ms``): ack it."""
        self.sizing.observe(worker.index, messages, busy_ms, now)
        self.acks.append(handled_entry(leased, end, failed, dead, high))
        self._drop(worker, leased)
        worker.settled_at = (leased.partition, end)

    def returned(self, worker: W, leased: PoolLease) -> None:
        """``worker`` gives ``leased`` back untried."""
        self.cancels.append(cancel_entry(leased))
        self._drop(worker, leased)

    def abandoned(self, worker: W, leased: PoolLease) -> None:
        """``leased`` ran out while ``worker`` handled it: it lapses in the log (handled again, or lost at most
        once)."""
        self.counters.abandoned += 1
        self._drop(worker, leased)

    def worker_died(self, worker: W) -> None:
        """``worker`` died: what it began and did not report done may have been handled, so each such offset gets
        one try more; what it never began goes back."""
        shell = self.shell
        for leased in list(worker.leases):
            entry = crashed_entry(leased, leased.started, shell.progress_of(worker, leased), leased.failed, leased.dead)
            if isinstance(entry, codec.AckEntry):
                self.acks.append(entry)
            else:
                self.cancels.append(entry)
            self._drop(worker, leased)

    def lapse(self, worker: W) -> None:
        """The member died with ``worker``: its leases lapse in the log, nothing is settled."""
        for leased in list(worker.leases):
            self._drop(worker, leased)

    def _drop(self, worker: W, leased: PoolLease) -> None:
        worker.leases.remove(leased)
        self.shell.dropped(worker, leased)

    # --------------------------------------------------------------- claims

    def _claim(self, now_ms: int, log_now_ms: int) -> None:
        if self.stopping or self.claiming or self.held_back:
            return
        shell, member = self.shell, self.member
        ask = claim_ask(self.workers, self.sizing, shell.holder())
        if ask is None:
            return
        ends = shell.ends(self.topic)
        if not ends:
            return
        initial, rng = shell.initial(self.topic), self.rng
        choice = shell.read(lambda world: ask.choose(member, world, ends, initial, log_now_ms, rng))
        if choice.unknown:
            shell.learn_starts(self.topic, choice.unknown)
            return
        picked = choice.ranges
        if not picked:
            return
        record = member.claim(shell.fields(), picked)
        self.claiming = True  # ``now_ms`` is from before the write: the deadline errs short
        self._submit(
            "range claim", record, lambda verdicts: self._after_claim(picked, verdicts, now_ms), self._claim_failed
        )

    def _after_claim(self, picked: list[WantedRange], verdicts: Sequence[bool], written_ms: int) -> None:
        self.claiming = False
        member = self.member
        won = member.won(picked, verdicts)
        self.counters.claimed += len(won)
        self.counters.refused += len(picked) - len(won)
        deadline = member.deadline(written_ms)

        def place(worker: W, wanted: WantedRange) -> None:
            leased = PoolLease(wanted.partition, wanted.start, wanted.end, wanted.tries, deadline)
            worker.leases.append(leased)
            self.shell.leased(worker, leased)

        # Ranges that start where a worker will stand go to that worker first (read on, no seek: its read-ahead);
        # a range at a partition's end goes to an idle worker (see free_candidates).
        left = list(won) if self.stopping else assign_won(won, self.workers, place)
        for wanted in left:
            self.cancels.append(
                cancel_entry(PoolLease(wanted.partition, wanted.start, wanted.end, wanted.tries, deadline))
            )

    def _claim_failed(self, exc: Exception) -> None:
        self.claiming = False
        self.log.warning("range claims on %s not confirmed: %s", self.topic, exc)

    # ------------------------------------------------------ renew and settle

    def _renew(self, now_ms: int) -> None:
        member = self.member
        held = [(w, r) for w in self.workers for r in member.renewals_due(w.leases, now_ms)]
        if not held:
            return
        record = member.renewal(self.shell.fields(), [r for _, r in held])

        def renewed(verdicts: Sequence[bool]) -> None:
            for (worker, leased), accepted in zip(held, verdicts):
                deadline = member.renewed_deadline(leased, now_ms, accepted)
                if deadline is not None and leased in worker.leases:
                    leased.deadline_ms = deadline
                    self.counters.renewed += 1
                    self.shell.renewed(worker, leased)

        self._submit(
            "range renewal", record, renewed, lambda exc: self.log.warning("lease renewal on %s: %s", self.topic, exc)
        )

    def _settle(self) -> None:
        if self.acks:
            acks, self.acks = self.acks, []
            record: codec.Record = self.member.acks(self.shell.fields(), acks)  # cancels below too

            def acked(verdicts: Sequence[bool]) -> None:
                refused = [a for a, ok in zip(acks, verdicts) if not ok]
                self.counters.acked += len(acks) - len(refused)
                self.counters.acks_refused += len(refused)
                for ack in refused:
                    self.log.warning(
                        "%s[%d]: ack of %d..%d refused: its lease had lapsed, so it is delivered again "
                        "(at most once: counted lost)",
                        self.topic,
                        ack.partition,
                        ack.offset,
                        ack.end - 1,
                    )

            self._submit("range ack", record, acked, lambda exc: self._settle_failed(acks, [], exc))
        if self.cancels:
            cancels, self.cancels = self.cancels, []
            record = self.member.cancels(self.shell.fields(), cancels)

            def cancelled(verdicts: Sequence[bool]) -> None:
                self.counters.cancelled += sum(1 for ok in verdicts if ok)

            self._submit("range cancel", record, cancelled, lambda exc: self._settle_failed([], cancels, exc))

    def _settle_failed(self, acks: list[codec.AckEntry], cancels: list[codec.RangeEntry], exc: Exception) -> None:
        """Not confirmed: try again (the fold refuses a second ack of the same lease, so a repeat is harmless),
        unless the last tries are made: then the leases lapse (at least once: delivered again; at most once: lost)."""
        if self.last_tries:
            self.log.error("settling ranges of %s not confirmed (%s): leaving them to lapse", self.topic, exc)
            return
        self.log.warning("settling ranges of %s not confirmed (%s): writing again", self.topic, exc)
        self.acks.extend(acks)
        self.cancels.extend(cancels)

    def _write_progress(self, now_ms: int) -> None:
        """One ``progress_ranges`` for every range in hand that moved on since the log last heard of it."""
        report = ProgressReport()
        shell, member = self.shell, self.member
        for worker in self.workers:
            for leased in worker.leases:
                report.add(member, leased, shell.progress_of(worker, leased), now_ms)
        if not report.entries:
            return
        record = member.progress(shell.fields(), report.entries)
        self.progressing = True

        def written(verdicts: Sequence[bool]) -> None:
            self.progressing = False
            self.counters.progress_written += report.written(verdicts)

        def failed(exc: Exception) -> None:
            self.progressing = False  # written again at the next cadence
            self.log.warning("progress of ranges of %s not confirmed: %s", self.topic, exc)

        self._submit("range progress", record, written, failed)

    def _submit(
        self, what: str, record: codec.Record, on_verdicts: Callable[[Sequence[bool]], None], on_failure: OnFailure
    ) -> None:
        """Write one record of range entries; its verdict, one per entry."""
        entries = len(record.ranges)  # type: ignore[union-attr]
        self.in_flight += 1

        def done(verdicts: list[Any]) -> None:
            self.in_flight -= 1
            on_verdicts(per_entry(verdicts[0], entries))

        def failed(exc: Exception) -> None:
            self.in_flight -= 1
            on_failure(exc)

        self.shell.submit(what, [record], done, failed)
