"""Small fleets with shared (range-lease) and at-most-once topics, and bugs to plant in their fold rules."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import MAX_RANGE, Lease, SharedPartition
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.faults import parse_fault
from marshal_workers.simulation.sim_config import SimConfig


def mixed(*faults: str, **fields: Any) -> SimConfig:
    """24 partitions over 4 topics: t0 shared, t1 shared and at most once, t2 and t3 whole and at most once (12
    whole partitions: 8 over 3 members can settle at 4/2/2, which the fair balance leaves as it is)."""
    config = SimConfig(
        partitions=24,
        members=3,
        topics=4,
        shared_topics=2,
        amo_topics=3,
        heartbeat_s=2.0,
        duration_s=90.0,
        faults=tuple(parse_fault(f) for f in faults),
    )
    return replace(config, **fields)


def overlapping_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the fold's range leases that ship: a range claim is accepted even where a live lease holds
    some of its offsets."""

    def claim(self: SharedPartition, start: int, end: int, holder: MemberId, at: int, lease_ms: int, amo: bool) -> bool:
        if not (start < end and end - start <= MAX_RANGE):
            return False
        self.lapse(at)
        if self.low is None:
            self.low = start
        elif start < self.low:
            return False
        self.leases[start] = Lease(start, end, holder, at + lease_ms, amo, at)  # no look at the live leases
        return True

    monkeypatch.setattr(SharedPartition, "claim", claim)


def forgets_claimed_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in the fold that ships: a batch claim is accepted, but the end claimed is not kept: a new owner
    resumes at the last heartbeat's offset, below messages the old owner claimed and handled."""
    real = WorldState._claim_messages

    def claim_messages(self: WorldState, record: codec.ClaimMessages, at: int, source: int) -> bool:
        state = self.get(record.topic, record.partition)
        kept = None if state is None else state.amo_offset
        accepted = real(self, record, at, source)
        if state is not None:
            state.amo_offset = kept
        return accepted

    monkeypatch.setattr(WorldState, "_claim_messages", claim_messages)
