"""The policy for whole partitions: claim, heartbeat, balance, answer AMO batch claims, release.

Every write goes through InFlightWrites and its verdict comes back in a later
pass of the supervisor's loop, which never waits on Kafka.  A partition won
gets a worker (worker_pool.py); a heartbeat refused means the partition is
lost.  Shared partitions are leased by range instead (shared_pool.py).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from marshal_workers.kafka.coordinator import Progress, heartbeat_verdicts, message_claim_verdicts
from marshal_workers.kafka.offsets import OffsetLookupError
from marshal_workers.protocol import done_set
from marshal_workers.protocol.balance import (
    FairShare,
    claim_cap,
    fair_share,
    greedy_claims,
    is_hungry,
    partition_to_ask_for,
    partitions_to_hand_over,
    settled,
    yields_to_askers,
)
from marshal_workers.protocol.health import HealthPolicy, PartitionHealth, Sample, observe
from marshal_workers.protocol.world_state import Owner, WorldState
from marshal_workers.runtime.channel import ClaimAnswer, Field, Slot, above, monotonic_ms
from marshal_workers.runtime.messages import ClaimMessages, ClaimVerdict, FromWorker, Outcomes
from marshal_workers.runtime.supervisor.assignments import Assignment, Key, MessageClaim, Phase, SupervisorState

_log = logging.getLogger(__name__)
CLAIMS_PER_TICK = 4  # our first claims (others see us), and partitions free for an HB, per round


class PartitionClaims(SupervisorState):
    """The Supervisor's part that claims and keeps whole partitions (a mixin: the state is the supervisor's)."""

    if TYPE_CHECKING:  # provided by the other parts

        def _stop_worker(self, assignment: Assignment) -> None: ...
        def _start_worker(self, assignment: Assignment) -> None: ...
        def _watch_call(self, assignment: Assignment, now: float) -> None: ...

    def _claim_free_partitions(self) -> None:
        if self.phase is not Phase.RUNNING or not self.claiming:
            return
        coordinator = self._require_coordinator()
        now_ms, monotonic = coordinator.now_ms(), time.monotonic()
        room = (self.settings.max_partitions or float("inf")) - self._held_or_claiming()
        if room <= 0:
            return
        busy = self.assignments.keys() | self._claiming | self._releasing
        wanted = [
            (topic, p)
            for topic, count in self.partition_counts.items()
            for p in range(count)
            if (topic, p) not in busy and self.cooldown_until.get((topic, p), 0) <= monotonic
        ]
        me = self._me()
        free = coordinator.read(lambda world: [key for key in wanted if world.is_free(*key, now_ms, *me)])
        self._free_since = {key: self._free_since.get(key, monotonic) for key in free}
        random.shuffle(free)
        if not self._announced:
            # Our first claims tell the members that start with us that we are here: claim a few, then our part.
            free = free[:CLAIMS_PER_TICK]
        elif self.settings.balance == "fair":
            free = self._fair_claims(free, now_ms, monotonic)
        else:
            members = len(self._group_view(now_ms)[0])
            free = free[: greedy_claims(len(free), members, CLAIMS_PER_TICK)]
        if free:
            self._announced = True
            self._claim_all(free[: int(min(room, len(free)))])

    def _fair_claims(self, free: list[Key], now_ms: int, monotonic: float) -> list[Key]:
        """balance="fair": which free partitions to claim.  One freed just now only up to our share, and not
        while a member that asks for partitions could take it; one free for an HB is anyone's (a few a round)."""
        counts, askers = self._group_view(now_ms)
        share = fair_share(sum(self.partition_counts.values()), len(counts))
        long_free = [key for key in free if monotonic - self._free_since[key] >= self.hb_s][:CLAIMS_PER_TICK]
        if yields_to_askers(self._me(), counts, share, askers):
            return long_free
        room = claim_cap(share, self.settings.max_partitions) - self._held_or_claiming()
        just_freed = [key for key in free if monotonic - self._free_since[key] < self.hb_s]
        return just_freed[: max(room, 0)] + long_free

    def _held_or_claiming(self) -> int:
        return len(self.assignments) + len(self._claiming)

    def _claim(self, topic: str, partition: int, asking: bool = False) -> None:
        self._claim_all([(topic, partition)], asking)

    def _claim_all(self, keys: list[Key], asking: bool = False) -> None:
        """Write claims, all in one round trip; their verdicts (a later pass of the loop) start the workers."""
        keys = [key for key in keys if key not in self._claiming]
        if self.phase is not Phase.RUNNING or not keys:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        self._claiming.update(keys)
        coordinator = self._require_coordinator()
        self._require_writes().submit(
            "claim",
            [coordinator.claim_record(*key) for key in keys],
            lambda verdicts: self._after_claims(keys, verdicts, written_ms, asking),
            lambda exc: self._claims_failed(keys, exc),
        )

    def _claims_failed(self, keys: list[Key], exc: Exception) -> None:
        self._claiming.difference_update(keys)
        for key in keys:
            self.log.warning("claim of %s[%d] not confirmed: %s", *key, exc)

    def _after_claims(self, keys: list[Key], verdicts: list[bool], written_ms: int, asking: bool) -> None:
        """Start a worker for every claim accepted (positions looked up together), then heartbeat them all."""
        self._claiming.difference_update(keys)
        won = [key for key, accepted in zip(keys, verdicts) if accepted]
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
        assert self._context is not None
        topic, partition = key
        start, skip = done_set.resume_past(*position)
        slot = Slot.create(self._context, start)
        if skip:  # the heartbeat carries it on; a heartbeat without it would tell the log nothing is done
            slot.publish_done(start, done_set.encode(start, skip))
        assignment = Assignment(topic, partition, slot, started_offset=start)
        self.assignments[key] = assignment
        self._extend_lease(assignment, written_ms)
        self.log.info("claimed %s[%d], resuming at offset %d", topic, partition, start)
        if self.phase is not Phase.RUNNING:
            self._release(assignment)  # the claim was in flight when a stop began
        elif self._stop_signalled:
            assignment.restart_at = time.monotonic()  # a stop is on its way: handling it releases this one, unforked
        else:
            self._to_start.append(assignment)  # started by _start_queued_workers, a few per pass of the loop
        return assignment if key in self.assignments else None

    def _start_positions(self, keys: list[Key]) -> dict[Key, tuple[int, list[done_set.Range]]]:
        """Where each partition resumes, and the done ranges above it: from the log; else the group's committed
        offsets (one lookup for all); else auto_offset_reset.  A partition whose position Kafka does not tell
        is left out: never guess a position; the claim lapses unused (2*HB) and the partition is tried again."""
        found = self._require_coordinator().read(lambda world: {key: _resume_position(world, *key) for key in keys})
        positions = {key: (resume, skip) for key, (resume, skip) in found.items() if resume is not None}
        unknown = [key for key in keys if key not in positions]
        if not unknown:
            return positions
        offsets = self._require_offsets()
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
        held = [a for a in self.assignments.values() if not a.lost]
        if held:
            self._send_heartbeats(held)
        if self.shared.topics:
            # Shared partitions: the low-water marks, as the group's offsets (a backup of the log's bookkeeping).
            self._require_offsets().commit(self.shared.low_water_marks())

    def _send_heartbeats(self, held: list[Assignment]) -> None:
        now = time.monotonic()
        progress = [_progress(a, now) for a in held]
        written_ms = monotonic_ms()  # before the write: the lease errs short
        self._require_writes().submit(
            "heartbeat",
            self._require_coordinator().heartbeat_records(progress),
            lambda verdicts: self._after_heartbeats(held, progress, heartbeat_verdicts(progress, verdicts), written_ms),
            self._heartbeat_failed,
        )

    def _heartbeat_failed(self, exc: Exception) -> None:
        self.log.warning("heartbeat not confirmed (leases run out unless the next one is): %s", exc)
        self.counters.heartbeat_failures += 1

    def _after_heartbeats(self, held: list[Assignment], progress: list[Progress], verdicts: list[bool], written_ms: int) -> None:
        backup = []
        for assignment, sent, accepted in zip(held, progress, verdicts):
            if self.assignments.get(assignment.key) is not assignment or assignment.lost:
                continue  # released, or lost, since this heartbeat was written
            if accepted:
                self._extend_lease(assignment, written_ms)
                self._check_health(assignment)
                backup.append((sent.topic, sent.partition, sent.offset))
            else:
                self._lose(assignment)
        # The backup holds only what we own: a lost partition's offset is its new owner's to commit.
        self._require_offsets().commit(backup)
        self._require_offsets().poll()

    def _check_health(self, assignment: Assignment) -> None:
        """One health cycle: release the partition if its worker cannot keep up and someone else can."""
        high = assignment.high_watermark
        if assignment.process is None or assignment.unhealthy or high is None:
            return
        now = time.monotonic()
        self._watch_call(assignment, now)
        sample = Sample(now, assignment.next_offset, high, assignment.slot.get(Field.PROCESSED), assignment.call)
        policy = self.health_policies[assignment.topic]
        assignment.health, verdict = observe(assignment.health, sample, policy)
        if not verdict.release or not self.settings.release_if_behind or self.phase is not Phase.RUNNING:
            return
        where = f"{assignment.topic}[{assignment.partition}]"
        why = f"{verdict.value} (lag {sample.lag}{_call_note(sample, policy)})"
        coordinator = self._require_coordinator()
        others = coordinator.read(lambda world: world.live_members(coordinator.now_ms())) - {self._me()}
        if not others:
            self.log.warning("%s is %s but no other member could take it: keeping it", where, why)
            assignment.health = PartitionHealth()  # judge it afresh rather than warn every cycle
            return
        self.log.warning("%s is %s: handing it over to another member (release_if_behind)", where, why)
        assignment.unhealthy = True
        self._stop_worker(assignment)

    def _extend_lease(self, assignment: Assignment, written_ms: int) -> None:
        """Hold the partition until 2*HB after our accepted record, minus half an HB of safety."""
        lease = written_ms + int(1.5 * self.settings.heartbeat_ms)
        if lease > assignment.slot.get(Field.LEASE_UNTIL_MS):  # a late verdict never shortens it
            assignment.slot.set(Field.LEASE_UNTIL_MS, lease)

    def _lose(self, assignment: Assignment) -> None:
        """Someone else owns the partition: stop its worker at once, release nothing."""
        assignment.slot.set(Field.LEASE_UNTIL_MS, 0)
        assignment.lost = True
        self.counters.partitions_lost += 1
        coordinator = self._require_coordinator()
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
            self.claiming = False
        if assignment.process is None:
            self._forget(assignment)
        else:
            self._stop_worker(assignment)

    def _me(self) -> Owner:
        coordinator = self._require_coordinator()
        return Owner(coordinator.client, coordinator.instance)

    def _group_view(self, now_ms: int) -> tuple[dict[Owner, int], set[Owner]]:
        """The live members of the group (us included) with the partitions each holds, and who asks for more."""
        me = self._me()

        def view(world: WorldState) -> tuple[dict[Owner, int], set[Owner]]:
            held = world.holdings(now_ms)
            counts = {member: len(held.get(member, ())) for member in world.live_members(now_ms) | {me}}
            return counts, world.askers(now_ms)

        return self._require_coordinator().read(view)

    def _rebalance(self) -> None:
        """balance="fair": hand partitions over to members that ask, and ask when we hold too few.

        Asking is a claim of the busiest member's partition: refused while its
        owner lives, but the refusal is in the log, so every member sees who
        asks.  With balance="greedy" only an idle member asks, so the health
        monitor knows someone could take a partition.
        """
        if self.phase is not Phase.RUNNING or not self.claiming or self.drained:
            return  # a drained member neither hands over by balance nor asks (it would look like a live member)
        coordinator = self._require_coordinator()
        now_ms, now, me = coordinator.now_ms(), time.monotonic(), self._me()
        if self.settings.balance == "fair":
            counts, askers = self._group_view(now_ms)
            share = fair_share(sum(self.partition_counts.values()), len(counts))
            held = [a for a in self.assignments.values() if not (a.lost or a.unhealthy or a.handing_over)]
            counts[me] = len(held)
            hungry = is_hungry(len(self.assignments), share, self.settings.max_partitions)
            if hungry:
                askers.add(me)  # about to ask, if not already
            wanted = partitions_to_hand_over(me, counts, share, askers)
            self._balance, count = settled(self._balance, wanted, now, settle_s=self.hb_s)
            for assignment in sorted(held, key=lambda a: a.claimed_at)[len(held) - count :] if count else []:
                self._hand_over(assignment, share)
        else:
            hungry = not self.assignments
        if hungry and now >= self.timers.ask and not coordinator.read(lambda world: world.is_paused(now_ms)):
            self.timers.ask = now + self.hb_s  # once per HB keeps us visible (2*HB) at one record per HB
            wanted_key = partition_to_ask_for(coordinator.read(lambda world: world.holdings(now_ms)), me)
            if wanted_key is not None:
                self._claim(*wanted_key, asking=True)  # accepted only if its owner went stale: a take-over

    def _hand_over(self, assignment: Assignment, share: FairShare) -> None:
        self.log.info(
            "%s[%d]: handing it over (balance=fair: our share is %d to %d partitions)",
            assignment.topic, assignment.partition, share.low, share.high,
        )  # fmt: skip
        self._give_back(assignment)

    def _give_back(self, assignment: Assignment) -> None:
        """Stop the partition's worker and release the partition when it exits, for another member to take."""
        assignment.handing_over = True
        if assignment.process is None:
            self._release_handed_over(assignment)
        else:
            self._stop_worker(assignment)  # released when it exits

    def _release_handed_over(self, assignment: Assignment) -> None:
        self._release(assignment)
        # Not ours to take back when the release wakes our claim loop: it is meant for another member.
        self.cooldown_until[assignment.key] = time.monotonic() + 2 * self.hb_s

    def _submit_message_claims(self) -> None:
        """Write every AMO batch claim the workers asked for, all in one go, without waiting.

        Group commit: while one message-claim write is in flight, the claims asked meanwhile wait for it and
        then go together in the next one.  Under load that is one write for most of the workers' claims
        instead of one each; the embedded broker spent most of an AMO fleet's CPU on those writes.
        """
        ready = self.ready
        for assignment in self.assignments.values():
            connection = assignment.connection
            # One message per pass, from the pipes the loop's wait found readable: a second one keeps its pipe
            # readable, so the next wait returns at once (Connection.poll would build a selector per call).
            if connection is None or connection not in ready:
                continue
            try:
                message: FromWorker = connection.recv()
                if isinstance(message, Outcomes):  # what became of failed calls
                    if isinstance(message.counts, dict):
                        self.counters.add_outcomes(assignment.topic, message.counts)
                    continue
                if isinstance(message, ClaimMessages):
                    self._held_claims.append((assignment, connection, message.end))
            except (EOFError, OSError):
                assignment.connection = None  # the worker is gone; reaping deals with it
        if not self._message_claims_in_flight:
            self._write_held_claims()

    def _write_held_claims(self) -> None:
        """Write the held claims of the workers still there; refuse those of partitions no longer ours."""
        asked: list[MessageClaim] = []
        for assignment, connection, end in self._held_claims:
            if assignment.connection is not connection:
                continue  # that worker is gone: its successor asks for itself
            if assignment.lost:
                self._answer(assignment, ClaimAnswer.REFUSED)  # not ours: refused without asking the log
            else:
                asked.append((assignment, connection, end))
        self._held_claims = []
        if not asked:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        claims = [(a.topic, a.partition, end) for a, _, end in asked]
        self._message_claims_in_flight = True
        self._require_writes().submit(
            "message claim",
            self._require_coordinator().message_claims(claims),
            lambda verdicts: self._after_message_claims(asked, message_claim_verdicts(claims, verdicts), written_ms),
            lambda exc: self._message_claims_failed(asked, exc),
            # Fail fast: a worker waits on this.  Told so, it asks again (the log keeps the highest claim).
            within=self.hb_s,
        )

    def _after_message_claims(self, asked: list[MessageClaim], verdicts: list[bool], written_ms: int) -> None:
        """Answer the workers whose claims have been folded: claimed (handle it) or refused (not ours: stop).
        Then write the claims held meanwhile."""
        for (assignment, connection, end), accepted in zip(asked, verdicts):
            if accepted:
                assignment.claimed_end = max(assignment.claimed_end, end)
                self._extend_lease(assignment, written_ms)
            if assignment.connection is connection:  # not a worker that has since been replaced
                self._answer(assignment, ClaimAnswer.CLAIMED if accepted else ClaimAnswer.REFUSED)
        self._message_claims_decided()

    def _message_claims_failed(self, asked: list[MessageClaim], exc: Exception) -> None:
        """Kafka did not confirm the claims in time: tell those workers, who ask again (or stop, if asked to).
        Then write the claims held meanwhile."""
        for assignment, connection, end in asked:
            self.counters.message_claims_unconfirmed += 1
            self.log.warning(
                "%s[%d]: claim of the messages before offset %d: %s; its worker asks again",
                assignment.topic, assignment.partition, end, exc,
            )  # fmt: skip
            if assignment.connection is connection:
                self._answer(assignment, ClaimAnswer.UNCONFIRMED)
        self._message_claims_decided()

    def _message_claims_decided(self) -> None:
        """The message-claim write in flight is decided: the next one carries the claims held meanwhile."""
        self._message_claims_in_flight = False
        self._write_held_claims()

    def _answer(self, assignment: Assignment, answer: ClaimAnswer) -> None:
        if assignment.connection is not None:
            try:
                assignment.connection.send(ClaimVerdict(answer))
            except OSError:
                pass  # the worker is gone; reaping deals with it

    def _release(self, assignment: Assignment, sick: bool = False) -> None:
        """Write the release with the worker's progress, so the next owner resumes exactly there."""
        offset, done = _position(assignment)
        topic, partition = assignment.key
        self._forget(assignment)
        if not self._owns(assignment):
            # Only an owner's release means anything; another's could pass for an operator's during a pause.
            self.log.info("%s[%d] is no longer ours: nothing to release", topic, partition)
            return
        reason = _release_reason(self.phase, assignment, sick)
        self.counters.releases[reason] += 1
        if sick:
            self.cooldown_until[assignment.key] = time.monotonic() + self.settings.sick_cooldown
        self._releasing.add(assignment.key)
        how = "as sick " if sick else ""

        def released(verdicts: list[bool]) -> None:
            self._releasing.discard(assignment.key)
            refused = "" if verdicts[0] else " (refused: no longer ours)"
            self.log.info("released %s[%d] %sat offset %d%s", topic, partition, how, offset, refused)

        def failed(exc: Exception) -> None:
            self._releasing.discard(assignment.key)
            self.log.error("release of %s[%d] at offset %d not confirmed: %s", topic, partition, offset, exc)

        self._require_writes().submit(
            "release", [self._require_coordinator().release_record(topic, partition, offset, done)], released, failed
        )

    def _owns(self, assignment: Assignment) -> bool:
        owner = self._require_coordinator().read(lambda world: world.owner(assignment.topic, assignment.partition))
        return owner == self._me()

    def _forget(self, assignment: Assignment) -> None:
        self.assignments.pop(assignment.key, None)


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
