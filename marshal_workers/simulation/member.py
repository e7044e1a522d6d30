"""A simulated member: the member core's driver on the virtual clock and log, as a supervisor is on Kafka.

What it claims, heartbeats, hands over and releases is the member core's ``PartitionHolding``
(member/partition_holding.py), what it does about operators' orders its ``Obeying`` (member/obeying.py), which
checkpoints it writes its ``CheckpointWriting`` (member/checkpoint_writing.py): the objects a supervisor's
components drive (runtime/supervisor/partition_claims.py, remote_control.py, checkpoint_writer.py); its batch
claims and range leases are amo_claims.py's and simulated_shared_workers.py's, around the core's too.  This is their shell and the world around them: its fold of the simulated log, the verdicts of its writes, its clocks, its
workers, its faults.  Every pass of its loop (``tick_s``) steps its parts in the supervisor's order (supervisor.py):
batch claims, the writes' verdicts, its workers, its shared topics, checkpoints, orders, whole partitions.  Its
workers are numbers: each handles its partition at the handler's rate, only while its lease holds (the lease
rule is ``claiming.lease_until``, as a real worker's), and stops a little after it is asked to.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from marshal_workers.member.checkpoint_writing import CheckpointWriting
from marshal_workers.member.obeying import Obeying
from marshal_workers.member.partition_holding import PartitionHolding, Position, settle_exit
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.claiming import ClaimingSettings, Key
from marshal_workers.protocol.health import PartitionHealth, Sample
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.amo_claims import AmoBatchClaims
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.shared_fold import SharedFold
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.sim_log import EPOCH_MS, Entry, SimulatedLog, SimWrite
from marshal_workers.simulation.simulated_shared_workers import NotConfirmed, SimSharedTopic

T = TypeVar("T")


@dataclass(eq=False)
class SimAssignment:
    """A partition a member holds, and its worker's progress."""

    key: Key
    offset: float  # the worker's next offset (fractional: messages partly handled at the rate)
    since: float  # virtual seconds: progress is counted up to here
    worker_up_at: float  # the worker handles messages from here on (it was forked)
    claimed_at: float
    lease_until_ms: int = 0  # virtual ms: the worker handles nothing after this
    stopping_at: float | None = None  # the worker was asked to stop and exits then
    lost: bool = False
    unhealthy: bool = False
    handing_over: bool = False
    ordered: str | None = None  # handed over on an operator's order
    health: PartitionHealth = field(default_factory=PartitionHealth)
    claimed_end: int = -1  # at most once: the end of the last batch claim accepted (amo_claims.py)
    claim_asked: bool = False  # at most once: a batch claim is asked for and not decided yet


class Environment(Protocol):
    """What a member needs of the simulation around it."""

    clock: VirtualClock
    log: SimulatedLog
    config: SimConfig
    shared: SharedFold | None  # the fleet's one fold of the log, if the members share it

    def high_watermark(self, key: Key, now: float) -> int: ...

    def holding(self, member: SimMember, assignment: SimAssignment) -> None: ...

    def reading_on(self, member: SimMember) -> None: ...

    def gone(self, member: SimMember, assignment: SimAssignment) -> None: ...

    def resumed(self, member: SimMember, key: Key, offset: int) -> None: ...

    def handled(self, key: Key, start: int, offset: int) -> None: ...

    def lease_taken(self, owner: object, topic: str, leased: PoolLease) -> None: ...

    def lease_dropped(self, owner: object, topic: str, leased: PoolLease) -> None: ...

    def range_handled(self, topic: str, partition: int, start: int, end: int) -> None: ...


class SimMember:
    """One instance of a member (a crash and restart makes a new one with the same client)."""

    def __init__(
        self, env: Environment, number: int, client: str, instance: str, world: WorldState, settings: ClaimingSettings
    ) -> None:
        self.env = env
        self.number = number
        self.me = MemberId(client, instance)
        self.world = world
        config = env.config
        self.rng = random.Random(f"{config.seed}/{client}/{instance}")  # str seeds hash the same in every process
        self.assignments: dict[Key, SimAssignment] = {}
        self.claims = PartitionHolding(self.me, settings, self.rng, self.assignments, self)
        self._partition_counts = config.whole_counts()  # shared topics are leased by ranges, never claimed whole
        self.pending: list[tuple[SimWrite, Callable[[list[Any]], None], Callable[[], None]]] = []
        self.read_at = [0] * len(env.log.partitions)  # the next offset to fold, per coordination partition
        self.read_lag = self.rng.uniform(*config.read_lag_s)
        self.alive = True
        self.leaving = False  # a graceful stop began: nothing more is claimed
        self.started_ms = EPOCH_MS + env.clock.now_ms  # a shutdown ordered before this is not for us
        self.frozen = False
        self.skew_ms = 0  # our records' ts is off by this
        self.clock_skew_ms = 0  # and the wall clock our decisions read (skew ...,of=clock)
        self.writes_lost_until = -1.0
        self.reads_stalled_until = -1.0
        self.slow_rate: float | None = None
        self.slow_since = 0.0
        self.busy_until = 0.0  # virtual seconds: the loop is waiting for a position lookup until then
        self.writer_id = id(self)  # only a key for write order in the log; never printed nor iterated
        self.amo = AmoBatchClaims(env, self, config.amo_whole_topics())
        self.shared = [
            SimSharedTopic(
                topic, count, topic in config.amo_topic_names(), env, self, MemberId(client, instance), self.rng
            )
            for topic, count in config.shared_counts().items()
        ]
        self.obeying = Obeying(self.me, self.started_ms, config.heartbeat_s / 2, config.shared_counts(), self)
        self.checkpoints = CheckpointWriting(
            self.me, self, config.heartbeat_s, round(config.checkpoint_interval_s * 1000)
        )

    # ------------------------------------------------------------- the loop

    def start(self) -> None:
        self.env.clock.after(self.rng.uniform(0, self.env.config.start_spread_s), self.loop_pass)

    def loop_pass(self) -> None:
        if not self.alive:
            return
        env = self.env
        now = env.clock.now
        if now < self.busy_until:  # looking positions up (position_lookup_s): the loop waits for Kafka
            env.clock.at(self.busy_until, self.loop_pass)
            return
        if not self.frozen:
            if now >= self.reads_stalled_until:
                self.read_log(now - self.read_lag)
            # The supervisor's order (supervisor.py): batch claims, verdicts, workers, shared topics, checkpoints,
            # orders, whole partitions.
            self.amo.step(now, self.assignments.values())
            self.collect(now)
            self.reap_workers(now)
            for shared in self.shared:
                shared.step(now)
            env.reading_on(self)
            self.checkpoints.step(now, self.running())
            self.obeying.step(now)
            self.claims.step(now)
            if (
                self.leaving
                and not self.assignments
                and not self.pending
                and self.claims.stopped()
                and all(shared.stopped() for shared in self.shared)
            ):
                self.alive = False  # left the group: every partition released
                return
        env.clock.after(env.config.tick_s, self.loop_pass)

    def read_log(self, until: float) -> None:
        """Fold what the log holds up to ``until`` (virtual seconds); note our own records' verdicts."""
        shared = self.env.shared
        if shared is not None:
            self._read_shared(shared, until)
            return
        world = self.world
        for partition, log in enumerate(self.env.log.partitions):
            position = self.read_at[partition]
            while position < len(log) and log[position].appended <= until:
                entry = log[position]
                self._fold(world, entry, partition)
                position += 1
            self.read_at[partition] = position

    def _read_shared(self, shared: SharedFold, until: float) -> None:
        """As ``read_log``, with the fleet's one fold of the log: our view is its state where we have read up to."""
        start = self.read_at[0]
        position = shared.position_at(start, until)
        if position == start:
            return
        self.read_at[0] = position
        self.world = shared.state_at(position)
        if shared.releases_between(start, position):
            self.claims.release_seen()
        for sent, _, _ in self.pending:
            sent.read_up_to(position)

    def _fold(self, world: WorldState, entry: Entry, partition: int) -> None:
        verdict = world.apply(entry.record, entry.at, partition)
        origin = entry.origin
        if origin is not None and origin.writer is self:
            origin.verdicts[entry.index] = verdict
        if verdict and type(entry.record) is codec.Release:
            self.claims.release_seen()

    def collect(self, now: float) -> None:
        """Run the callbacks of the writes decided (our fold gave every verdict) or overdue (failed)."""
        for write in list(self.pending):
            sent, on_verdicts, on_failure = write
            if sent.decided:
                self.pending.remove(write)
                on_verdicts(sent.verdicts)
            elif now > sent.deadline:
                self.pending.remove(write)
                on_failure()

    def write(
        self,
        records: list[codec.Record],
        on_verdicts: Callable[[list[Any]], None],
        on_failure: Callable[[], None],
        within: float | None = None,
        partitions: list[int] | None = None,
    ) -> None:
        env = self.env
        now = env.clock.now
        sent = SimWrite(self, records, deadline=now + (env.config.write_timeout_s if within is None else within))
        self.pending.append((sent, on_verdicts, on_failure))
        env.log.submit(self.writer_id, sent, lost=now < self.writes_lost_until, partitions=partitions)

    def common(self) -> dict[str, Any]:
        """A record's common fields; ``ts`` is our wall clock, skew and all (the fold uses the broker's time)."""
        return {
            "v": codec.VERSION,
            "ts": EPOCH_MS + self.env.clock.now_ms + self.skew_ms,
            "group": "sim",
            "client": self.me.client,
            "instance": self.me.instance,
        }

    def now_ms(self) -> int:
        """The time we compare with record times (our wall clock, as a supervisor's coordinator.now_ms)."""
        return EPOCH_MS + self.env.clock.now_ms + self.clock_skew_ms

    # ------------------------------------------- the shell the member core drives

    def running(self) -> bool:
        return not self.leaving

    def clock(self) -> float:
        return self.env.clock.now

    def lease_clock_ms(self) -> int:
        return self.env.clock.now_ms

    def fields(self) -> dict[str, Any]:
        return self.common()

    def read(self, query: Callable[[WorldState], T]) -> T:
        return query(self.world)

    def partition_counts(self) -> Mapping[str, int]:
        return self._partition_counts

    def submit(
        self,
        what: str,
        records: list[codec.Record],
        on_verdicts: OnVerdicts,
        on_failure: OnFailure,
        partitions: list[int] | None = None,
    ) -> None:
        self.write(records, on_verdicts, lambda: on_failure(NotConfirmed(what)), partitions=partitions)

    def submit_within(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None:
        self.write(records, on_verdicts, lambda: on_failure(NotConfirmed(what)), within=within)

    def read_folded(self, query: Callable[[WorldState, Sequence[int]], T]) -> T:
        return query(self.world, self.read_at)

    def partition_count(self) -> int:
        return len(self.env.log.partitions)

    def look_up(self, keys: list[Key], then: Callable[[dict[Key, Position]], None]) -> None:
        """Partitions never seen start at 0.  With ``position_lookup_s``, finding that out costs the loop a while,
        as a real supervisor's asks Kafka (committed, then reset offsets), its loop waiting."""
        found: dict[Key, Position] = {key: (0, []) for key in keys}
        lookup = self.env.config.position_lookup_s
        if lookup <= 0:
            then(found)
            return
        clock = self.env.clock
        self.busy_until = max(self.busy_until, clock.now) + lookup * self.rng.uniform(0.5, 1.5)
        clock.at(self.busy_until, lambda: self._looked_up(found, then))

    def _looked_up(self, found: dict[Key, Position], then: Callable[[dict[Key, Position]], None]) -> None:
        if not self.alive:
            return
        if self.frozen:  # the lookup resumes with the process
            self.env.clock.after(self.env.config.tick_s, lambda: self._looked_up(found, then))
            return
        then(found)

    def take(self, key: Key, start: int, skip: list[done_set.Range]) -> SimAssignment:
        now = self.env.clock.now
        assignment = SimAssignment(key, float(start), now, now + self.env.config.start_delay_s, claimed_at=now)
        self.env.resumed(self, key, start)
        self.env.holding(self, assignment)
        return assignment

    def start_worker(self, assignment: SimAssignment) -> None:
        pass  # it is up at worker_up_at (the fork)

    def stop_worker(self, assignment: SimAssignment) -> bool:
        if assignment.worker_up_at > self.env.clock.now:
            return False
        if assignment.stopping_at is None:
            assignment.stopping_at = self.env.clock.now + self.env.config.stop_delay_s
        return True

    def beat(self, assignment: SimAssignment, now: float) -> codec.Beat:
        """What a real supervisor reports with each beat (partition_claims.beat), so that the records have its
        size: the lag once the worker is up (it reports the high watermark), the smoothed consume rate once the
        health monitor has one (rounded to 0.1)."""
        offset = self.progress(assignment, now)
        lag = None if assignment.worker_up_at > now else max(self.env.high_watermark(assignment.key, now) - offset, 0)
        rate = assignment.health.consume_rate
        return codec.Beat(
            partition=assignment.key[1], offset=offset, lag=lag, rate=None if rate is None else round(max(rate, 0.0), 1)
        )

    def position(self, assignment: SimAssignment) -> tuple[int, list[int]]:
        return int(assignment.offset), []

    def sample(self, assignment: SimAssignment, now: float) -> Sample | None:
        """None while its worker is not up, or on its way out."""
        if assignment.worker_up_at > now or assignment.stopping_at is not None:
            return None
        return Sample(now, self.progress(assignment, now), self.env.high_watermark(assignment.key, now))

    def forgotten(self, assignment: SimAssignment) -> None:
        self.env.gone(self, assignment)

    def confirmed(self, positions: list[tuple[str, int, int]]) -> None:
        pass  # no group offsets to back the log up with

    def holding(self) -> Iterable[SimAssignment]:
        return self.assignments.values()

    def shut_down(self) -> None:
        self.leave()

    def drain(self, drained: bool) -> None:
        self.claims.drain(drained)

    def hold_back(self, topics: set[str]) -> None:
        for shared in self.shared:
            shared.leasing.held_back = shared.topic in topics

    def hand_over(self, assignment: SimAssignment, reason: str) -> None:
        self.claims.hand_over(assignment, reason)

    def refused(self, assignment: SimAssignment) -> None:
        """A batch claim refused: not ours, its worker stops (as the worker pool forgets a partition whose
        worker's claim was refused); or our lease had lapsed in the log: the worker asks again."""
        if not self.claims.owns(assignment):
            self.claims.lose(assignment)

    # ------------------------------------------------------------ workers

    def reap_workers(self, now: float) -> None:
        """Workers that exited: what that means for their partitions is the member core's, as for the worker
        pool (``settle_exit``); a simulated worker exits only when asked to."""
        for assignment in [a for a in self.assignments.values() if a.stopping_at is not None and a.stopping_at <= now]:
            self.progress(assignment, assignment.stopping_at)  # type: ignore[arg-type]
            if not settle_exit(assignment, self.claims, False, self.leaving):
                self.claims.release(assignment)

    def progress(self, assignment: SimAssignment, now: float) -> int:
        """The worker's next offset at ``now``: it handles at its rate from when it is up, only within its lease,
        never past the partition's end."""
        start = max(assignment.since, assignment.worker_up_at)
        end = min(now, assignment.lease_until_ms / 1000)
        if assignment.stopping_at is not None:
            end = min(end, assignment.stopping_at)
        if self.frozen:
            end = min(end, assignment.since)
        if end > start:
            rate = self.env.config.handler_rate if self.slow_rate is None else self.slow_rate
            before = int(assignment.offset)
            high = self.env.high_watermark(assignment.key, end)
            if self.amo.is_amo(assignment.key):  # at most once: nothing at or past the batch claimed
                high = max(min(high, assignment.claimed_end), before)
            assignment.offset = min(float(high), assignment.offset + rate * (end - start))
            if int(assignment.offset) > before:
                self.env.handled(assignment.key, before, int(assignment.offset))
        assignment.since = max(assignment.since, now)
        return int(assignment.offset)

    # -------------------------------------------------------------- faults

    def crash(self) -> None:
        """The host dies: its workers with it; writes already sent may still land."""
        self.alive = False
        now = self.env.clock.now
        for assignment in list(self.assignments.values()):
            if self.amo.is_amo(assignment.key):
                self.progress(assignment, now)  # what its worker handled up to the crash (at most once: counted)
            self.claims.forget(assignment)
        for shared in self.shared:
            shared.crash()

    def freeze(self) -> None:
        now = self.env.clock.now
        for assignment in self.assignments.values():
            self.progress(assignment, now)
        for shared in self.shared:
            shared.freeze(now)
        self.frozen = True

    def thaw(self) -> None:
        now = self.env.clock.now
        self.frozen = False
        for assignment in self.assignments.values():
            assignment.since = now  # nothing was handled while frozen
        for shared in self.shared:
            shared.thaw(now)

    def leave(self) -> None:
        """A graceful stop: nothing more is claimed; each worker stops and its partition is released."""
        self.leaving = True
        for shared in self.shared:
            shared.begin_stop()
        self.claims.begin_stop()

    def slow(self, rate: float | None) -> None:
        now = self.env.clock.now
        for assignment in self.assignments.values():
            self.progress(assignment, now)
        for shared in self.shared:
            shared.freeze(now)  # handled up to now at the old rate
        self.slow_rate = rate
        self.slow_since = now
