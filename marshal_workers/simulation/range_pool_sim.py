"""A simulated member's shared topics: range leases, as runtime/supervisor/shared_pool.py takes them.

For every shared topic a member runs ``shared_workers`` simulated workers and keeps each supplied with leased
ranges, deciding with the real code: what to claim (protocol/range_pool.py's ``claim_ask`` and ``assign_won``
around range_member's ``free_candidates``/``pick_ranges``/``split_ahead``, sized by range_sizing's adaptive
sizes), when to renew (``renew_every_s``, ``RangeMember.renewals_due``/``renewed_deadline``), what progress to
report (``ProgressReport``, every ``PROGRESS_EVERY_S``), how a range is settled (``handled_entry``,
``cancel_entry``).  The fold's range rules run in every member's ``WorldState`` and the oracle's.

A worker handles its first range at the handler's rate, never past the partition's end nor past the lease's
deadline (as a real shared worker: it abandons the range there); a range done is acked, one read to the
partition's end while another waits (or a stop) is settled where it stands (``_leave_at_the_end``); a stop
gives back the ranges not begun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from marshal_workers.protocol import codec
from marshal_workers.protocol.range_leases import Holder
from marshal_workers.protocol.range_member import RangeMember, Wanted, cancel_entry, handled_entry
from marshal_workers.protocol.range_pool import (
    PROGRESS_EVERY_S,
    LeasedRange,
    ProgressReport,
    assign_won,
    claim_ask,
    renew_every_s,
)  # fmt: skip
from marshal_workers.protocol.range_sizing import RangeSizing
from marshal_workers.protocol.world_state import WorldState, per_entry
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.sim_config import SimConfig

Key = tuple[str, int]


class RangeEnvironment(Protocol):
    """What the pool needs of the simulation around it."""

    clock: VirtualClock
    config: SimConfig

    def high_watermark(self, key: Key, now: float) -> int: ...

    def lease_taken(self, owner: object, topic: str, leased: LeasedRange) -> None: ...

    def lease_dropped(self, owner: object, topic: str, leased: LeasedRange) -> None: ...

    def range_handled(self, topic: str, partition: int, start: int, end: int) -> None: ...


class RangeWriter(Protocol):
    """What the pool needs of its member: its fold, clocks, record fields and writes."""

    world: WorldState
    frozen: bool
    slow_rate: float | None

    def now_ms(self) -> int: ...

    def common(self) -> dict[str, Any]: ...

    def write(self, records: list[codec.Record], on_verdicts: Callable[[list[Any]], None],
              on_failure: Callable[[], None]) -> None: ...  # fmt: skip


@dataclass(eq=False)
class SimSharedWorker:
    """A simulated shared worker: ``leases`` in order, the first in hand; ``at`` its position in it."""

    index: int
    leases: list[LeasedRange] = field(default_factory=list)
    alive: bool = True
    at: float = 0.0  # the next offset of the range in hand (fractional: a message partly handled)
    since: float = 0.0  # virtual seconds: handled up to here
    settled_at: tuple[int, int] | None = None

    @property
    def running(self) -> bool:
        return self.alive


@dataclass
class RangeCounters:
    claimed: int = 0
    refused: int = 0
    acked: int = 0
    acks_refused: int = 0
    cancelled: int = 0
    abandoned: int = 0
    renewed: int = 0
    progress_written: int = 0


class SimSharedTopic:
    """One shared topic of one member: its workers and their leases."""

    def __init__(self, topic: str, partitions: int, amo: bool, env: RangeEnvironment, member: RangeWriter,
                 holder: Holder, rng: Any) -> None:  # fmt: skip
        config = env.config
        self.topic = topic
        self.partitions = partitions
        self.env = env
        self.member = member
        self.holder = holder
        self.rng = rng
        lease_ms = round(config.pending_timeout_s * 1000)
        self.policy = RangeMember(topic, lease_ms, amo)
        self.sizing = RangeSizing(config.range_size, lease_ms)
        self.workers = [SimSharedWorker(i, since=env.clock.now) for i in range(config.shared_workers)]
        self.claiming = False
        self.progressing = False
        self.stopping = False
        self.next_renewal = 0.0
        self.next_progress = 0.0
        self.acks: list[codec.AckEntry] = []
        self.cancels: list[codec.RangeEntry] = []
        self.in_flight = 0
        self.counters = RangeCounters()

    # ------------------------------------------------------------- the loop

    def step(self, now: float) -> None:
        """One pass of the member's loop, as SharedPool.step: workers, settlements, progress, renewals, claims."""
        for worker in self.workers:
            self.advance(worker, now)
        self._settle()
        if now >= self.next_progress and not self.progressing:
            self.next_progress = now + PROGRESS_EVERY_S
            self._write_progress()
        if now >= self.next_renewal:
            self.next_renewal = now + renew_every_s(self.policy.lease_ms)
            self._renew()
        self._claim()

    def stopped(self) -> bool:
        return not any(w.leases for w in self.workers) and not self.in_flight and not (self.acks or self.cancels)

    # ------------------------------------------------------------ workers

    def advance(self, worker: SimSharedWorker, now: float) -> None:
        """The worker's handling up to ``now``: at its rate, within the partition and the lease's deadline."""
        if self.member.frozen or not worker.alive:
            return
        config = self.env.config
        rate = config.handler_rate if self.member.slow_rate is None else self.member.slow_rate
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
                self._settled(worker, leased, leased.end)
                continue
            worker.since = max(worker.since, min(now, until))
            if now * 1000 >= leased.deadline_ms:  # the lease ran out first: left alone (it lapses in the log)
                self.counters.abandoned += 1
                self._drop(worker, leased)
                worker.settled_at = None
                continue
            at_end = self.env.high_watermark(key, now) <= handled
            if at_end and (self.stopping or len(worker.leases) > 1):  # don't wait at the end: settle where it stands
                if handled > leased.start:
                    self._settled(worker, leased, handled)
                else:
                    self.cancels.append(cancel_entry(leased))
                    self._drop(worker, leased)
                    worker.settled_at = None
                continue
            return

    def _settled(self, worker: SimSharedWorker, leased: LeasedRange, end: int) -> None:
        messages = end - leased.start
        rate = self.env.config.handler_rate if self.member.slow_rate is None else self.member.slow_rate
        self.sizing.observe(worker.index, messages, messages / rate * 1000, self.env.clock.now)
        high = self.env.high_watermark((self.topic, leased.partition), self.env.clock.now)
        self.acks.append(handled_entry(leased, end, (), (), high))
        self._drop(worker, leased)
        worker.settled_at = (leased.partition, end)

    def _drop(self, worker: SimSharedWorker, leased: LeasedRange) -> None:
        worker.leases.remove(leased)
        self.env.lease_dropped(self, self.topic, leased)

    def begin_stop(self) -> None:
        """A graceful stop: each worker finishes the range in hand; the others go back untried."""
        self.stopping = True
        for worker in self.workers:
            for leased in worker.leases[1:]:
                self.cancels.append(cancel_entry(leased))
                self._drop(worker, leased)

    def crash(self) -> None:
        """The member died: its workers with it; their leases lapse in the log."""
        for worker in self.workers:
            worker.alive = False
            for leased in list(worker.leases):
                self._drop(worker, leased)

    def freeze(self, now: float) -> None:
        for worker in self.workers:
            self.advance(worker, now)

    def thaw(self, now: float) -> None:
        for worker in self.workers:
            worker.since = now  # nothing was handled while frozen

    # ------------------------------------------------------------- writes

    def _submit(self, record: codec.Record, on_verdicts: Callable[[list[bool]], None],
                on_failure: Callable[[], None]) -> None:  # fmt: skip
        entries = len(record.ranges)  # type: ignore[union-attr]
        self.in_flight += 1

        def done(verdicts: list[Any]) -> None:
            self.in_flight -= 1
            on_verdicts(per_entry(verdicts[0], entries))

        def failed() -> None:
            self.in_flight -= 1
            on_failure()

        self.member.write([record], done, failed)

    def _claim(self) -> None:
        if self.stopping or self.claiming:
            return
        ask = claim_ask(self.workers, self.sizing, self.holder)
        if ask is None:
            return
        now = self.env.clock.now
        ends = {p: self.env.high_watermark((self.topic, p), now) for p in range(self.partitions)}
        initial = dict.fromkeys(range(self.partitions), 0)  # every partition starts at 0
        choice = ask.choose(self.policy, self.member.world, ends, initial, self.member.now_ms(), self.rng)
        picked = choice.ranges
        if not picked:
            return
        record = self.policy.claim(self.member.common(), picked)
        written_ms = self.env.clock.now_ms  # before the write: the deadline errs short
        self.claiming = True
        self._submit(record, lambda verdicts: self._after_claim(picked, verdicts, written_ms), self._claim_failed)

    def _claim_failed(self) -> None:
        self.claiming = False

    def _after_claim(self, picked: list[Wanted], verdicts: list[bool], written_ms: int) -> None:
        self.claiming = False
        won = self.policy.won(picked, verdicts)
        self.counters.claimed += len(won)
        self.counters.refused += len(picked) - len(won)
        deadline = self.policy.deadline(written_ms)

        def place(worker: SimSharedWorker, wanted: Wanted) -> None:
            leased = LeasedRange(wanted.partition, wanted.start, wanted.end, wanted.tries, deadline)
            if not worker.leases:
                worker.since = max(worker.since, self.env.clock.now)
            worker.leases.append(leased)
            self.env.lease_taken(self, self.topic, leased)

        left = list(won) if self.stopping else assign_won(won, self.workers, place)
        for wanted in left:
            self.cancels.append(cancel_entry(LeasedRange(wanted.partition, wanted.start, wanted.end, wanted.tries,
                                                         deadline)))  # fmt: skip

    def _renew(self) -> None:
        now_ms = self.env.clock.now_ms
        held = [(w, r) for w in self.workers for r in self.policy.renewals_due(w.leases, now_ms)]
        if not held:
            return
        record = self.policy.renewal(self.member.common(), [r for _, r in held])
        written_ms = self.env.clock.now_ms

        def renewed(verdicts: list[bool]) -> None:
            for (worker, leased), accepted in zip(held, verdicts):
                deadline = self.policy.renewed_deadline(leased, written_ms, accepted)
                if deadline is not None and leased in worker.leases:
                    leased.deadline_ms = deadline
                    self.counters.renewed += 1

        self._submit(record, renewed, lambda: None)

    def _settle(self) -> None:
        if self.acks:
            acks, self.acks = self.acks, []

            def acked(verdicts: list[bool]) -> None:
                refused = sum(1 for ok in verdicts if not ok)
                self.counters.acked += len(acks) - refused
                self.counters.acks_refused += refused

            self._submit(self.policy.acks(self.member.common(), acks), acked, lambda: self.acks.extend(acks))
        if self.cancels:
            cancels, self.cancels = self.cancels, []

            def cancelled(verdicts: list[bool]) -> None:
                self.counters.cancelled += sum(1 for ok in verdicts if ok)

            self._submit(self.policy.cancels(self.member.common(), cancels), cancelled,
                         lambda: self.cancels.extend(cancels))  # fmt: skip

    def _write_progress(self) -> None:
        report = ProgressReport()
        now_ms = self.env.clock.now_ms
        for worker in self.workers:
            for leased in worker.leases:
                report.add(self.policy, leased, max(leased.upto, leased.start), now_ms)
        if not report.entries:
            return
        self.progressing = True

        def written(verdicts: list[bool]) -> None:
            self.progressing = False
            self.counters.progress_written += report.written(verdicts)

        def failed() -> None:
            self.progressing = False

        self._submit(self.policy.progress(self.member.common(), report.entries), written, failed)
