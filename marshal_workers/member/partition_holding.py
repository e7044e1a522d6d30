"""A member's whole partitions: what it claims, heartbeats, hands over and releases, and in what order.

A supervisor's partition claims (runtime/supervisor/partition_claims.py) and a simulated member
(simulation/member.py) drive this object, so both take the same steps (docs/architecture.md, "The member core"):

* claim: every CLAIM_INTERVAL_S (at once after a release is seen), the free partitions the policy picks, unless the
  member is stopping or another instance of its client took its partitions; asking (balance) is a claim too;
* take: a claim won resumes where the fold says (past its done set), else where the shell looks it up (the group's
  committed offset, else auto_offset_reset; a partition whose start is not known is left to lapse); its worker
  holds a lease (``lease_until``) and starts; the partitions taken are heartbeated at once;
* heartbeat: every HB/2, every partition held and not lost, with its worker's progress; a heartbeat accepted extends
  the lease and judges the worker's health (one that cannot keep up is handed over, as sick), one refused means the
  partition is lost: its worker stops, nothing is released;
* balance: after the heartbeat, hand partitions over to members that ask, and ask when we hold too few;
* release: when a partition's worker has stopped (handed over, sick, a stop), at its position; at most once, never
  before a batch claimed (``release_position``).

The decisions are ClaimingPolicy's (protocol/claiming.py); this object sequences them.  It reads no clock (the
shell's clocks come in), writes nothing itself and starts no worker: it hands its records and its workers' orders
to the :class:`HoldingShell` it is given, and the shell hands back the verdicts and the workers' reports.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from marshal_workers.member.record_chunks import beat_chunks, entry_verdicts, heartbeat_records
from marshal_workers.member.shell import Log, OnFailure, OnVerdicts, Quiet, Reads
from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.claiming import ClaimingPolicy, ClaimingSettings, HealthCall, lease_until
from marshal_workers.protocol.health import HealthPolicy, PartitionHealth, Sample
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

Key = tuple[str, int]
Position = tuple[int, list[done_set.Range]]  # where a partition resumes, and the done ranges above it


class Held(Protocol):
    """What the core needs of a partition the member holds: the driver's own object (a supervisor's Assignment,
    a simulated member's SimAssignment)."""

    @property
    def key(self) -> Key: ...

    lost: bool  # someone else owns it now: its worker stops, nothing is released
    unhealthy: bool  # its worker cannot keep up: it stops, the partition is released as sick
    handing_over: bool  # given back (balance, an order): its worker stops, the partition is released
    ordered: str | None  # the operator's order it is handed over on (drain, pause, release), if any
    claimed_at: float  # the member's monotonic seconds: balance hands the latest claims over first
    claimed_end: int  # at most once: the end of the last batch claim accepted (-1: none)
    health: PartitionHealth
    lease_until_ms: int  # its worker handles nothing at or after this (the lease clock's ms; 0: none)


H = TypeVar("H", bound=Held)
H_contra = TypeVar("H_contra", bound=Held, contravariant=True)  # a protocol that only takes held partitions


class HoldingShell(Reads, Protocol[H]):
    """What the core needs of the member around it: its clocks, its fold, its writes, its workers."""

    def running(self) -> bool:
        """Not stopping: claims are made, partitions won are worked on, health is judged."""
        ...

    def clock(self) -> float:
        """The member's monotonic seconds (cool-downs, the claims' order for balance)."""
        ...

    def lease_clock_ms(self) -> int:
        """Milliseconds on the clock of its workers' leases (read before a write: the lease errs short)."""
        ...

    def now_ms(self) -> int:
        """The wall clock it compares with the fold's record times (who is live, what is stale)."""
        ...

    def fields(self) -> dict[str, Any]:
        """A record's common fields (client, instance, ts ...)."""
        ...

    def partition_counts(self) -> Mapping[str, int]:
        """The topics whose partitions are claimed whole, and their partition counts."""
        ...

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        """Write ``records``; the fold's verdicts (or the failure) come back later through the callbacks."""
        ...

    def look_up(self, keys: list[Key], then: Callable[[dict[Key, Position]], None]) -> None:
        """Find where partitions the log has no position for start (the group's committed offsets, else
        auto_offset_reset), then call ``then`` with those found (at once or later); one not found is left out."""
        ...

    def take(self, key: Key, start: int, skip: list[done_set.Range]) -> H:
        """A partition won: the member's object for it, its worker to resume at ``start`` past ``skip``."""
        ...

    def start_worker(self, held: H) -> None:
        """Start (or queue the start of) ``held``'s worker."""
        ...

    def stop_worker(self, held: H) -> bool:
        """Ask ``held``'s worker to stop (it exits after the message or batch in hand); False if it has none
        running (not started yet, or waiting for a restart)."""
        ...

    def beat(self, held: H, now: float) -> codec.Beat:
        """``held``'s entry in a heartbeat: its worker's position (offset, done set) and what it reports."""
        ...

    def position(self, held: H) -> tuple[int, list[int]]:
        """Where ``held``'s worker stands: its next offset and the done set above it (done_set runs)."""
        ...

    def sample(self, held: H, now: float) -> Sample | None:
        """A health sample of ``held``'s worker; None if it has none to judge (not running, end not known)."""
        ...

    def forgotten(self, held: H) -> None:
        """``held`` left the member's partitions (released, lost, or never worked on)."""
        ...

    def confirmed(self, positions: list[tuple[str, int, int]]) -> None:
        """A heartbeat was accepted for these (topic, partition, offset): ours, as the log now says."""
        ...


class ClaimCounts(Protocol):
    """What the core counts (a supervisor's metrics Counters has these too)."""

    claims_accepted: int
    claims_refused: int
    asks: int  # balance: claims of another member's partition, to be seen asking (refused)
    releases: collections.Counter[str]  # by reason: sick, operator, balance, shutdown, error
    heartbeat_failures: int  # heartbeat writes not confirmed
    release_failures: int  # release writes not confirmed (the partition waits for its lease to run out)
    partitions_lost: int  # taken over by another member while we held them


@dataclass
class ClaimCounters:
    """The core's counts when its driver keeps no metrics of its own."""

    claims_accepted: int = 0
    claims_refused: int = 0
    asks: int = 0
    releases: collections.Counter[str] = field(default_factory=collections.Counter)
    heartbeat_failures: int = 0
    release_failures: int = 0
    partitions_lost: int = 0


class PartitionHolding(Generic[H]):
    """One member's whole partitions: the claims, heartbeats, hand-overs and releases that keep them."""

    def __init__(
        self,
        me: MemberId,
        settings: ClaimingSettings,
        rng: random.Random,
        held: dict[Key, H],
        shell: HoldingShell[H],
        call_time_limits: Mapping[str, float] | None = None,
        log: Log | None = None,
        counters: ClaimCounts | None = None,
    ) -> None:
        """``held``: the partitions the member holds, by key (the driver's table, which the core keeps);
        ``rng``: the jitter and the order of claims; ``call_time_limits``: seconds a handler call of a topic may
        run and still count as progress (its hard time limit, else its soft one; a topic not here: no limit)."""
        self.me = me
        self.policy = ClaimingPolicy(me, settings, rng)
        self.held = held
        self.shell = shell
        self.heartbeat_ms = round(settings.heartbeat_s * 1000)
        self.health_policies = {
            topic: settings.health_policy(call_time_limit=limit) for topic, limit in (call_time_limits or {}).items()
        }
        self.default_health = settings.health_policy(call_time_limit=0.0)
        self.log: Log = Quiet() if log is None else log
        self.counters: ClaimCounts = ClaimCounters() if counters is None else counters
        self.claiming = True  # False once another instance of our client took our partitions: claim nothing more
        self.drained = False  # an operator drained us (member/obeying.py): claim nothing, balance nothing

    # ------------------------------------------------------------- the loop

    def release_seen(self) -> None:
        """A partition was released in the log: claim now, not at the next round."""
        self.policy.release_seen()

    def step(self, now: float) -> bool:
        """One pass of the member's loop: heartbeat and balance every HB/2, claim every CLAIM_INTERVAL_S.  True
        when the heartbeat was due (the driver's own work on its cadence follows it)."""
        policy = self.policy
        beat = policy.heartbeat_due(now)
        if beat:
            self.heartbeat(now)
            self.rebalance(now)
        if policy.claim_due(now):
            self.claim_free(now)
        return beat

    def begin_stop(self) -> None:
        """A graceful stop (the shell no longer says running): every worker finishes what it holds and its
        partition is released then; a partition without a worker running is released at once."""
        for held in list(self.held.values()):
            if not self.shell.stop_worker(held):
                self.release(held)

    def stopped(self) -> bool:
        """No claim or release in flight (a claim won meanwhile is released)."""
        return self.policy.stopped()

    # --------------------------------------------------------------- claims

    def claim_free(self, now: float) -> None:
        """Claim the free partitions the policy picks (a drained member sees none free: the fold says so)."""
        shell = self.shell
        if not shell.running() or not self.claiming:
            return
        policy, held = self.policy, self.held.keys()
        counts, now_ms = shell.partition_counts(), shell.now_ms()
        free = shell.read(lambda world: policy.partitions_to_claim(world, counts, held, now, now_ms))
        if free:
            self._claim_all(free)

    def _claim_all(self, keys: list[Key], asking: bool = False) -> None:
        """Write claims, all in one write; their verdicts (later) take the partitions won."""
        shell = self.shell
        if not shell.running():
            return
        keys = self.policy.claims_sent(keys)
        if not keys:
            return
        written_ms = shell.lease_clock_ms()  # before the write: the lease errs short
        fields = shell.fields()
        records: list[codec.Record] = [codec.Claim(**fields, topic=topic, partition=p) for topic, p in keys]
        shell.submit(
            "claim",
            records,
            lambda verdicts: self._after_claims(keys, verdicts, written_ms, asking),
            lambda exc: self._claims_failed(keys, exc),
        )

    def _claims_failed(self, keys: list[Key], exc: Exception) -> None:
        self.policy.claims_failed(keys)
        for key in keys:
            self.log.warning("claim of %s[%d] not confirmed: %s", *key, exc)

    def _after_claims(self, keys: list[Key], verdicts: Sequence[Any], written_ms: int, asking: bool) -> None:
        """Take every partition won, where the log says it resumes, else where the shell finds it starts."""
        won = self.policy.claims_decided(keys, [bool(v) for v in verdicts])
        refused = len(keys) - len(won)
        counters = self.counters
        if asking:
            counters.asks += refused
        else:
            counters.claims_refused += refused
        counters.claims_accepted += len(won)
        if not won:
            return
        logged = self.shell.read(lambda world: {key: resume_position(world, key) for key in won})
        unknown = [key for key, position in logged.items() if position is None]
        if unknown:
            self.shell.look_up(unknown, lambda found: self._take_won(won, logged, found, written_ms))
        else:
            self._take_won(won, logged, {}, written_ms)

    def _take_won(
        self, won: list[Key], logged: dict[Key, Position | None], found: dict[Key, Position], written_ms: int
    ) -> None:
        """Take the partitions won, in the order claimed (those whose start is not known are left: never guess a
        position; the claim lapses unused after 2*HB and the partition is tried again), then heartbeat them."""
        taken = []
        for key in won:
            position = logged[key] or found.get(key)
            if position is None:
                continue
            held = self._take(key, position, written_ms)
            if held is not None:
                taken.append(held)
        if taken:
            self._send_heartbeats(taken, self.shell.clock())  # the log learns where they resume at once

    def _take(self, key: Key, position: Position, written_ms: int) -> H | None:
        """A partition just won: its object, lease and worker (None if a stop began and it was released)."""
        start, skip = done_set.resume_past(*position)
        shell = self.shell
        held = shell.take(key, start, skip)
        self.held[key] = held
        extend_lease(held, written_ms, self.heartbeat_ms)
        self.log.info("claimed %s[%d], resuming at offset %d", *key, start)
        if not shell.running():
            self.release(held)  # the claim was in flight when a stop began
            return None
        shell.start_worker(held)
        return held

    # ----------------------------------------------------------- heartbeats

    def heartbeat(self, now: float) -> None:
        """Heartbeat every partition held and not lost, with its worker's progress."""
        held = [h for h in self.held.values() if not h.lost]
        if held:
            self._send_heartbeats(held, now)

    def _send_heartbeats(self, held: list[H], now: float) -> None:
        shell = self.shell
        beats = [shell.beat(h, now) for h in held]
        for i, h in enumerate(held):
            if h.claimed_end > beats[i].offset:  # at most once: a heartbeat says where the next owner resumes
                beats[i] = at_most_once(beats[i], h.claimed_end)
        written_ms = shell.lease_clock_ms()  # before the write: the lease errs short
        topics = [h.key[0] for h in held]
        chunks = beat_chunks(topics, [len(beat.done or ()) for beat in beats])
        records = heartbeat_records(shell.fields(), topics, beats, chunks)

        def decided(verdicts: list[Any]) -> None:
            self._after_heartbeats(held, beats, entry_verdicts(chunks, verdicts, len(held)), written_ms)

        shell.submit("heartbeat", records, decided, self._heartbeat_failed)

    def _heartbeat_failed(self, exc: Exception) -> None:
        self.log.warning("heartbeat not confirmed (leases run out unless the next one is): %s", exc)
        self.counters.heartbeat_failures += 1

    def _after_heartbeats(self, held: list[H], beats: list[codec.Beat], accepted: list[bool], written_ms: int) -> None:
        shell, table = self.shell, self.held
        lease = lease_until(written_ms, self.heartbeat_ms)  # (extend_lease, once for all of them)
        now, running = shell.clock(), shell.running()
        ours = []
        for h, beat, ok in zip(held, beats, accepted):
            if table.get(h.key) is not h or h.lost:
                continue  # released, or lost, since this heartbeat was written
            if ok:
                h.lease_until_ms = max(h.lease_until_ms, lease)  # a late verdict never shortens it
                self._check_health(h, now, running)
                ours.append((h.key[0], beat.partition, beat.offset))
            else:
                self.lose(h)
        # Only what we own: a lost partition's offset is its new owner's to tell.
        shell.confirmed(ours)

    def _check_health(self, held: H, now: float, running: bool) -> None:
        """One health cycle: hand the partition over, as sick, if its worker cannot keep up and someone else
        could take it.  Not while it is on its way out already: a worker asked to stop makes no progress, and a
        partition handed over would be taken for sick (released as such, kept from us for sick_cooldown)."""
        if held.unhealthy or held.handing_over:
            return
        shell = self.shell
        sample = shell.sample(held, now)
        if sample is None:
            return
        topic, partition = held.key
        policy = self.health_policies.get(topic, self.default_health)
        claiming = self.policy
        held.health, verdict, call = claiming.judge_health(
            held.health,
            sample,
            policy,
            running,
            others=lambda: shell.read(lambda world: claiming.others_live(world, shell.now_ms())),
        )
        if call is HealthCall.KEEP:
            return
        where = f"{topic}[{partition}]"
        why = f"{verdict.value} (lag {sample.lag}{call_note(sample, policy)})"
        if call is HealthCall.NO_ONE_ELSE:
            self.log.warning("%s is %s but no other member could take it: keeping it", where, why)
            return
        self.log.warning("%s is %s: handing it over to another member (release_if_behind)", where, why)
        held.unhealthy = True
        shell.stop_worker(held)

    def lose(self, held: H) -> None:
        """Someone else owns the partition: its worker stops at once (its lease is void), nothing is released."""
        held.lease_until_ms = 0
        held.lost = True
        self.counters.partitions_lost += 1
        key, me = held.key, self.me
        owner = self.shell.read(lambda world: world.owner(*key))
        if owner is None:
            self.log.warning("%s[%d] was taken from us (a pause?): stopping its worker", *key)
        else:
            self.log.warning("lost %s[%d] to %s: stopping its worker", *key, owner)
        if owner is not None and owner.client == me.client and owner.instance != me.instance:
            self.log.error(
                "another process uses our client id %r and took our partitions: every instance needs its "
                "own --client-id; this one stops claiming",
                me.client,
            )
            self.claiming = False
        if not self.shell.stop_worker(held):
            self.forget(held)

    # -------------------------------------------------------------- balance

    def rebalance(self, now: float) -> None:
        """Hand partitions over to members that ask, and ask when we hold too few (ClaimingPolicy.rebalance).
        A drained member does neither (asking would make it look like a live member that wants partitions)."""
        shell = self.shell
        if not shell.running() or not self.claiming or self.drained:
            return
        policy, held = self.policy, self.held
        now_ms = shell.now_ms()
        total = sum(shell.partition_counts().values())
        offered = sorted(
            (h for h in held.values() if not (h.lost or h.unhealthy or h.handing_over)), key=lambda h: h.claimed_at
        )
        keys = [h.key for h in offered]
        decided = shell.read(lambda world: policy.rebalance(world, total, len(held), keys, now, now_ms))
        if decided.hand_over:
            low, high = shell.read(lambda world: policy.share(world, total, now_ms))
            for key in decided.hand_over:
                self.log.info(
                    "%s[%d]: handing it over (balance=fair: our share is %d to %d partitions)", *key, low, high
                )
                self.give_back(held[key])
        if decided.ask is not None:
            self._claim_all([decided.ask], asking=True)  # accepted only if its owner went stale: a take-over

    # ----------------------------------------------------- operators' orders

    def drain(self, drained: bool) -> None:
        """An operator drained us (claim nothing, balance nothing), or resumed us."""
        if drained == self.drained:
            return
        self.drained = drained
        if drained:
            self.log.info("drained by an operator: releasing everything, claiming nothing until resumed")
        else:
            self.log.info("resumed by an operator: claiming again")

    def hand_over(self, held: H, reason: str) -> None:
        """An operator's order gives ``held`` up (``reason``: drain, pause, release): hand it over."""
        self.log.info("%s[%d]: handing it over (ordered by an operator: %s)", *held.key, reason)
        held.ordered = reason
        self.give_back(held)

    # ------------------------------------------------------------- releases

    def give_back(self, held: H) -> None:
        """Stop the partition's worker and release the partition when it has stopped, for another member."""
        held.handing_over = True
        if not self.shell.stop_worker(held):
            self.release_handed_over(held)

    def release_handed_over(self, held: H) -> None:
        self.release(held)
        # Not ours to take back when the release wakes our claims: it is meant for another member.
        self.policy.handed_over(held.key, self.shell.clock())

    def release(self, held: H, sick: bool = False) -> None:
        """Write the release at the worker's position, so the next owner resumes exactly there."""
        shell, policy = self.shell, self.policy
        offset, done = release_position(shell.position(held), held.claimed_end)
        key = held.key
        self.forget(held)
        if not self.owns(held):
            # Only an owner's release means anything; another's could pass for an operator's during a pause.
            self.log.info("%s[%d] is no longer ours: nothing to release", *key)
            return
        self.counters.releases[release_reason(held, sick, shell.running())] += 1
        policy.released(key, sick, shell.clock())
        how = "as sick " if sick else ""
        record = codec.Release(**shell.fields(), topic=key[0], partition=key[1], offset=offset, done=done or None)

        def released(verdicts: list[Any]) -> None:
            policy.release_decided(key)
            refused = "" if verdicts[0] else " (refused: no longer ours)"
            self.log.info("released %s[%d] %sat offset %d%s", *key, how, offset, refused)

        def failed(exc: Exception) -> None:
            policy.release_decided(key)
            self.counters.release_failures += 1
            self.log.error("release of %s[%d] at offset %d not confirmed: %s", *key, offset, exc)

        shell.submit("release", [record], released, failed)

    def owns(self, held: H) -> bool:
        """Does the fold say the partition is ours?"""
        key = held.key
        return self.shell.read(lambda world: world.owner(*key)) == self.me

    def forget(self, held: H) -> None:
        """``held`` is no longer the member's (a later claim of the same partition is left alone)."""
        if self.held.get(held.key) is held:
            del self.held[held.key]
        self.shell.forgotten(held)


class Settles(Protocol[H_contra]):
    """What :func:`settle_exit` asks of the partitions' keeper (a PartitionHolding, or its driver)."""

    def release(self, held: H_contra, sick: bool = False) -> None: ...

    def release_handed_over(self, held: H_contra) -> None: ...

    def forget(self, held: H_contra) -> None: ...


def settle_exit(held: H, claims: Settles[H], sick: bool, stopping: bool) -> bool:
    """``held``'s worker exited (``sick``: it asked to be released as sick): forget a partition lost, release one
    as sick whose worker asked so or could not keep up, hand one over that was being handed over, release one
    while the member stops: True.  False: none of those; the driver decides (a restart)."""
    if held.lost:
        claims.forget(held)
    elif sick or held.unhealthy:
        claims.release(held, sick=True)
    elif held.handing_over:
        claims.release_handed_over(held)
    elif stopping:
        claims.release(held)
    else:
        return False
    return True


class Leased(Protocol):
    lease_until_ms: int  # its worker handles nothing at or after this (the lease clock's ms; 0: none)


def extend_lease(held: Leased, written_ms: int, heartbeat_ms: int) -> None:
    """An accepted record written at ``written_ms``: its worker may handle messages until ``lease_until``; a late
    verdict never shortens the lease."""
    held.lease_until_ms = max(held.lease_until_ms, lease_until(written_ms, heartbeat_ms))


def resume_position(world: WorldState, key: Key) -> Position | None:
    """Where the log says a partition resumes, with the done ranges above it; None if it says nothing."""
    state = world.get(*key)
    if state is None or state.resume_offset is None:
        return None
    return state.resume_offset, state.skip_ranges()


def release_position(position: tuple[int, list[int]], claimed_end: int) -> tuple[int, list[int]]:
    """Where the next owner resumes, and the done set above it (at least once: the worker's position); at most
    once never before a batch claimed, handled or not."""
    offset, done = position
    if claimed_end <= offset:
        return offset, done
    ranges = done_set.decode(offset, done)
    return claimed_end, done_set.encode(claimed_end, done_set.above(ranges, claimed_end))


def at_most_once(beat: codec.Beat, claimed_end: int) -> codec.Beat:
    """``beat`` (its worker's position) as a heartbeat of an at-most-once partition carries it: never before the
    batch claimed (``release_position``)."""
    offset, done = release_position((beat.offset, list(beat.done or ())), claimed_end)
    return msgspec.structs.replace(beat, offset=offset, done=done or None)


def release_reason(held: Held, sick: bool, running: bool) -> str:
    """Why a partition is released, for the metrics: sick, operator, balance, shutdown or error."""
    if sick:
        return "sick"
    if held.ordered is not None:
        return "operator"
    if held.handing_over:
        return "balance"
    return "error" if running else "shutdown"


def call_note(sample: Sample, policy: HealthPolicy) -> str:
    """For the log: the call in flight that made a partition stalled, past its time limit."""
    call = sample.call
    if call is None or not call.timed or not policy.call_time_limit or call.age(sample.at) <= policy.call_time_limit:
        return ""
    return f"; its handler call has run {call.age(sample.at):.0f}s, past its time limit of {policy.call_time_limit:g}s"
