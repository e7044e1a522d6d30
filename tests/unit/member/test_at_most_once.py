"""The member core's at-most-once batch claims, driven by hand: what a member writes for its workers' claims and
what it answers them, from the fold's verdicts (the supervisor's message claims and the simulator drive the same
object)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marshal_workers.member.at_most_once import BatchClaims, ClaimAnswer
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

LOG_MS = 1_700_000_000_000
ME = MemberId("c", "i1")


@dataclass(eq=False)
class Partition:
    key: tuple[str, int]
    lost: bool = False
    claimed_end: int = -1
    lease_until_ms: int = 0


@dataclass
class Member:
    """The shell: a fold the writes land in when the test says, and the answers the workers got."""

    world: WorldState = field(default_factory=lambda: WorldState("g", 1_000))
    writes: list[tuple[list[codec.Record], OnVerdicts, OnFailure, float]] = field(default_factory=list)
    answers: list[tuple[tuple[str, int], ClaimAnswer]] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        return {"v": codec.VERSION, "ts": LOG_MS, "group": "g", "client": ME.client, "instance": ME.instance}

    def lease_clock_ms(self) -> int:
        return 10_000

    def submit(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None:
        self.writes.append((records, on_verdicts, on_failure, within))

    def current(self, held: Partition, worker: object) -> bool:
        return worker != "replaced"

    def answer(self, held: Partition, worker: object, answer: ClaimAnswer) -> None:
        self.answers.append((held.key, answer))

    def land(self, index: int) -> None:
        records, on_verdicts, _, _ = self.writes[index]
        on_verdicts([self.world.apply(record, LOG_MS, 0) for record in records])


def owned(member: Member, *keys: tuple[str, int]) -> None:
    for topic, partition in keys:
        member.world.apply(codec.Claim(**member.fields(), topic=topic, partition=partition), LOG_MS, 0)


def test_claims_go_in_one_write_a_record_per_topic_and_an_accepted_one_moves_the_claimed_end_and_the_lease() -> None:
    member = Member()
    claims = BatchClaims(member, heartbeat_s=1.0)
    a, b, c = Partition(("t", 0)), Partition(("u", 0)), Partition(("t", 1))
    owned(member, a.key, b.key)  # not c: its claim is refused
    for held, end in ((a, 100), (b, 50), (c, 70)):
        claims.ask(held, end)
    claims.step()
    [(records, _, _, within)] = member.writes
    assert within == 1.0, "a worker waits on it: it fails within an HB"
    assert [(r.topic, [(e.partition, e.offset) for e in r.claims]) for r in records] == [  # type: ignore[attr-defined]
        ("t", [(0, 100), (1, 70)]),
        ("u", [(0, 50)]),
    ]
    member.land(0)
    assert (a.claimed_end, a.lease_until_ms) == (100, 10_000 + 1_500)
    assert (c.claimed_end, c.lease_until_ms) == (-1, 0)
    assert member.answers == [(a.key, ClaimAnswer.CLAIMED), (b.key, ClaimAnswer.CLAIMED), (c.key, ClaimAnswer.REFUSED)]


def test_while_a_write_is_in_flight_claims_wait_and_those_of_partitions_lost_or_workers_replaced_are_not_written() -> (
    None
):
    member = Member()
    claims = BatchClaims(member, heartbeat_s=1.0)
    a, b, c = Partition(("t", 0)), Partition(("t", 1)), Partition(("t", 2))
    owned(member, a.key, b.key, c.key)
    claims.ask(a, 100)
    claims.step()
    claims.ask(b, 10)
    claims.ask(c, 20, worker="replaced")
    claims.step()
    assert len(member.writes) == 1, "held while the first write is in flight"
    b.lost = True
    _, _, on_failure, _ = member.writes[0]
    on_failure(TimeoutError("not confirmed"))
    assert member.answers == [(a.key, ClaimAnswer.UNCONFIRMED), (b.key, ClaimAnswer.REFUSED)]
    assert len(member.writes) == 1, "nothing left to write: b is lost, c's worker was replaced"
    assert claims.counters.message_claims_unconfirmed == 1
