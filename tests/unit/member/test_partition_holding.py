"""The member core's whole partitions, driven by hand: what a member claims, heartbeats and releases, and what it
asks of its workers, from the fold's verdicts (the supervisor's partition claims and the simulator drive the same
object)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaException

from marshal_workers.member.partition_holding import (
    PartitionHolding,
    Position,
    release_position,
    settle_exit,
)
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.claiming import ClaimingSettings
from marshal_workers.protocol.health import PartitionHealth, Sample
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")
LOG_MS = 1_700_000_000_000  # the log's clock
HB_MS = 1_000
ME = MemberId("c", "i1")
Key = tuple[str, int]


@dataclass(eq=False)
class Partition:
    """The driver's object for a partition held, and what its worker did."""

    key: Key
    start: int
    lost: bool = False
    unhealthy: bool = False
    handing_over: bool = False
    ordered: str | None = None
    claimed_at: float = 0.0
    claimed_end: int = -1
    health: PartitionHealth = field(default_factory=PartitionHealth)
    lease_until_ms: int = 0
    worker: str = "none"  # none, running, stopping
    offset: int = 0


class Member:
    """The shell: a fold the writes land in at once, offsets Kafka knows, and the workers' side, recorded."""

    def __init__(self, partitions: int = 3, committed: Mapping[Key, int] | None = None) -> None:
        self.world = WorldState("g", HB_MS)
        self.now = 0.0
        self.is_running = True
        self.committed = dict(committed or {})
        self.counts = {"t": partitions}
        self.written: list[codec.Record] = []
        self.deferred: list[tuple[list[codec.Record], OnVerdicts]] = []  # writes in flight, while ``defer``
        self.defer = False
        self.failing: Exception | None = None  # writes fail with this (Kafka does not answer)
        self.looked_up: list[list[Key]] = []
        self.held: dict[Key, Partition] = {}
        self.core = PartitionHolding(ME, ClaimingSettings(heartbeat_s=HB_MS / 1000), random.Random(0), self.held, self)

    def land(self, *records: codec.Record) -> list[Any]:
        return [self.world.apply(record, LOG_MS + round(self.now * 1000), 0) for record in records]

    # the shell
    def running(self) -> bool:
        return self.is_running

    def clock(self) -> float:
        return self.now

    def lease_clock_ms(self) -> int:
        return round(self.now * 1000)

    def now_ms(self) -> int:
        return LOG_MS + round(self.now * 1000)

    def fields(self) -> dict[str, Any]:
        return {"v": codec.VERSION, "ts": self.now_ms(), "group": "g", "client": ME.client, "instance": ME.instance}

    def read(self, query: Callable[[WorldState], T]) -> T:
        return query(self.world)

    def partition_counts(self) -> Mapping[str, int]:
        return self.counts

    def submit(self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure) -> None:
        self.written += records
        if self.failing is not None:
            on_failure(self.failing)
        elif self.defer:
            self.deferred.append((records, on_verdicts))
        else:
            on_verdicts(self.land(*records))

    def decide(self) -> None:
        """The writes in flight land, in order, and their verdicts come back."""
        self.defer = False
        while self.deferred:
            records, on_verdicts = self.deferred.pop(0)
            on_verdicts(self.land(*records))

    def look_up(self, keys: list[Key], then: Callable[[dict[Key, Position]], None]) -> None:
        self.looked_up.append(keys)
        then({key: (self.committed[key], []) for key in keys if key in self.committed})

    def take(self, key: Key, start: int, skip: list[done_set.Range]) -> Partition:
        return Partition(key, start, claimed_at=self.now, offset=start)

    def start_worker(self, held: Partition) -> None:
        held.worker = "running"

    def stop_worker(self, held: Partition) -> bool:
        if held.worker == "none":
            return False
        held.worker = "stopping"
        return True

    def beat(self, held: Partition, now: float) -> codec.Beat:
        return codec.Beat(partition=held.key[1], offset=held.offset)

    def position(self, held: Partition) -> tuple[int, list[int]]:
        return held.offset, []

    def sample(self, held: Partition, now: float) -> Sample | None:
        return None

    def forgotten(self, held: Partition) -> None:
        pass

    def confirmed(self, positions: list[tuple[str, int, int]]) -> None:
        pass

    def of(self, kind: type) -> list[Any]:
        return [r for r in self.written if type(r) is kind]


def test_a_partition_won_resumes_where_the_log_says_else_where_kafka_says_else_is_left_alone() -> None:
    member = Member(committed={("t", 1): 70})  # t[2]: Kafka knows no position
    other = MemberId("d", "d1")
    member.land(
        codec.Claim(**{**member.fields(), "client": other.client, "instance": other.instance}, topic="t", partition=0),
        codec.Release(
            **{**member.fields(), "client": other.client, "instance": other.instance},
            topic="t",
            partition=0,
            offset=500,
        ),
    )
    member.core.step(0.0)
    assert sorted(member.looked_up[0]) == [("t", 1), ("t", 2)], "only what the log does not say is looked up"
    assert {key: held.start for key, held in member.held.items()} == {("t", 0): 500, ("t", 1): 70}
    assert all(held.worker == "running" and held.lease_until_ms == 1_500 for held in member.held.values())
    beats = member.of(codec.Heartbeats)
    assert [b.partition for record in beats for b in record.beats] == [key[1] for key in member.held], (
        "the partitions taken are heartbeated at once, in the order claimed"
    )


def test_a_claim_won_while_the_member_stops_is_released_at_once_and_never_worked_on() -> None:
    member = Member(partitions=1, committed={("t", 0): 5})
    member.defer = True
    member.core.step(0.0)
    assert [type(r) for r in member.written] == [codec.Claim], "in flight"
    member.is_running = False  # a stop began meanwhile
    member.core.begin_stop()
    member.decide()
    assert member.held == {} and member.world.owner("t", 0) is None
    assert [r.offset for r in member.of(codec.Release)] == [5]
    assert member.core.counters.releases == {"shutdown": 1}


def test_a_release_kafka_does_not_confirm_is_counted_for_the_stop_to_say_so() -> None:
    member = Member(partitions=2, committed={("t", 0): 5, ("t", 1): 7})
    member.core.step(0.0)
    member.failing = KafkaException("timed out")  # Kafka stops answering, then a stop begins
    member.is_running = False
    for held in list(member.held.values()):
        member.core.release(held)
    assert len(member.of(codec.Release)) == 2 and member.core.counters.release_failures == 2
    assert member.core.stopped(), "a failed write is decided: the stop does not wait for it"


def test_a_heartbeat_refused_loses_the_partition_and_another_instance_of_our_client_stops_our_claims() -> None:
    member = Member(partitions=1, committed={("t", 0): 0})
    member.core.step(0.0)
    held = member.held[("t", 0)]
    member.now = 3.0  # we were silent past 2*HB: another instance of our client takes it over
    twin = {**member.fields(), "instance": "i2"}
    assert member.land(codec.Claim(**twin, topic="t", partition=0)) == [True]
    member.core.step(3.0)
    assert held.lost and held.lease_until_ms == 0 and held.worker == "stopping"
    assert member.of(codec.Release) == [], "a lost partition is not ours to release"
    assert not member.core.claiming and member.core.counters.partitions_lost == 1


def test_at_most_once_a_heartbeat_and_a_release_never_say_a_position_before_a_claimed_batch() -> None:
    member = Member(partitions=1, committed={("t", 0): 0})
    member.core.step(0.0)
    held = member.held[("t", 0)]
    held.offset, held.claimed_end = 40, 100  # its worker claimed up to 100 and handled up to 40
    member.core.heartbeat(0.5)
    assert [b.offset for b in member.of(codec.Heartbeats)[-1].beats] == [100]
    member.core.give_back(held)
    member.core.release_handed_over(held)
    assert [r.offset for r in member.of(codec.Release)] == [100]
    assert release_position((40, done_set.encode(40, [(101, 103)])), 100) == (100, [2])
    assert release_position((120, [0, 1, 1]), 100) == (120, [0, 1, 1]), "past the batch: the worker's own"


@dataclass
class Settled:
    calls: list[str] = field(default_factory=list)

    def release(self, held: Partition, sick: bool = False) -> None:
        self.calls.append("release sick" if sick else "release")

    def release_handed_over(self, held: Partition) -> None:
        self.calls.append("hand over")

    def forget(self, held: Partition) -> None:
        self.calls.append("forget")


def test_what_a_workers_exit_means_for_its_partition() -> None:
    def exit_of(sick: bool = False, stopping: bool = False, **marks: bool) -> list[str]:
        settled = Settled()
        dealt = settle_exit(Partition(("t", 0), 0, **marks), settled, sick, stopping)
        return settled.calls if dealt else ["the driver decides"]

    assert exit_of(lost=True, unhealthy=True) == ["forget"]
    assert exit_of(sick=True) == exit_of(unhealthy=True, handing_over=True) == ["release sick"]
    assert exit_of(handing_over=True, stopping=True) == ["hand over"]
    assert exit_of(stopping=True) == ["release"]
    assert exit_of() == ["the driver decides"]
