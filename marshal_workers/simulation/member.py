"""A simulated member: the supervisor's component for whole partitions, on the virtual clock and log.

It is the I/O shell that runtime/supervisor/partition_claims.py is for a real supervisor, around the same
``ClaimingPolicy`` (protocol/claiming.py): it reads its fold of the log, collects the verdicts of its writes,
and asks the policy what to claim, heartbeat, hand over and release, every pass of its loop (``tick_s``).  Its
workers are numbers: each handles its partition at the handler's rate, only while its lease holds (the lease
rule is ``claiming.lease_until``, as a real worker's), and stops a little after it is asked to.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from marshal_workers.member.record_chunks import beat_chunks, entry_verdicts, heartbeat_records
from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import ClaimingPolicy, ClaimingSettings, HealthCall, Key, lease_until
from marshal_workers.protocol.health import PartitionHealth, Sample
from marshal_workers.protocol.member_id import MemberId as Holder
from marshal_workers.protocol.member_id import MemberId as Owner
from marshal_workers.protocol.worker_supply import PoolLease as LeasedRange
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.amo_claims import AmoBatchClaims
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.shared_fold import SharedFold
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.sim_log import EPOCH_MS, Entry, SimulatedLog, SimWrite
from marshal_workers.simulation.simulated_shared_workers import SimSharedTopic


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

    def before_heartbeat(self, member: SimMember, now: float) -> None: ...

    def gone(self, member: SimMember, assignment: SimAssignment) -> None: ...

    def resumed(self, member: SimMember, key: Key, offset: int) -> None: ...

    def handled(self, key: Key, start: int, offset: int) -> None: ...

    def lease_taken(self, owner: object, topic: str, leased: LeasedRange) -> None: ...

    def lease_dropped(self, owner: object, topic: str, leased: LeasedRange) -> None: ...

    def range_handled(self, topic: str, partition: int, start: int, end: int) -> None: ...


class SimMember:
    """One instance of a member (a crash and restart makes a new one with the same client)."""

    def __init__(self, env: Environment, number: int, client: str, instance: str, world: WorldState,
                 settings: ClaimingSettings) -> None:  # fmt: skip
        self.env = env
        self.number = number
        self.me = Owner(client, instance)
        self.world = world
        config = env.config
        self.rng = random.Random(f"{config.seed}/{client}/{instance}")  # str seeds hash the same in every process
        self.policy = ClaimingPolicy(self.me, settings, self.rng)
        self.health_policy = settings.health_policy(call_time_limit=0.0)
        self.partition_counts = config.whole_counts()  # shared topics are leased by ranges, never claimed whole
        self.total = sum(self.partition_counts.values())
        self.assignments: dict[Key, SimAssignment] = {}
        self.pending: list[tuple[SimWrite, Callable[[list[Any]], None], Callable[[], None]]] = []
        self.read_at = [0] * len(env.log.partitions)  # the next offset to fold, per coordination partition
        self.read_lag = self.rng.uniform(*config.read_lag_s)
        self.alive = True
        self.running = True  # False once it leaves (a graceful stop)
        self.claiming = True
        self.drained = False  # by an operator (simulation/operator.py): claim nothing, hand everything over
        self.started_ms = EPOCH_MS + env.clock.now_ms  # a shutdown ordered before this is not for us
        self.release_seen = False
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
        self.shared = [SimSharedTopic(topic, count, topic in config.amo_topic_names(), env, self,
                                      Holder(client, instance), self.rng)
                       for topic, count in config.shared_counts().items()]  # fmt: skip

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
                self.read(now - self.read_lag)
            self.collect(now)
            self.reap_workers(now)
            self.step(now)
            self.amo.step(now, self.assignments.values())
            for shared in self.shared:
                shared.step(now)
            if not self.running and not self.assignments and not self.pending and self.policy.stopped() and all(
                shared.stopped() for shared in self.shared
            ):
                self.alive = False  # left the group: every partition released
                return
        env.clock.after(env.config.tick_s, self.loop_pass)

    def read(self, until: float) -> None:
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
        """As ``read``, with the fleet's one fold of the log: our view is its state where we have read up to."""
        start = self.read_at[0]
        position = shared.position_at(start, until)
        if position == start:
            return
        self.read_at[0] = position
        self.world = shared.state_at(position)
        if shared.releases_between(start, position):
            self.release_seen = True
        for sent, _, _ in self.pending:
            sent.read_up_to(position)

    def _fold(self, world: WorldState, entry: Entry, partition: int) -> None:
        verdict = world.apply(entry.record, entry.at, partition)
        origin = entry.origin
        if origin is not None and origin.writer is self:
            origin.verdicts[entry.index] = verdict
        if verdict and type(entry.record) is codec.Release:
            self.release_seen = True

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

    def write(self, records: list[codec.Record], on_verdicts: Callable[[list[Any]], None],
              on_failure: Callable[[], None], within: float | None = None,
              partitions: list[int] | None = None) -> None:  # fmt: skip
        env = self.env
        now = env.clock.now
        sent = SimWrite(self, records, deadline=now + (env.config.write_timeout_s if within is None else within))
        self.pending.append((sent, on_verdicts, on_failure))
        env.log.submit(self.writer_id, sent, lost=now < self.writes_lost_until, partitions=partitions)

    def common(self) -> dict[str, Any]:
        """A record's common fields; ``ts`` is our wall clock, skew and all (the fold uses the broker's time)."""
        return {"v": codec.VERSION, "ts": EPOCH_MS + self.env.clock.now_ms + self.skew_ms,
                "group": "sim", "client": self.me.client, "instance": self.me.instance}  # fmt: skip

    def now_ms(self) -> int:
        """The time we compare with record times (our wall clock, as a supervisor's coordinator.now_ms)."""
        return EPOCH_MS + self.env.clock.now_ms + self.clock_skew_ms

    # ------------------------------------------------------------- the step

    def step(self, now: float) -> None:
        policy = self.policy
        if self.release_seen:
            self.release_seen = False
            policy.release_seen()
        if policy.heartbeat_due(now):
            self.env.before_heartbeat(self, now)  # operators' orders, checkpoints
            self.heartbeat(now)
            self.rebalance(now)
        if policy.claim_due(now):
            self.claim_free(now)

    def claim_free(self, now: float) -> None:
        if not self.running or not self.claiming or self.drained:
            return
        free = self.policy.partitions_to_claim(self.world, self.partition_counts, self.assignments.keys(), now,
                                               self.now_ms())  # fmt: skip
        if free:
            self.claim_all(free)

    def claim_all(self, keys: list[Key]) -> None:
        if not self.running:
            return
        keys = self.policy.claims_sent(keys)
        if not keys:
            return
        written_ms = self.env.clock.now_ms  # before the write: the lease errs short
        common = self.common()
        records: list[codec.Record] = [codec.Claim(**common, topic=t, partition=p) for t, p in keys]
        self.write(records, lambda verdicts: self.after_claims(keys, verdicts, written_ms),
                   lambda: self.policy.claims_failed(keys))  # fmt: skip

    def after_claims(self, keys: list[Key], verdicts: list[Any], written_ms: int) -> None:
        won = self.policy.claims_decided(keys, [bool(v) for v in verdicts])
        positions = {}
        for key in won:
            state = self.world.get(*key)
            positions[key] = None if state is None else state.resume_offset
        lookup = self.env.config.position_lookup_s
        if lookup > 0 and any(resume is None for resume in positions.values()):
            # Not in the log: a real supervisor asks Kafka (committed, then reset offsets), its loop waiting.
            clock = self.env.clock
            self.busy_until = max(self.busy_until, clock.now) + lookup * self.rng.uniform(0.5, 1.5)
            clock.at(self.busy_until, lambda: self.start_won(positions, written_ms))
        else:
            self.start_won(positions, written_ms)

    def start_won(self, positions: dict[Key, int | None], written_ms: int) -> None:
        """Take the partitions won (a partition never seen starts at 0), then heartbeat them all."""
        if not self.alive:
            return
        if self.frozen:  # the lookup resumes with the process
            self.env.clock.after(self.env.config.tick_s, lambda: self.start_won(positions, written_ms))
            return
        started = []
        for key, resume in positions.items():
            assignment = self.take(key, 0 if resume is None else resume, written_ms)
            if assignment is not None:
                started.append(assignment)
        if started:
            self.send_heartbeats(started)

    def take(self, key: Key, start: int, written_ms: int) -> SimAssignment | None:
        now = self.env.clock.now
        assignment = SimAssignment(key, float(start), now, now + self.env.config.start_delay_s, claimed_at=now)
        assignment.lease_until_ms = lease_until(written_ms, self.env.config.heartbeat_ms)
        self.assignments[key] = assignment
        self.env.resumed(self, key, start)
        self.env.holding(self, assignment)
        if not self.running:
            self.release(assignment)  # the claim was in flight when the stop began
            return None
        return assignment

    def heartbeat(self, now: float) -> None:
        held = [a for a in self.assignments.values() if not a.lost]
        if held:
            self.send_heartbeats(held)

    def send_heartbeats(self, held: list[SimAssignment]) -> None:
        now = self.env.clock.now
        offsets = [self.progress(a, now) for a in held]
        written_ms = self.env.clock.now_ms
        topics = [a.key[0] for a in held]
        reports = [self.lag_and_rate(a, offset, now) for a, offset in zip(held, offsets)]
        beats = [codec.Beat(partition=a.key[1], offset=offset, lag=lag, rate=rate)
                 for a, offset, (lag, rate) in zip(held, offsets, reports)]  # fmt: skip
        chunks = beat_chunks(topics, [0] * len(held))  # split as a real member splits them (no done sets here)
        records = heartbeat_records(self.common(), topics, beats, chunks)

        def decided(verdicts: list[Any]) -> None:
            accepted = entry_verdicts(chunks, verdicts, len(held))
            self.after_heartbeats(held, accepted, written_ms)

        self.write(records, decided, lambda: None)  # a heartbeat not confirmed: the leases run out

    def lag_and_rate(self, assignment: SimAssignment, offset: int, now: float) -> tuple[int | None, float | None]:
        """What a real supervisor reports with each beat (partition_claims._progress), so that the records have
        its size: the lag once the worker is up (it reports the high watermark), the smoothed consume rate
        once the health monitor has one (rounded to 0.1)."""
        lag = None if assignment.worker_up_at > now else max(self.env.high_watermark(assignment.key, now) - offset, 0)
        rate = assignment.health.consume_rate
        return lag, None if rate is None else round(max(rate, 0.0), 1)

    def after_heartbeats(self, held: list[SimAssignment], accepted: list[bool], written_ms: int) -> None:
        for assignment, ok in zip(held, accepted):
            if self.assignments.get(assignment.key) is not assignment or assignment.lost:
                continue  # released, or lost, since this heartbeat was written
            if ok:
                lease = lease_until(written_ms, self.env.config.heartbeat_ms)
                assignment.lease_until_ms = max(assignment.lease_until_ms, lease)  # a late verdict never shortens it
                self.check_health(assignment)
            else:
                self.lose(assignment)

    def check_health(self, assignment: SimAssignment) -> None:
        now = self.env.clock.now
        if assignment.worker_up_at > now or assignment.unhealthy or assignment.stopping_at is not None:
            return
        sample = Sample(now, self.progress(assignment, now), self.env.high_watermark(assignment.key, now))
        now_ms, policy, world = self.now_ms(), self.policy, self.world
        assignment.health, _, call = policy.judge_health(
            assignment.health,
            sample,
            self.health_policy,
            self.running,
            others=lambda: policy.others_live(world, now_ms),
        )
        if call is HealthCall.HAND_OVER:
            assignment.unhealthy = True
            self.stop_worker(assignment)

    def lose(self, assignment: SimAssignment) -> None:
        """Someone else owns the partition: the worker stops at once (its lease is void), nothing is released."""
        assignment.lease_until_ms = 0
        assignment.lost = True
        owner = self.world.owner(*assignment.key)
        if owner is not None and owner.client == self.me.client and owner.instance != self.me.instance:
            self.claiming = False  # another instance of our client: claim nothing more (as a supervisor does)
        if assignment.worker_up_at > self.env.clock.now:
            self.forget(assignment)
        else:
            self.stop_worker(assignment)

    def rebalance(self, now: float) -> None:
        if not self.running or not self.claiming or self.drained:
            return
        offered = sorted(
            (a for a in self.assignments.values() if not (a.lost or a.unhealthy or a.handing_over)),
            key=lambda a: a.claimed_at,
        )
        decided = self.policy.rebalance(self.world, self.total, len(self.assignments), [a.key for a in offered], now,
                                        self.now_ms())  # fmt: skip
        for key in decided.hand_over:
            self.give_back(self.assignments[key])
        if decided.ask is not None:
            self.claim_all([decided.ask])  # accepted only if its owner went stale: a take-over

    def give_back(self, assignment: SimAssignment) -> None:
        assignment.handing_over = True
        if assignment.worker_up_at > self.env.clock.now:
            self.release_handed_over(assignment)
        else:
            self.stop_worker(assignment)

    def release_handed_over(self, assignment: SimAssignment) -> None:
        self.release(assignment)
        self.policy.handed_over(assignment.key, self.env.clock.now)

    def release(self, assignment: SimAssignment, sick: bool = False) -> None:
        offset = self.amo.release_offset(assignment)
        key = assignment.key
        self.forget(assignment)
        if self.world.owner(*key) != self.me:
            return  # only an owner's release means anything
        policy = self.policy
        policy.released(key, sick, self.env.clock.now)
        record = codec.Release(**self.common(), topic=key[0], partition=key[1], offset=offset)
        self.write([record], lambda verdicts: policy.release_decided(key), lambda: policy.release_decided(key))

    def forget(self, assignment: SimAssignment) -> None:
        if self.assignments.get(assignment.key) is assignment:
            del self.assignments[assignment.key]
        self.env.gone(self, assignment)

    # ------------------------------------------------------------ workers

    def stop_worker(self, assignment: SimAssignment) -> None:
        if assignment.stopping_at is None:
            assignment.stopping_at = self.env.clock.now + self.env.config.stop_delay_s

    def reap_workers(self, now: float) -> None:
        """Workers that exited: release their partitions as the worker pool does (sick, handed over, lost)."""
        for assignment in [a for a in self.assignments.values() if a.stopping_at is not None and a.stopping_at <= now]:
            self.progress(assignment, assignment.stopping_at)  # type: ignore[arg-type]
            if assignment.lost:
                self.forget(assignment)
            elif assignment.unhealthy:
                self.release(assignment, sick=True)
            elif assignment.handing_over:
                self.release_handed_over(assignment)
            else:
                self.release(assignment)  # a graceful stop

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
            self.forget(assignment)
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
        self.running = False
        for shared in self.shared:
            shared.begin_stop()
        for assignment in list(self.assignments.values()):
            if assignment.worker_up_at > self.env.clock.now:
                self.release(assignment)
            else:
                self.stop_worker(assignment)

    # ------------------------------------------------------ operators' orders

    def shared_topics(self) -> list[str]:
        return [shared.topic for shared in self.shared]

    def shut_down(self) -> None:
        self.leave()

    def drain(self, drained: bool) -> None:
        self.drained = drained

    def hold_back(self, topics: set[str]) -> None:
        for shared in self.shared:
            shared.leasing.held_back = shared.topic in topics

    def hand_over(self, assignment: SimAssignment, reason: str) -> None:
        self.give_back(assignment)

    def slow(self, rate: float | None) -> None:
        now = self.env.clock.now
        for assignment in self.assignments.values():
            self.progress(assignment, now)
        for shared in self.shared:
            shared.freeze(now)  # handled up to now at the old rate
        self.slow_rate = rate
        self.slow_since = now
