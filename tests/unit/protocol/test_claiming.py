"""ClaimingPolicy over a folded world, without a supervisor: what it claims, when it heartbeats, what it hands over."""

from __future__ import annotations

import random

from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import CLAIMS_PER_TICK, ClaimingPolicy, ClaimingSettings, HealthCall, lease_until
from marshal_workers.protocol.health import PartitionHealth, Sample
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

ME, OTHER = MemberId("a", "a1"), MemberId("b", "b1")
NOW_MS = 1_764_000_000_000
COUNTS = {"t": 10}


def policy(**settings: object) -> ClaimingPolicy:
    return ClaimingPolicy(ME, ClaimingSettings(heartbeat_s=1.0, **settings), random.Random(1))  # type: ignore[arg-type]


def claim(world: WorldState, who: MemberId, partition: int, at: int) -> bool:
    return world.apply(
        codec.Claim(v=1, ts=at, group="g", client=who.client, instance=who.instance, topic="t", partition=partition), at
    )


def test_a_member_claims_a_few_first_then_every_free_partition_when_alone() -> None:
    world, me = WorldState("g", 1000), policy()
    first = me.partitions_to_claim(world, COUNTS, [], 0.0, NOW_MS)
    assert len(first) == CLAIMS_PER_TICK, "the first claims announce us to members starting with us"
    assert me.claims_sent(first) == first and me.claims_sent(first) == [], "in flight once"
    won = me.claims_decided(first, [True] * len(first))
    for key in won:
        claim(world, ME, key[1], NOW_MS)
    rest = me.partitions_to_claim(world, COUNTS, won, 0.3, NOW_MS + 300)
    assert sorted(rest) == sorted({("t", p) for p in range(10)} - set(won))


def test_live_partitions_of_others_cooling_ones_and_the_cap_are_left_alone() -> None:
    world, me = WorldState("g", 1000), policy(max_partitions=3)
    claim(world, OTHER, 0, NOW_MS)
    me.handed_over(("t", 1), now=0.0)
    chosen = me.partitions_to_claim(world, COUNTS, [], 0.5, NOW_MS + 500)
    assert ("t", 0) not in chosen and ("t", 1) not in chosen and len(chosen) == 3
    assert me.cooling_down(0.5) == [("t", 1)] and me.cooling_down(2.5) == []


def test_heartbeats_are_due_every_half_hb_and_claims_every_quarter_second_jittered() -> None:
    me = policy()
    assert me.heartbeat_due(0.0) and not me.heartbeat_due(0.4) and me.heartbeat_due(0.5)
    assert me.claim_due(0.0)
    dues = [t / 100 for t in range(1, 50) if me.claim_due(t / 100)]
    assert 0.125 <= dues[0] <= 0.375
    me.release_seen()
    assert me.claim_due(dues[0] + 0.01), "a release seen: claim at once"


def test_a_fair_member_over_its_share_hands_over_to_one_that_asks_once_the_need_lasted_an_hb() -> None:
    world, me = WorldState("g", 1000), policy(balance="fair")
    held = [("t", p) for p in range(10)]
    for _, p in held:
        claim(world, ME, p, NOW_MS)
    claim(world, OTHER, 0, NOW_MS + 10)  # refused: OTHER asks
    first = me.rebalance(world, 10, 10, held, 0.0, NOW_MS + 20)
    assert first.hand_over == [], "not before the need has lasted settle_s (an HB)"
    later = me.rebalance(world, 10, 10, held, 1.0, NOW_MS + 1000)
    assert later.hand_over == held[-5:], "the most recently claimed, down to the share"


def test_a_fair_member_does_not_ask_for_the_partitions_it_released_as_sick_until_their_cool_down_ends() -> None:
    # Asking would have them handed back, the cool-down would keep us from taking them, and they would bounce.
    world, me = WorldState("g", 1000), policy(balance="fair", sick_cooldown_s=60.0)
    for p in range(4):
        claim(world, OTHER, p, NOW_MS)
    assert me.rebalance(world, 4, 0, [], 0.0, NOW_MS).ask is not None, "holding none of 4 over 2 members: it asks"
    me = policy(balance="fair", sick_cooldown_s=60.0)
    for key in [("t", 2), ("t", 3)]:
        me.released(key, sick=True, now=0.0)
        me.release_decided(key)
    assert me.rebalance(world, 4, 0, [], 1.0, NOW_MS + 1000).ask is None, "its 2 sick ones are its share"
    assert me.rebalance(world, 4, 0, [], 61.0, NOW_MS + 1000).ask is not None, "cool-down over: it asks again"


def test_a_sick_partition_is_kept_when_no_other_member_could_take_it() -> None:
    me = policy(behind_cycles=1)
    health = PartitionHealth()
    health, _, call = me.judge_health(health, Sample(0.0, 0, 10), me.settings.health_policy(0.0), True, lambda: False)
    health, verdict, call = me.judge_health(
        health, Sample(1.0, 0, 20), me.settings.health_policy(0.0), True, lambda: False
    )
    assert verdict.release and call is HealthCall.NO_ONE_ELSE and health == PartitionHealth()
    health, verdict, call = me.judge_health(
        PartitionHealth(), Sample(0.0, 0, 10), me.settings.health_policy(0.0), True, lambda: True
    )
    _, verdict, call = me.judge_health(health, Sample(1.0, 0, 20), me.settings.health_policy(0.0), True, lambda: True)
    assert call is HealthCall.HAND_OVER


def test_a_workers_lease_ends_half_an_hb_before_the_fold_lets_another_member_claim() -> None:
    assert lease_until(10_000, 2000) == 13_000
