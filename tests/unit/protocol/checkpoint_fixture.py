"""A folded state with something in every field a checkpoint carries, and its checkpoint as the code of commit
5ec90e2 wrote it (package 0.7.0; before the checkpoint conversions were derived from the dataclasses' fields), kept
so that every later version is checked against it."""

from __future__ import annotations

from pathlib import Path

from marshal_workers.protocol import done_set
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import Lease, SharedPartition, Tries
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.protocol.world_view import Controls, PartitionState, Pause

GROUP = "g"
HB = 1000
WRITER = {"v": 1, "ts": 9_999, "group": GROUP, "client": "w", "instance": "w1"}
AS_OF = 321
PER_RECORD = 2  # three positions in two parts, the shared partition in a third
ENCODED = Path(__file__).parent / "data" / "checkpoint-5ec90e2.jsonl"


def full_state() -> WorldState:
    """Every position, lease, order and pause field set to something other than its default."""
    state = WorldState(GROUP, HB)
    state.partitions[("orders", 0)] = PartitionState(
        owner=MemberId("a", "a1"),
        last_ts=1_234,
        offset=40,
        amo_offset=38,
        done=done_set.parse(40, [2, 1, 3]),
        lag=7,
        rate=2.5,
        in_flight=3,
        window_used=12,
        call_age_s=0.25,
        release_requested=True,
    )
    state.partitions[("orders", 1)] = PartitionState(last_ts=5, offset=12, amo_offset=99)
    state.partitions[("payments", 3)] = PartitionState(owner=MemberId("b", "b2"), last_ts=77)
    state.shared[("events", 2)] = SharedPartition(
        low=100,
        done=[(105, 107), (110, 111)],
        leases={
            120: Lease(
                120,
                130,
                MemberId("a", "a1"),
                expires=9_000,
                amo=False,
                claimed_at=3_000,
                handed={121: (8_000, 2)},
                acked={122},
                progress=[(123, 125)],
                dead={124},
            ),
            140: Lease(140, 150, MemberId("b", "b1"), expires=9_500, amo=True, claimed_at=3_500),
        },
        tries=[Tries(112, 115, 2)],
        acked=30,
        dead_letters=2,
        lost=4,
        lapsed=3,
        high=200,
    )
    state.pauses[0] = Pause(until=10_000, client="op")
    state.controls[0] = Controls(drained={"c": 50}, shutdowns={"b": 60})
    state.topic_pauses["audit"] = 20_000
    state.set_directory(0, {GROUP, "other"})
    return state
