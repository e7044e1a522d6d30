"""Small fleets for the simulator's tests: the fault kinds, a bug to plant in the fold."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import PartitionState
from marshal_workers.simulation.faults import FAULT_KINDS, parse_fault
from marshal_workers.simulation.sim_config import SimConfig

SEEDS = range(4)
# One fault of every kind, early enough that a 90 s run checks the bounds after it (HB 2 s: 10 HB to own, 30 HB to
# balance).
EVERY_KIND = {
    "crash": "crash@10s:members=1",
    "freeze": "freeze@10s:for=7s",
    "lose-writes": "lose-writes@10s:for=5s",
    "stall-reads": "stall-reads@10s:for=5s",
    "deaf": "deaf@10s:for=7s",
    "stall-log": "stall-log@10s:for=5s",
    "skew": "skew@0s:member=1,by=3s",
    "join": "join@10s:members=2",
    "leave": "leave@10s",
    "slow": "slow@5s:for=15s",
    "order": "order@10s:release",
}
assert set(EVERY_KIND) == set(FAULT_KINDS), "a new fault kind needs a case here"


def small(fault: str | None = None, **fields: Any) -> SimConfig:
    config = SimConfig(partitions=12, members=3, heartbeat_s=2.0, duration_s=90.0)
    if fault is not None:
        config = replace(config, faults=(parse_fault(fault),))
    return replace(config, **fields)


def takes_live_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the fold that ships (every member's and the oracle's): a claim is accepted once the owner
    has been silent for one HB, not two (the owner is still live: its worker's lease runs 1.5 HB from its last
    heartbeat's write).  The members' claim rounds see the same rule: ``free_partitions`` asks ``is_free`` of each
    partition (the real one's index of the owners is for the real rule, and would hide the bug until a partition
    is stale by the real rule)."""

    def free_partitions(
        self: WorldState, keys: Iterable[tuple[str, int]], now: int, client: str, instance: str
    ) -> list[tuple[str, int]]:
        return [key for key in keys if self.is_free(*key, now, client, instance)]

    def claimable_by(self: WorldState, state: PartitionState, client: str, instance: str, at: int) -> bool:
        owner = state.owner
        return (
            owner is None
            or at - state.last_ts > self.heartbeat_ms
            or (owner.client == client and owner.instance != instance)
        )

    monkeypatch.setattr(WorldState, "free_partitions", free_partitions)
    monkeypatch.setattr(WorldState, "_claimable_by", claimable_by)
