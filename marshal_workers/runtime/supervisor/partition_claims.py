"""Whole partitions: the supervisor's shell of the member core's PartitionHolding (member/partition_holding.py).

What to claim, heartbeat, hand over (balance, health, an operator's order) and release, and in what order, is the
member core's, which the simulator drives too (docs/architecture.md, "The member core"); this component is its I/O:
the clocks, the coordinator's fold and records, the writes (through InFlightWrites: a verdict comes back in a later
pass of the supervisor's loop, which never waits on Kafka), the group's committed offsets, and the workers' table.
A partition won goes in the Table's ``to_start`` queue for the worker pool (worker_pool.py), which asks for its
release when its worker exits.  AMO workers' batch claims are message_claims.py's; shared partitions are leased by
range instead (shared_pool.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.committed_offsets import OffsetLookupError, OffsetStore
from marshal_workers.kafka.coordination_reader import drain
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.member.partition_holding import PartitionHolding, Position
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.observe.metrics import Counters
from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.claiming import ClaimingSettings
from marshal_workers.protocol.health import Sample
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.channel import Field, Slot
from marshal_workers.runtime.supervisor.assignments import Assignment, Key, Table


class PartitionClaims:
    """The supervisor's component that claims and keeps whole partitions (component.py's interface), and the shell
    its member core drives.

    What the worker pool and remote control ask of it (release, release_handed_over, forget, owns, give_back,
    hand_over, drain) is the core's.
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``time_limits``: (soft, hard) seconds per topic; ``new_slot``: a worker's shared memory, at an offset;
        ``shared_low_water_marks``: the shared partitions' offsets to commit with each heartbeat, if any;
        ``clock``: monotonic seconds, the clock its workers' leases are on (channel.monotonic_ms; a unit test's
        own)."""
        self.table = table
        self.coordinator = coordinator
        self.writes = writes
        self.offsets = offsets
        self.settings = settings
        self.log = log
        self._new_slot = new_slot
        self._shared_low_water_marks = shared_low_water_marks
        self._clock = clock
        # A handler call in flight is progress until it passes its time limit (hard, else soft; none: ever).
        call_limits = {topic: hard or soft for topic, (soft, hard) in time_limits.items()}
        self.core: PartitionHolding[Assignment] = PartitionHolding(
            self.me(),
            claiming_settings(settings),
            random.Random(),
            table.assignments,
            self,
            call_limits,
            log,
            counters,
        )

    # --------------------------------------------------------- the component

    def waitables(self) -> list[object]:
        """The coordinator's release events: a partition freed is claimed at once, not at the next round."""
        return [self.coordinator.release_events()]

    def step(self, now: float) -> None:
        """The core's pass: heartbeat and balance every HB/2, claims every CLAIM_INTERVAL_S or after a release."""
        releases = self.coordinator.release_events()
        if releases in self.table.ready:
            drain(releases)
            self.core.release_seen()  # a partition was released: try to take it now, not at the next tick
        if self.core.step(now) and self._shared_low_water_marks is not None:
            # Shared partitions: the low-water marks, as the group's offsets (a backup of the log's bookkeeping).
            self.offsets.commit(self._shared_low_water_marks())

    def begin_stop(self) -> None:
        """Nothing more is claimed (the phase says so); each worker is asked to finish what it holds, and its
        partition is released when it exits (a partition without a worker running, at once)."""
        self.core.begin_stop()

    def stopped(self) -> bool:
        """No claim or release in flight (a claim won meanwhile is released)."""
        return self.core.stopped()

    def cooling_down(self, now: float) -> list[Key]:
        """The partitions released as sick (or handed over) that we do not claim again yet."""
        return self.core.policy.cooling_down(now)

    @property
    def claiming(self) -> bool:
        """False once another process took our client id's partitions: we claim nothing more."""
        return self.core.claiming

    @property
    def drained(self) -> bool:
        """An operator drained our client (remote_control.py): we claim nothing."""
        return self.core.drained

    # ------------------------------------- what the worker pool and remote control ask

    def release(self, assignment: Assignment, sick: bool = False) -> None:
        self.core.release(assignment, sick)

    def release_handed_over(self, assignment: Assignment) -> None:
        self.core.release_handed_over(assignment)

    def forget(self, assignment: Assignment) -> None:
        self.core.forget(assignment)

    def owns(self, assignment: Assignment) -> bool:
        return self.core.owns(assignment)

    def give_back(self, assignment: Assignment) -> None:
        """Stop the partition's worker and release the partition when it exits, for another member to take."""
        self.core.give_back(assignment)

    def hand_over(self, assignment: Assignment, reason: str) -> None:
        """An operator's order (``reason``) gives the partition up."""
        self.core.hand_over(assignment, reason)

    def drain(self, drained: bool) -> None:
        self.core.drain(drained)

    def me(self) -> MemberId:
        coordinator = self.coordinator
        return MemberId(coordinator.client, coordinator.instance)

    # ----------------------------------------------------- the core's shell

    def running(self) -> bool:
        return self.table.running

    def clock(self) -> float:
        return self._clock()

    def lease_clock_ms(self) -> int:
        return int(self._clock() * 1000)  # the workers' clock (channel.monotonic_ms): a slot's lease is on it

    def now_ms(self) -> int:
        return self.coordinator.now_ms()

    def fields(self) -> dict[str, Any]:
        return self.coordinator.record_fields()

    def read(self, query: Callable[[WorldState], Any]) -> Any:
        return self.coordinator.read(query)

    def partition_counts(self) -> Mapping[str, int]:
        return self.table.partition_counts

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        self.writes.submit(what, records, on_verdicts, on_failure)

    def look_up(self, keys: list[Key], then: Callable[[dict[Key, Position]], None]) -> None:
        """The group's committed offsets (one lookup for all), else auto_offset_reset; a partition whose position
        Kafka does not tell is left out (never guess a position)."""
        then(self._committed_or_reset(keys))

    def _committed_or_reset(self, keys: list[Key]) -> dict[Key, Position]:
        offsets = self.offsets
        try:
            committed = offsets.committed_many(keys)
        except OffsetLookupError as exc:
            self.log.warning(
                "claimed %d partition(s) but cannot tell where they start (%s): leaving them", len(keys), exc
            )
            return {}
        positions: dict[Key, Position] = {}
        for key in keys:
            offset = committed[key]
            if offset is not None:
                positions[key] = (offset, [])
        never_seen = [key for key in keys if key not in positions]
        for key, reset in (offsets.reset_offsets(never_seen) if never_seen else {}).items():
            if isinstance(reset, OffsetLookupError):
                self.log.warning("claimed %s[%d] but cannot tell where it starts (%s): leaving it", *key, reset)
                continue
            self.log.info(
                "%s[%d] has no known position: starting at %s offset %d",
                *key,
                self.settings.auto_offset_reset,
                reset,
            )
            positions[key] = (reset, [])
        return positions

    def take(self, key: Key, start: int, skip: list[done_set.Range]) -> Assignment:
        topic, partition = key
        slot = self._new_slot(start)
        if skip:  # the heartbeat carries it on; a heartbeat without it would tell the log nothing is done
            slot.publish_done(start, done_set.encode(start, skip))
        return Assignment(topic, partition, slot, started_offset=start)

    def start_worker(self, assignment: Assignment) -> None:
        if self.table.stop_signalled:
            assignment.restart_at = self._clock()  # a stop is on its way: handling it releases this one, unforked
        else:
            self.table.to_start.append(assignment)  # the worker pool starts it, a few per pass of the loop

    def stop_worker(self, assignment: Assignment) -> bool:
        if assignment.process is None:
            return False
        assignment.ask_worker_to_stop()
        return True

    def beat(self, assignment: Assignment, now: float) -> codec.Beat:
        """Its worker's position, with lag, rate, calls in flight (and the age of the oldest) and window use."""
        rate = assignment.health.consume_rate
        offset, done = self.position(assignment)
        call_age = assignment.call_age(now)
        return codec.Beat(
            partition=assignment.partition,
            offset=offset,
            lag=assignment.lag,
            rate=None if rate is None else round(max(rate, 0.0), 1),
            done=done or None,
            in_flight=assignment.calls_in_flight or None,
            window_used=assignment.slot.get(Field.WINDOW_USED) or None,
            call_age_s=None if call_age is None else round(call_age, 1),
        )

    def position(self, assignment: Assignment) -> tuple[int, list[int]]:
        return assignment.slot.position()

    def sample(self, assignment: Assignment, now: float) -> Sample | None:
        high = assignment.high_watermark
        if assignment.process is None or high is None:
            return None
        assignment.watch_call(now)
        return Sample(now, assignment.next_offset, high, assignment.slot.get(Field.PROCESSED), assignment.call)

    def forgotten(self, assignment: Assignment) -> None:
        pass  # the table was the core's to keep

    def confirmed(self, positions: list[tuple[str, int, int]]) -> None:
        """The offsets of the partitions whose heartbeat was accepted, as the group's (a backup of the log's)."""
        self.offsets.commit(positions)
        self.offsets.poll()


def claiming_settings(settings: Settings) -> ClaimingSettings:
    """What the claiming policy obeys, from a member's settings."""
    return ClaimingSettings(
        heartbeat_s=settings.heartbeat_interval,
        balance=settings.balance,
        max_partitions=settings.max_partitions,
        sick_cooldown_s=settings.sick_cooldown,
        release_if_behind=settings.release_if_behind,
        behind_cycles=settings.behind_cycles,
    )
