"""Whole partitions: claim, heartbeat, balance, release; the I/O around protocol/claiming.py's decisions.

The decisions (which partitions to claim, when to heartbeat, what to hand over for balance or health, what a
verdict means) are ClaimingPolicy's, a pure object the simulator drives too (marshal_workers/simulation/); this
component reads the clocks, writes, and keeps the workers' table.  Every write goes through InFlightWrites and its verdict comes back in a later
pass of the supervisor's loop, which never waits on Kafka.  A partition won
goes in the Table's ``to_start`` queue for the worker pool (worker_pool.py); a
heartbeat refused means the partition is lost.  AMO workers' batch claims are
message_claims.py's; shared partitions are leased by range instead
(shared_pool.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.committed_offsets import OffsetLookupError, OffsetStore
from marshal_workers.kafka.coordination_reader import drain
from marshal_workers.kafka.coordination_writer import Coordinator, Progress, heartbeat_verdicts
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol import done_set
from marshal_workers.protocol.claiming import ClaimingPolicy, ClaimingSettings, HealthCall
from marshal_workers.protocol.health import HealthPolicy, Sample
from marshal_workers.protocol.member_id import MemberId as Owner
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.channel import Field, Slot, above, monotonic_ms
from marshal_workers.runtime.supervisor.assignments import Assignment, Key, Phase, Table

_log = logging.getLogger(__name__)


class PartitionClaims:
    """The supervisor's component that claims and keeps whole partitions (component.py's interface).

    Its public methods (release, give_back, forget, owns, me) are what the worker pool and remote control
    ask of it when a worker exits or an operator orders a hand-over.
    """

    def __init__(
        self,
        table: Table,
        coordinator: Coordinator,
        writes: InFlightWrites,
        offsets: OffsetStore,
        settings: Settings,
        time_limits: dict[str, tuple[float, float]],
        counters: Counters,
        log: Any,
        new_slot: Callable[[int], Slot],
        shared_low_water_marks: Callable[[], list[tuple[str, int, int]]] | None = None,
    ) -> None:
        """``time_limits``: (soft, hard) seconds per topic; ``new_slot``: a worker's shared memory, at an offset;
        ``shared_low_water_marks``: the shared partitions' offsets to commit with each heartbeat, if any."""
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        self.offsets = offsets
        self.settings = settings
        self.counters = counters
        self.log = log
        self._new_slot = new_slot
        self._shared_low_water_marks = shared_low_water_marks
        self.policy = ClaimingPolicy(self.me(), claiming_settings(settings), random.Random())
        # A handler call in flight is progress until it passes its time limit (hard, else soft; none: ever).
        self.health_policies = {
            topic: self.policy.settings.health_policy(call_time_limit=hard or soft)
            for topic, (soft, hard) in time_limits.items()
        }  # fmt: skip

    # --------------------------------------------------------- the component

    def waitables(self) -> list[object]:
        """The coordinator's release events: a partition freed is claimed at once, not at the next round."""
        return [self.coordinator.release_events()]

    def step(self, now: float) -> None:
        """Heartbeat and balance every HB/2; claim free partitions every CLAIM_INTERVAL_S, or when one is released."""
        releases = self.coordinator.release_events()
        if releases in self.table.ready:
            drain(releases)
            self.policy.release_seen()  # a partition was released: try to take it now, not at the next tick
        if self.policy.heartbeat_due(now):
            self._heartbeat()
            self._rebalance()
        if self.policy.claim_due(now):
            self._claim_free_partitions()

    def begin_stop(self) -> None:
        """Nothing more is claimed (the phase says so); the worker pool releases each partition as its worker
        exits."""

    def stopped(self) -> bool:
        """No claim or release in flight (a claim won meanwhile is released)."""
        return self.policy.stopped()

    def cooling_down(self, now: float) -> list[Key]:
        """The partitions released as sick (or handed over) that we do not claim again yet."""
        return self.policy.cooling_down(now)

    # ------------------------------------------------------------- claims

    def _claim_free_partitions(self) -> None:
        if not self.table.running or not self.table.claiming:
            return
        coordinator, table, policy = self.coordinator, self.table, self.policy
        now_ms, monotonic = coordinator.now_ms(), time.monotonic()
        held = table.assignments.keys()
        free = coordinator.read(lambda world: policy.partitions_to_claim(world, table.partition_counts, held,
                                                                         monotonic, now_ms))  # fmt: skip
        if free:
            self._claim_all(free)

    def _claim(self, topic: str, partition: int, asking: bool = False) -> None:
        self._claim_all([(topic, partition)], asking)

    def _claim_all(self, keys: list[Key], asking: bool = False) -> None:
        """Write claims, all in one round trip; their verdicts (a later pass of the loop) start the workers."""
        if not self.table.running:
            return
        keys = self.policy.claims_sent(keys)
        if not keys:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        coordinator = self.coordinator
        self.writes.submit(
            "claim",
            [coordinator.claim_record(*key) for key in keys],
            lambda verdicts: self._after_claims(keys, verdicts, written_ms, asking),
            lambda exc: self._claims_failed(keys, exc),
        )

    def _claims_failed(self, keys: list[Key], exc: Exception) -> None:
        self.policy.claims_failed(keys)
        for key in keys:
            self.log.warning("claim of %s[%d] not confirmed: %s", *key, exc)

    def _after_claims(self, keys: list[Key], verdicts: list[bool], written_ms: int, asking: bool) -> None:
        """Start a worker for every claim accepted (positions looked up together), then heartbeat them all."""
        won = self.policy.claims_decided(keys, verdicts)
        refused = len(keys) - len(won)
        if asking:
            self.counters.asks += refused
        else:
            self.counters.claims_refused += refused
        self.counters.claims_accepted += len(won)
        started = []
        for key, position in self._start_positions(won).items():
            assignment = self._take(key, position, written_ms)
            if assignment is not None:
                started.append(assignment)
        if started:
            self._send_heartbeats(started)  # the log learns where they resume, without waiting for the next round

    def _take(self, key: Key, position: tuple[int, list[done_set.Range]], written_ms: int) -> Assignment | None:
        """A partition just claimed: its assignment and worker (None if a stop began and it was released)."""
        topic, partition = key
        start, skip = done_set.resume_past(*position)
        slot = self._new_slot(start)
        if skip:  # the heartbeat carries it on; a heartbeat without it would tell the log nothing is done
            slot.publish_done(start, done_set.encode(start, skip))
        assignment = Assignment(topic, partition, slot, started_offset=start)
        self.table.assignments[key] = assignment
        assignment.extend_lease(written_ms, self.settings.heartbeat_ms)
        self.log.info("claimed %s[%d], resuming at offset %d", topic, partition, start)
        if not self.table.running:
            self.release(assignment)  # the claim was in flight when a stop began
        elif self.table.stop_signalled:
            assignment.restart_at = time.monotonic()  # a stop is on its way: handling it releases this one, unforked
        else:
            self.table.to_start.append(assignment)  # the worker pool starts it, a few per pass of the loop
        return assignment if key in self.table.assignments else None

    def _start_positions(self, keys: list[Key]) -> dict[Key, tuple[int, list[done_set.Range]]]:
        """Where each partition resumes, and the done ranges above it: from the log; else the group's committed
        offsets (one lookup for all); else auto_offset_reset.  A partition whose position Kafka does not tell
        is left out: never guess a position; the claim lapses unused (2*HB) and the partition is tried again."""
        found = self.coordinator.read(lambda world: {key: _resume_position(world, *key) for key in keys})
        positions = {key: (resume, skip) for key, (resume, skip) in found.items() if resume is not None}
        unknown = [key for key in keys if key not in positions]
        if not unknown:
            return positions
        offsets = self.offsets
        try:
            committed = offsets.committed_many(unknown)
        except OffsetLookupError as exc:
            self.log.warning("claimed %d partition(s) but cannot tell where they start (%s): leaving them",
                             len(unknown), exc)  # fmt: skip
            return positions
        for key in unknown:
            offset = committed[key]
            if offset is not None:
                positions[key] = (offset, [])
        never_seen = [key for key in unknown if key not in positions]
        for key, reset in (offsets.reset_offsets(never_seen) if never_seen else {}).items():
            if isinstance(reset, OffsetLookupError):
                self.log.warning("claimed %s[%d] but cannot tell where it starts (%s): leaving it", *key, reset)
                continue
            self.log.info(
                "%s[%d] has no known position: starting at %s offset %d",
                *key, self.settings.auto_offset_reset, reset,
            )  # fmt: skip
            positions[key] = (reset, [])
        return positions

    def _heartbeat(self) -> None:
        """Heartbeat every partition we hold with its worker's progress; a refusal means it is lost."""
        held = [a for a in self.table.assignments.values() if not a.lost]
        if held:
            self._send_heartbeats(held)
        if self._shared_low_water_marks is not None:
            # Shared partitions: the low-water marks, as the group's offsets (a backup of the log's bookkeeping).
            self.offsets.commit(self._shared_low_water_marks())

    def _send_heartbeats(self, held: list[Assignment]) -> None:
        now = time.monotonic()
        progress = [_progress(a, now) for a in held]
        written_ms = monotonic_ms()  # before the write: the lease errs short
        self.writes.submit(
            "heartbeat",
            self.coordinator.heartbeat_records(progress),
            lambda verdicts: self._after_heartbeats(held, progress, heartbeat_verdicts(progress, verdicts), written_ms),
            self._heartbeat_failed,
        )

    def _heartbeat_failed(self, exc: Exception) -> None:
        self.log.warning("heartbeat not confirmed (leases run out unless the next one is): %s", exc)
        self.counters.heartbeat_failures += 1

    def _after_heartbeats(self, held: list[Assignment], progress: list[Progress], verdicts: list[bool], written_ms: int) -> None:
        backup = []
        for assignment, sent, accepted in zip(held, progress, verdicts):
            if self.table.assignments.get(assignment.key) is not assignment or assignment.lost:
                continue  # released, or lost, since this heartbeat was written
            if accepted:
                assignment.extend_lease(written_ms, self.settings.heartbeat_ms)
                self._check_health(assignment)
                backup.append((sent.topic, sent.partition, sent.offset))
            else:
                self._lose(assignment)
        # The backup holds only what we own: a lost partition's offset is its new owner's to commit.
        self.offsets.commit(backup)
        self.offsets.poll()

    def _check_health(self, assignment: Assignment) -> None:
        """One health cycle: release the partition if its worker cannot keep up and someone else can."""
        high = assignment.high_watermark
        if assignment.process is None or assignment.unhealthy or high is None:
            return
        now = time.monotonic()
        assignment.watch_call(now)
        sample = Sample(now, assignment.next_offset, high, assignment.slot.get(Field.PROCESSED), assignment.call)
        policy = self.health_policies[assignment.topic]
        coordinator, claiming = self.coordinator, self.policy
        assignment.health, verdict, call = claiming.judge_health(
            assignment.health, sample, policy, self.table.running,
            others=lambda: coordinator.read(lambda world: claiming.others_live(world, coordinator.now_ms())),
        )  # fmt: skip
        if call is HealthCall.KEEP:
            return
        where = f"{assignment.topic}[{assignment.partition}]"
        why = f"{verdict.value} (lag {sample.lag}{_call_note(sample, policy)})"
        if call is HealthCall.NO_ONE_ELSE:
            self.log.warning("%s is %s but no other member could take it: keeping it", where, why)
            return
        self.log.warning("%s is %s: handing it over to another member (release_if_behind)", where, why)
        assignment.unhealthy = True
        assignment.ask_worker_to_stop()

    def _lose(self, assignment: Assignment) -> None:
        """Someone else owns the partition: stop its worker at once, release nothing."""
        assignment.slot.set(Field.LEASE_UNTIL_MS, 0)
        assignment.lost = True
        self.counters.partitions_lost += 1
        coordinator = self.coordinator
        owner = coordinator.read(lambda world: world.owner(assignment.topic, assignment.partition))
        if owner is None:
            self.log.warning("%s[%d] was taken from us (a pause?): stopping its worker", assignment.topic, assignment.partition)
        else:
            self.log.warning("lost %s[%d] to %s: stopping its worker", assignment.topic, assignment.partition, owner)
        if owner is not None and owner.client == coordinator.client and owner.instance != coordinator.instance:
            self.log.error(
                "another process uses our client id %r and took our partitions: every instance needs its own "
                "--client-id; this one stops claiming",
                coordinator.client,
            )
            self.table.claiming = False
        if assignment.process is None:
            self.forget(assignment)
        else:
            assignment.ask_worker_to_stop()

    def me(self) -> Owner:
        coordinator = self.coordinator
        return Owner(coordinator.client, coordinator.instance)

    def _rebalance(self) -> None:
        """Hand partitions over to members that ask, and ask when we hold too few (ClaimingPolicy.rebalance)."""
        table = self.table
        if not table.running or not table.claiming or table.drained:
            return  # a drained member neither hands over by balance nor asks (it would look like a live member)
        coordinator, policy = self.coordinator, self.policy
        now_ms, now = coordinator.now_ms(), time.monotonic()
        total = sum(table.partition_counts.values())
        offered = sorted(
            (a for a in table.assignments.values() if not (a.lost or a.unhealthy or a.handing_over)),
            key=lambda a: a.claimed_at,
        )
        decided = coordinator.read(
            lambda world: policy.rebalance(world, total, len(table.assignments), [a.key for a in offered], now, now_ms)
        )
        if decided.hand_over:
            low, high = coordinator.read(lambda world: policy.share(world, total, now_ms))
            for key in decided.hand_over:
                self._hand_over(table.assignments[key], low, high)
        if decided.ask is not None:
            self._claim(*decided.ask, asking=True)  # accepted only if its owner went stale: a take-over

    def _hand_over(self, assignment: Assignment, low: int, high: int) -> None:
        self.log.info(
            "%s[%d]: handing it over (balance=fair: our share is %d to %d partitions)",
            assignment.topic, assignment.partition, low, high,
        )  # fmt: skip
        self.give_back(assignment)

    def give_back(self, assignment: Assignment) -> None:
        """Stop the partition's worker and release the partition when it exits, for another member to take."""
        assignment.handing_over = True
        if assignment.process is None:
            self.release_handed_over(assignment)
        else:
            assignment.ask_worker_to_stop()  # released when it exits

    def release_handed_over(self, assignment: Assignment) -> None:
        self.release(assignment)
        # Not ours to take back when the release wakes our claim loop: it is meant for another member.
        self.policy.handed_over(assignment.key, time.monotonic())

    def release(self, assignment: Assignment, sick: bool = False) -> None:
        """Write the release with the worker's progress, so the next owner resumes exactly there."""
        offset, done = _position(assignment)
        topic, partition = assignment.key
        self.forget(assignment)
        if not self.owns(assignment):
            # Only an owner's release means anything; another's could pass for an operator's during a pause.
            self.log.info("%s[%d] is no longer ours: nothing to release", topic, partition)
            return
        reason = _release_reason(self.table.phase, assignment, sick)
        self.counters.releases[reason] += 1
        self.policy.released(assignment.key, sick, time.monotonic())
        how = "as sick " if sick else ""

        def released(verdicts: list[bool]) -> None:
            self.policy.release_decided(assignment.key)
            refused = "" if verdicts[0] else " (refused: no longer ours)"
            self.log.info("released %s[%d] %sat offset %d%s", topic, partition, how, offset, refused)

        def failed(exc: Exception) -> None:
            self.policy.release_decided(assignment.key)
            self.log.error("release of %s[%d] at offset %d not confirmed: %s", topic, partition, offset, exc)

        self.writes.submit(
            "release", [self.coordinator.release_record(topic, partition, offset, done)], released, failed
        )

    def owns(self, assignment: Assignment) -> bool:
        owner = self.coordinator.read(lambda world: world.owner(assignment.topic, assignment.partition))
        return owner == self.me()

    def forget(self, assignment: Assignment) -> None:
        self.table.assignments.pop(assignment.key, None)


def claiming_settings(settings: Settings) -> ClaimingSettings:
    """What the claiming policy obeys, from a member's settings."""
    return ClaimingSettings(
        heartbeat_s=settings.heartbeat_interval, balance=settings.balance, max_partitions=settings.max_partitions,
        sick_cooldown_s=settings.sick_cooldown, release_if_behind=settings.release_if_behind,
        behind_cycles=settings.behind_cycles,
    )  # fmt: skip


def _progress(assignment: Assignment, now: float) -> Progress:
    """The heartbeat of one partition: its worker's position, with lag, rate, calls in flight (and the age of
    the oldest) and window use."""
    rate = assignment.health.consume_rate
    rate = None if rate is None else round(max(rate, 0.0), 1)
    offset, done = _position(assignment)
    call_age = assignment.call_age(now)
    return Progress(
        assignment.topic, assignment.partition, offset, assignment.lag, rate, done or None,
        assignment.calls_in_flight or None, assignment.slot.get(Field.WINDOW_USED) or None,
        None if call_age is None else round(call_age, 1),
    )  # fmt: skip


def _call_note(sample: Sample, policy: HealthPolicy) -> str:
    """For the log: the call in flight that made a partition stalled, past its time limit."""
    call = sample.call
    if call is None or not call.timed or not policy.call_time_limit or call.age(sample.at) <= policy.call_time_limit:
        return ""
    return f"; its handler call has run {call.age(sample.at):.0f}s, past its time limit of {policy.call_time_limit:g}s"


def _position(assignment: Assignment) -> tuple[int, list[int]]:
    """Where the next owner resumes, and the done set above it (ALO); AMO never resumes before a claim."""
    offset, done = assignment.slot.position()
    if assignment.claimed_end <= offset:
        return offset, done
    ranges = done_set.decode(offset, done)
    return assignment.claimed_end, done_set.encode(assignment.claimed_end, above(ranges, assignment.claimed_end))


def _release_reason(phase: Phase, assignment: Assignment, sick: bool) -> str:
    if sick:
        return "sick"
    if assignment.ordered is not None:
        return "operator"
    if assignment.handing_over:
        return "balance"
    return "shutdown" if phase is not Phase.RUNNING else "error"


def _resume_position(world: WorldState, topic: str, partition: int) -> tuple[int | None, list[done_set.Range]]:
    state = world.get(topic, partition)
    return (None, []) if state is None else (state.resume_offset, state.skip_ranges())
