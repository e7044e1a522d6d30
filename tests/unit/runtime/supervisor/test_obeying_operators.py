"""RemoteControl without a broker: a supervisor obeys the operators' orders it folds."""

from __future__ import annotations

import logging

from supervisor_fakes import NOW_S, FoldedCoordinator, new_slot, record_of, settings

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.runtime.supervisor.assignments import Assignment, Table
from marshal_workers.runtime.supervisor.remote_control import RemoteControl

ADMIN = MemberId("admin@ops", "admin@ops-1")
TS = round(NOW_S * 1000)


class Obeying:
    """A member holding "orders"[0] and [1], with a shared topic "thumbs"; what it does on orders, recorded."""

    def __init__(self) -> None:
        self.table = Table()
        self.coordinator = FoldedCoordinator()
        self.given_back: list[tuple[str, int]] = []
        self.reasons: dict[tuple[str, int], str] = {}
        self.drained = False
        self.shutdowns = 0
        self.held_back: set[str] = set()
        for partition in (0, 1):
            self.table.assignments[("orders", partition)] = Assignment("orders", partition, new_slot(0))
            self.coordinator.fold(
                codec.Claim(**record_of(self.coordinator.me, TS - 10), topic="orders", partition=partition)
            )
        self.remote = RemoteControl(
            self.table,
            self.coordinator,
            settings(),
            logging.getLogger("test"),
            started_ms=TS - 100,
            hand_over=self.hand_over,
            drain=self.drain,
            shut_down=self.shut_down,
            hold_back_shared=self.hold_back,
            shared_topics=["thumbs"],
        )

    def hand_over(self, assignment: Assignment, reason: str) -> None:
        self.given_back.append(assignment.key)
        self.reasons[assignment.key] = reason

    def drain(self, drained: bool) -> None:
        self.drained = drained

    def shut_down(self) -> None:
        self.shutdowns += 1

    def hold_back(self, topics: set[str]) -> None:
        self.held_back = topics

    def ordered(self, *records: codec.Record) -> None:
        self.coordinator.fold(*records)
        self.remote.step(0.0)


def control(action: str, ts: int) -> codec.Control:
    return codec.Control(**record_of(ADMIN, ts), target="c", action=action)  # type: ignore[arg-type]


def test_a_release_order_hands_over_that_partition_only() -> None:
    member = Obeying()
    member.ordered(codec.ReleasePartition(**record_of(ADMIN, TS), topic="orders", partition=1))
    assert member.given_back == [("orders", 1)]
    assert member.reasons[("orders", 1)] == "release"
    assert member.shutdowns == 0 and not member.drained


def test_a_drain_hands_over_everything_and_holds_back_the_shared_topics() -> None:
    member = Obeying()
    member.ordered(control("drain", TS))
    assert member.drained and sorted(member.given_back) == [("orders", 0), ("orders", 1)]
    assert member.held_back == {"thumbs"}


def test_a_shutdown_ordered_after_our_start_stops_us_one_before_it_does_not() -> None:
    member = Obeying()
    member.ordered(control("shutdown", TS - 200))
    assert member.shutdowns == 0, "ordered before we started: for an earlier run of this client"
    member.coordinator.fold(control("shutdown", TS))
    member.remote.step(0.6)  # the next look, HB/2 later
    assert member.shutdowns == 1


def test_orders_are_read_every_half_heartbeat_not_every_pass() -> None:
    member = Obeying()
    member.remote.step(0.0)
    member.coordinator.fold(codec.ReleasePartition(**record_of(ADMIN, TS), topic="orders", partition=0))
    member.remote.step(0.1)
    assert member.given_back == []
    member.remote.step(0.5)
    assert member.given_back == [("orders", 0)]
