"""A simulated fleet: members on a virtual clock and log, faults, invariants, and the figures of a run.

``Simulation(config).run()`` returns the report (``marshal-workers simulate`` prints it): a plain dict whose
every value follows from the seed alone.  The members and the oracle fold with the real ``WorldState``, and the
members decide with the real member core: a test that plants a bug plants it there (monkeypatching what ships),
to show the simulator catches it.
"""

from __future__ import annotations

import bisect
import functools
import gc
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import ClaimingSettings, Key
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.checkpointing import Checkpointing
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.faults import Fault
from marshal_workers.simulation.invariants import (
    HandledPrefix,
    Sample,
    Violations,
    check_bounds,
    recovered_at,
    settled_since,
)
from marshal_workers.simulation.member import SimAssignment, SimMember
from marshal_workers.simulation.operator import ORDER_RECORDS, Operator
from marshal_workers.simulation.range_oracle import RangeOracle
from marshal_workers.simulation.shared_fold import SharedFold
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.sim_log import EPOCH_MS, Entry, SimulatedLog

GROUP = "sim"
GC_SLICE_S = 10.0  # simulated seconds between freezes of what the run made (Simulation._run_clock)
GC_YOUNG_ALLOCATIONS = 50_000  # the collector's youngest generation's threshold during a run (the default: 700)


def real_world(heartbeat_ms: int, coordination_partitions: int) -> WorldState:
    """An empty fold of the group's coordination log."""
    return WorldState(GROUP, heartbeat_ms, coordination_partitions)


@dataclass
class Host:
    """A member's host: a stable number and client id; its current instance, if one runs."""

    number: int
    client: str
    member: SimMember | None = None
    skew_ms: int = 0
    clock_skew_ms: int = 0


@dataclass
class Phase:
    name: str
    start: float
    records: int = 0
    bytes: int = 0
    handovers: int = 0


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.clock = VirtualClock()
        self.rng = random.Random(f"{config.seed}/fleet")
        # An empty fold, for the members and the checks that fold the log again.
        self.world: Callable[[int, int], WorldState] = real_world
        self._oracle = real_world(config.heartbeat_ms, config.coordination_partitions)
        # One coordination partition: one fold of the log serves the oracle and every member (shared_fold.py).
        self.shared = SharedFold(self._oracle, config.read_lag_s[1]) if config.coordination_partitions == 1 else None
        self.log = SimulatedLog(
            config.coordination_partitions,
            self.clock,
            random.Random(f"{config.seed}/log"),
            config.latency,
            self._appended,
        )
        self.settings = ClaimingSettings(
            heartbeat_s=config.heartbeat_s,
            balance=config.balance,
            max_partitions=config.max_partitions,
            sick_cooldown_s=config.sick_cooldown_s,
            behind_cycles=config.behind_cycles,
        )
        self.keys: list[Key] = [(t, p) for t, count in config.whole_counts().items() for p in range(count)]
        self.hosts: list[Host] = []
        self.holders: dict[Key, list[tuple[SimMember, SimAssignment]]] = {}
        self.last_owner: dict[Key, MemberId] = {}
        self.handled_prefix = HandledPrefix()
        self.violations = Violations()
        self.ranges = RangeOracle(config, self.violations)  # shared and at-most-once topics
        self.samples: list[Sample] = []
        self.sample_s = config.heartbeat_s / 10
        self.handovers = 0
        self.digest = hashlib.sha256()  # of the ownership changes: who won what, when
        faults = sorted(config.faults, key=lambda f: f.at)
        self.phases = [Phase("start", 0.0)]
        for fault in faults:
            if fault.at <= 0:
                continue
            if fault.at == self.phases[-1].start:
                self.phases[-1].name += f", {fault}"
            else:
                self.phases.append(Phase(f"after {fault}", fault.at))
        self._phase_starts = [p.start for p in self.phases]
        self._slow_reported: set[int] = set()  # id() of the assignments already reported (membership only)
        self.faults = faults
        self.operator = Operator(self)  # orders (simulation/operator.py)
        self.checkpointing = Checkpointing(self)  # (simulation/checkpointing.py)
        self.faults_end = max((self._fault_end(f) for f in faults), default=0.0)

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        config = self.config
        for _ in range(config.members):
            self._join()
        for fault in self.faults:
            self.clock.at(fault.at, functools.partial(self._inject, fault))
        self.clock.at(0.0, self._sample)
        self._run_clock(config.duration_s)
        check_bounds(
            self.samples,
            self.faults_end,
            config.duration_s,
            config.heartbeat_s,
            config.own_bound_hb,
            config.balance_bound_hb,
            self.sample_s,
            self.violations,
            config.balance == "fair",
        )
        self.checkpointing.finish()
        return self.report()

    def _run_clock(self, end: float) -> None:
        """Run the clock to ``end``, with the cyclic garbage collector kept from most of its work: it was 43% of
        a 10,000 x 1,000 x 3 min run's CPU, and a run makes almost no cyclic garbage (its memory is the same
        with the collector off; reference counting frees the rest).  Its youngest generation is collected every
        GC_YOUNG_ALLOCATIONS allocations, not 700: each collection walks every young container, and every
        record's fold copies a table of every partition (copy_on_write.copy_before).  And the clock runs in slices,
        everything made so far frozen out of the collector after each: its full collections walk every object
        alive, and the log the run keeps grows all along."""
        thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_ALLOCATIONS, *thresholds[1:])
        try:
            while True:
                self.clock.run_until(min(self.clock.now + GC_SLICE_S, end))
                gc.freeze()
                if self.clock.now >= end:
                    break
        finally:
            gc.unfreeze()  # the collector's own again, and the caller's objects with them
            gc.set_threshold(*thresholds)

    def _join(self) -> Host:
        host = Host(len(self.hosts), f"host-{len(self.hosts):04d}")
        self.hosts.append(host)
        self._start_instance(host)
        return host

    def _start_instance(self, host: Host) -> None:
        instance = f"{self.rng.getrandbits(64):016x}"
        world = self.world(self.config.heartbeat_ms, self.config.coordination_partitions)
        member = SimMember(self, host.number, host.client, instance, world, self.settings)
        member.skew_ms, member.clock_skew_ms = host.skew_ms, host.clock_skew_ms
        host.member = member
        self.checkpointing.start(member)
        member.start()

    # ------------------------------------------------------- the environment

    def high_watermark(self, key: Key, now: float) -> int:
        return int(self.config.produce_rate * now)

    def members(self) -> list[SimMember]:
        """Every host's current instance."""
        return [h.member for h in self.hosts if h.member is not None]

    def reading_on(self, member: SimMember) -> None:
        self.checkpointing.reading_on(member)

    def holding(self, member: SimMember, assignment: SimAssignment) -> None:
        self.holders.setdefault(assignment.key, []).append((member, assignment))

    def gone(self, member: SimMember, assignment: SimAssignment) -> None:
        held = self.holders.get(assignment.key, [])
        self.holders[assignment.key] = [(m, a) for m, a in held if a is not assignment]

    def resumed(self, member: SimMember, key: Key, offset: int) -> None:
        if self.ranges.tracks(key):
            return  # at most once: a new owner starts past the batches claimed, handled or not
        if not self.handled_prefix.resumed(key, offset):
            self.violations.add(
                "nothing skipped",
                self.clock.now,
                f"{member.me.client}/{member.me.instance} resumed {key[0]}[{key[1]}] at {offset}, "
                f"past {self.handled_prefix.prefix.get(key, 0)}, the first offset no worker "
                f"handled",
            )

    def handled(self, key: Key, start: int, offset: int) -> None:
        if self.ranges.tracks(key):
            self.ranges.worker_handled(key, start, offset, self.clock.now)
        self.handled_prefix.handled(key, start, offset)

    def range_handled(self, topic: str, partition: int, start: int, end: int) -> None:
        self.ranges.worker_handled((topic, partition), start, end, self.clock.now)

    def lease_taken(self, owner: object, topic: str, leased: PoolLease) -> None:
        self.ranges.lease_taken(owner, topic, leased, self.clock.now, self.clock.now_ms)

    def lease_dropped(self, owner: object, topic: str, leased: PoolLease) -> None:
        self.ranges.lease_dropped(owner, topic, leased)

    # ---------------------------------------------------------- the oracle

    @property
    def oracle(self) -> WorldState:
        """The fold of every record appended so far, in log order."""
        return self._oracle if self.shared is None else self.shared.head

    def _fold(self, entry: Entry) -> object:
        shared = self.shared
        if shared is None:
            return self._oracle.apply(entry.record, entry.at, entry.partition)
        verdict = shared.fold(entry, self.clock.now)
        origin = entry.origin
        if origin is not None:
            origin.positions[entry.index] = entry.offset
            origin.folded[entry.index] = verdict
        return verdict

    def _appended(self, entry: Entry) -> None:
        """Every record, folded in log order by the oracle: the fold's own view at every prefix."""
        phase = self.phases[bisect.bisect_right(self._phase_starts, self.clock.now) - 1]
        phase.records += 1
        phase.bytes += len(entry.value)
        record = entry.record
        if type(record) is not codec.Claim:
            verdict = self._fold(entry)
            if isinstance(record, ORDER_RECORDS):
                self.operator.appended(entry)
            self.ranges.appended(record, verdict, self.oracle, self.clock.now, self.clock.now_ms)
            return
        key = (record.topic, record.partition)
        if not self._fold(entry):
            return
        winner = MemberId(record.client, record.instance)
        previous = self.last_owner.get(key)
        self.last_owner[key] = winner
        if previous is not None and previous != winner:
            self.handovers += 1
            phase.handovers += 1
        self.digest.update(f"{entry.at} {key[0]} {key[1]} {winner.client} {winner.instance}\n".encode())
        now_ms = self.clock.now_ms
        for member, assignment in self.holders.get(key, []):
            if member.me != winner and assignment.lease_until_ms > now_ms:
                self.violations.add(
                    "one live owner",
                    self.clock.now,
                    f"{key[0]}[{key[1]}] claimed by {winner.client}/{winner.instance} while "
                    f"{member.me.client}/{member.me.instance}'s lease runs "
                    f"{assignment.lease_until_ms - now_ms} ms more",
                )

    def _sample(self) -> None:
        now = self.clock.now
        now_ms = EPOCH_MS + self.clock.now_ms
        hb_ms = self.config.heartbeat_ms
        partitions = self.oracle.partitions
        owned = True
        counts: dict[MemberId, int] = {}
        for key in self.keys:
            state = partitions.get(key)
            owner = None if state is None else state.owner
            if owner is None:
                owned = False
                continue
            if now_ms - state.last_ts >= hb_ms:  # type: ignore[union-attr]
                owned = False
            counts[owner] = counts.get(owner, 0) + 1
        fleet = self._fleet()
        shares = [counts.get(member.me, 0) for member in fleet]
        # Balanced: every partition held by a member of the fleet, their shares within one of each other.
        balanced = bool(shares) and sum(shares) == len(self.keys)
        self.samples.append(Sample(now, owned, max(shares) - min(shares) if balanced else None))
        self._check_slow(now, len(fleet))
        # From the count, not by adding: the sample times stay round numbers.
        self.clock.at(round(len(self.samples) * self.sample_s, 6), self._sample)

    def _fleet(self) -> list[SimMember]:
        """The members that should hold a share now: live, not leaving, not frozen."""
        return [
            h.member
            for h in self.hosts
            if h.member is not None
            and h.member.alive
            and h.member.running()
            and not h.member.frozen
            and not h.member.claims.drained
        ]

    def _check_slow(self, now: float, fleet: int) -> None:
        bound = (self.config.behind_cycles + 4) * self.config.heartbeat_s / 2
        for host in self.hosts:
            member = host.member
            if member is None or member.slow_rate is None or member.frozen or fleet < 2:
                continue
            for assignment in member.assignments.values():
                held_slow_since = max(member.slow_since, assignment.claimed_at)
                late = now - held_slow_since > bound and id(assignment) not in self._slow_reported
                if late and not (assignment.unhealthy or assignment.lost):
                    self.violations.add(
                        "slow handlers handed over",
                        now,
                        f"{member.me.client} kept {assignment.key[0]}[{assignment.key[1]}] "
                        f"{now - held_slow_since:.1f}s with a slow handler (bound {bound:g}s)",
                    )
                    self._slow_reported.add(id(assignment))

    # --------------------------------------------------------------- faults

    def _fault_end(self, fault: Fault) -> float:
        hb = self.config.heartbeat_s
        defaults = {
            "crash": 5.0,
            "freeze": 3 * hb,
            "lose-writes": 2 * hb,
            "stall-reads": 2 * hb,
            "deaf": 3 * hb,
            "stall-log": 2 * hb,
            "slow": 30.0,
        }
        if fault.kind == "order":
            return self.operator.end(fault)
        if fault.kind not in defaults:
            return fault.at
        lasts = fault.duration(defaults[fault.kind])
        return fault.at if lasts is None and fault.kind == "crash" else fault.at + (lasts or 0.0)

    def _targets(self, fault: Fault) -> list[Host]:
        live = [h for h in self.hosts if h.member is not None and h.member.alive and h.member.running()]
        if fault.member is not None:
            return [h for h in live if h.number == fault.member]
        count = min(fault.count(), len(live))
        return sorted(self.rng.sample(live, count), key=lambda h: h.number)

    def _inject(self, fault: Fault) -> None:
        now = self.clock.now
        hb = self.config.heartbeat_s
        kind = fault.kind
        if kind == "join":
            for _ in range(fault.count()):
                self._join()
            return
        if kind == "order":
            self.operator.inject(fault)
            return
        if kind == "stall-log":
            partition = int(fault.args.get("partition", 0))
            if partition < len(self.log.partitions):
                self.log.stall(partition, now + (fault.duration(2 * hb) or 2 * hb))
            return
        for host in self._targets(fault):
            member = host.member
            assert member is not None
            if kind == "crash":
                member.crash()
                host.member = None
                restart = fault.duration(5.0)
                if restart is not None:
                    self.clock.after(restart, functools.partial(self._restart, host))
            elif kind == "freeze":
                member.freeze()
                self.clock.after(fault.duration(3 * hb) or 3 * hb, member.thaw)
            elif kind == "lose-writes":
                member.writes_lost_until = now + (fault.duration(2 * hb) or 2 * hb)
            elif kind == "stall-reads":
                member.reads_stalled_until = now + (fault.duration(2 * hb) or 2 * hb)
            elif kind == "deaf":  # the same cut as stall-reads (a member learns verdicts only by reading), longer
                member.reads_stalled_until = now + (fault.duration(3 * hb) or 3 * hb)
            elif kind == "skew":
                host.skew_ms = member.skew_ms = round(fault.seconds("by", 3.0) * 1000)
                if fault.args.get("of") == "clock":
                    host.clock_skew_ms = member.clock_skew_ms = host.skew_ms
            elif kind == "leave":
                member.leave()
            elif kind == "slow":
                member.slow(fault.number("rate", 0.1))
                lasts = fault.duration(30.0)
                if lasts is not None:
                    self.clock.after(lasts, functools.partial(member.slow, None))

    def _restart(self, host: Host) -> None:
        if host.member is None:
            self._start_instance(host)

    # --------------------------------------------------------------- report

    def report(self) -> dict[str, Any]:
        config = self.config
        duration = config.duration_s
        samples = self.samples
        owned = next((s.at for s in samples if s.owned), None)
        balanced = next((s.at for s in samples if s.owned and s.spread is not None and s.spread <= 1), None)
        ends = [p.start for p in self.phases[1:]] + [duration]
        phases = []
        for phase, end in zip(self.phases, ends):
            span = max(end - phase.start, 1e-9)
            recovered = recovered_at(samples, phase.start, end)
            settled = settled_since(samples, phase.start, end, self.sample_s)
            phases.append(
                {
                    "phase": phase.name,
                    "from_s": round(phase.start, 3),
                    "to_s": round(end, 3),
                    "time_to_own_s": None if recovered is None else round(recovered - phase.start, 3),
                    "time_to_balance_s": None if settled is None else round(settled - phase.start, 3),
                    "handovers": phase.handovers,
                    "records_per_s": round(phase.records / span, 3),
                    "bytes_per_s": round(phase.bytes / span, 3),
                }
            )
        return {
            "seed": config.seed,
            "partitions": config.partitions,
            "members": config.members,
            "heartbeat_interval_s": config.heartbeat_s,
            "duration_s": duration,
            "balance": config.balance,
            "faults": [str(f) for f in self.faults],
            "time_to_own_s": None if owned is None else round(owned, 3),
            "time_to_balance_s": None if balanced is None else round(balanced, 3),
            "handovers": self.handovers,
            "records": self.log.records,
            "bytes": self.log.bytes,
            "records_per_s": round(self.log.records / duration, 3),
            "bytes_per_s": round(self.log.bytes / duration, 3),
            "faults_end_s": round(self.faults_end, 3),
            "violations": [v.as_json() for v in self.violations.kept],
            "violation_count": self.violations.count,
            "phases": phases,
            "ownership_digest": self.digest.hexdigest(),
            **({"orders": self.operator.report()} if self.operator.orders else {}),
            **({"checkpoints": self.checkpointing.report()} if self.checkpointing.enabled else {}),
            **self.ranges.figures(self.oracle, duration),
        }


def simulate(config: SimConfig) -> dict[str, Any]:
    """Run one simulation; its report."""
    return Simulation(config).run()


def shrink(config: SimConfig, tries: int = 12) -> tuple[SimConfig, dict[str, Any]] | None:
    """A smaller run that still breaks an invariant, if one is found: fewer members, then a shorter run (the
    seed and faults kept; faults on members that no longer exist dropped).  None if the run holds."""
    report = simulate(config)
    if not report["violations"]:
        return None
    best = (config, report)
    for _ in range(tries):
        smaller = _smaller(best[0], best[1])
        if smaller is None:
            break
        found = simulate(smaller)
        if not found["violations"]:
            if smaller.members < best[0].members:  # fewer members hid it: try a shorter run instead
                shorter = replace(best[0], duration_s=_shorter(best[0], best[1]))
                if shorter.duration_s >= best[0].duration_s:
                    break
                found = simulate(shorter)
                if not found["violations"]:
                    break
                best = (shorter, found)
                continue
            break
        best = (smaller, found)
    return best


def _shorter(config: SimConfig, report: dict[str, Any]) -> float:
    first = min(v["at_s"] for v in report["violations"])
    return min(config.duration_s, round(first + config.heartbeat_s, 3))


def _smaller(config: SimConfig, report: dict[str, Any]) -> SimConfig | None:
    if config.members > 2:
        members = max(2, config.members // 2)
        faults = tuple(f for f in config.faults if f.member is None or f.member < members)
        return replace(config, members=members, faults=faults)
    duration = _shorter(config, report)
    return replace(config, duration_s=duration) if duration < config.duration_s else None
