"""The audit's analysis of one coordination partition: tenures, hand-overs and their gaps, zombies, counts (pure)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.spark.ownership import ClientCounts, Handoff, LogSummary, OwnershipAudit, Tenure, Zombie

HB = 1000
GROUP = "billing"
T0 = 1_700_000_000_000


def rec(kind: type, client: str, instance: str, at: int, topic: str = "orders", partition: int = 0, **fields: object):
    where = {} if kind is codec.ReleaseGroup else {"topic": topic, "partition": partition}
    return kind(v=1, ts=T0 + at, group=fields.pop("group", GROUP), client=client, instance=instance, **where, **fields)


def feed_all(audit: OwnershipAudit, entries) -> list:
    """``feed`` over (record, record time, log offset) in log order, then ``finish``: every event."""
    events = [event for record, at, offset in entries for event in audit.feed(record, at, offset)]
    return events + list(audit.finish())


def audit_of(*records: codec.Record) -> tuple[OwnershipAudit, list]:
    """Feed records (their ts as record time) in order; every event, finish() included."""
    audit = OwnershipAudit(GROUP, HB, None, 0)
    events = feed_all(audit, ((r, r.ts, offset) for offset, r in enumerate(records)))
    return audit, events


def of(events: list, kind: type) -> list:
    return [e for e in events if type(e) is kind]


def test_a_clean_release_is_a_hand_over_from_the_release() -> None:
    _, events = audit_of(
        rec(codec.Claim, "a", "a1", 0),
        rec(codec.Heartbeat, "a", "a1", 500, offset=10),
        rec(codec.Release, "a", "a1", 1500, offset=30),
        rec(codec.Claim, "b", "b1", 1800),
    )
    [handoff] = of(events, Handoff)
    assert (handoff.kind, handoff.from_client, handoff.to_client) == ("release", "a", "b")
    assert (handoff.vacated_ms, handoff.claimed_ms, handoff.gap_ms, handoff.silence_ms) == (
        T0 + 1500,
        T0 + 1800,
        300,
        300,
    )
    assert handoff.resume_offset == 30
    first, second = sorted(of(events, Tenure), key=lambda t: t.start_ms)
    assert (first.client, first.start_ms, first.end_ms, first.end_reason, first.last_seen_ms, first.end_offset) == (
        "a",
        T0,
        T0 + 1500,
        "release",
        T0 + 500,
        30,
    )
    assert (second.client, second.end_ms, second.end_reason) == ("b", None, None)  # still the owner
    assert of(events, Zombie) == []


def test_a_stale_take_over_counts_its_gap_from_the_moment_the_owner_went_stale() -> None:
    _, events = audit_of(
        rec(codec.Claim, "c", "c1", 0),
        rec(codec.Heartbeat, "c", "c1", 500, offset=5),
        rec(codec.Claim, "d", "d1", 1000),  # refused: c is not stale yet
        rec(codec.Claim, "d", "d1", 3000),  # 2500 ms since c's last record > 2 HB
    )
    [handoff] = of(events, Handoff)
    assert (handoff.kind, handoff.from_client, handoff.to_client) == ("stale", "c", "d")
    assert handoff.vacated_ms == T0 + 500 + 2 * HB
    assert (handoff.gap_ms, handoff.silence_ms, handoff.resume_offset) == (500, 2500, 5)
    closed = [t for t in of(events, Tenure) if t.client == "c"]
    assert [(t.end_ms, t.end_reason) for t in closed] == [(T0 + 3000, "stale")]


def test_a_restart_reclaims_at_once_and_the_old_instance_becomes_a_zombie() -> None:
    _, events = audit_of(
        rec(codec.Claim, "a", "a1", 0),
        rec(codec.Heartbeat, "a", "a1", 400, offset=7),
        rec(codec.Claim, "a", "a2", 600),  # same client, new instance: fast reclaim
        rec(codec.Heartbeat, "a", "a1", 700, offset=8),  # the old process's last words
    )
    [handoff] = of(events, Handoff)
    assert (handoff.kind, handoff.from_instance, handoff.to_instance, handoff.gap_ms) == ("reclaim", "a1", "a2", 200)
    [zombie] = of(events, Zombie)
    assert (zombie.client, zombie.instance, zombie.owner_instance, zombie.owner_since_ms) == ("a", "a1", "a2", T0 + 600)


def test_zombies_are_non_owners_heartbeating_or_claiming_messages_while_someone_owns_it() -> None:
    audit, events = audit_of(
        rec(codec.Claim, "a", "a1", 0),
        rec(codec.Claim, "b", "b1", 1),  # a lost racer: a refused claim is no zombie
        rec(codec.Heartbeat, "b", "b1", 100, offset=3),  # ... but its heartbeat is
        rec(codec.ClaimMessages, "b", "b1", 200, offset=50),  # ... and so is its message claim
        rec(codec.Release, "a", "a1", 300, offset=4),
        rec(codec.Heartbeat, "b", "b1", 400, offset=3),  # nobody owns it: refused, but not a zombie
        rec(codec.ClaimMessages, "a", "a1", 5000, offset=60, partition=1),  # never owned: refused, no zombie
    )
    assert [(z.type, z.offset, z.owner_client) for z in of(events, Zombie)] == [
        ("heartbeat", 3, "a"),
        ("claim_messages", 50, "a"),
    ]
    assert audit.zombie_records == 2
    counts = {c.client: c for c in of(events, ClientCounts)}
    b = counts["b"]
    assert (b.records, b.claims, b.claims_accepted, b.heartbeats, b.heartbeats_accepted) == (4, 1, 0, 2, 0)
    assert (b.claim_messages, b.zombie_records, b.first_ms, b.last_ms) == (1, 2, T0 + 1, T0 + 400)
    a = counts["a"]
    assert (a.records, a.claims_accepted, a.releases_accepted, a.claim_messages, a.claim_messages_accepted) == (
        3,
        1,
        1,
        1,
        0,
    )


def test_an_owner_renewing_its_own_lapsed_claim_keeps_its_tenure() -> None:
    _, events = audit_of(rec(codec.Claim, "a", "a1", 0), rec(codec.Claim, "a", "a1", 5000))
    assert of(events, Handoff) == []
    [tenure] = of(events, Tenure)
    assert (tenure.start_ms, tenure.end_ms, tenure.last_seen_ms) == (T0, None, T0 + 5000)


def test_a_pause_ends_every_tenure_and_its_hand_overs_are_marked() -> None:
    _, events = audit_of(
        rec(codec.Claim, "a", "a1", 0),
        rec(codec.Claim, "b", "b1", 10, partition=1),
        rec(codec.ReleaseGroup, "ops", "op1", 100, expires=T0 + 2100),
        rec(codec.Claim, "b", "b1", 1000),  # refused: paused
        rec(codec.Claim, "b", "b1", 2500),
    )
    ended = sorted((t.partition, t.end_reason, t.end_ms) for t in of(events, Tenure) if t.end_ms is not None)
    assert ended == [(0, "pause", T0 + 100), (1, "pause", T0 + 100)]
    [handoff] = of(events, Handoff)
    assert (handoff.kind, handoff.partition, handoff.from_client, handoff.gap_ms) == ("pause", 0, "a", 2400)


def test_records_the_rules_do_not_look_at_change_nothing() -> None:
    audit = OwnershipAudit(GROUP, HB, 4, codec.coordination_partition("orders", 4))
    elsewhere = (codec.coordination_partition("orders", 4) + 1) % 4
    misrouted = OwnershipAudit(GROUP, HB, 4, elsewhere)
    claim = rec(codec.Claim, "a", "a1", 0)
    assert misrouted.feed(claim, T0, 0) == () and misrouted.state.stats.misrouted == 1
    assert audit.feed(rec(codec.Claim, "x", "x1", 0, group="other"), T0, 0) == ()
    [summary] = [e for e in audit.finish() if isinstance(e, LogSummary)]
    assert (summary.records, summary.partitions) == (0, 0)


# ------------------------------------------------------- against the whole fold


def _bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fold.py"
    spec = importlib.util.spec_from_file_location("bench_fold_for_audit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


@pytest.fixture(scope="module")
def bench_log():
    bench = _bench()
    # Long enough (in log time) for a crashed owner to go stale (2 HB = 10 s, ~1 ms per record).
    log = bench.build_log(
        30_000, seed=3, release_group_every=25_000, restart_every=2_000, crash_every=3_000, pause_ms=1_000
    )
    return bench, log


def test_auditing_each_coordination_partition_alone_agrees_with_the_whole_fold(bench_log) -> None:
    """Per coordination partition, in log order, as the Spark job does: the same owners as one reader's fold."""
    bench, log = bench_log
    whole = WorldState(bench.BUSY_GROUP, bench.HB_MS, bench.COORDINATION_PARTITIONS)
    by_source: dict[int, list] = defaultdict(list)
    for offset, (value, at, source) in enumerate(zip(log.values, log.times, log.sources)):
        try:
            record = codec.decode(value)
        except DecodeError:
            continue
        whole.apply(record, at, source)
        by_source[source].append((record, at, offset))

    events = []
    for source, entries in by_source.items():
        events += feed_all(
            OwnershipAudit(bench.BUSY_GROUP, bench.HB_MS, bench.COORDINATION_PARTITIONS, source), entries
        )

    summaries = of(events, LogSummary)
    assert sum(s.records for s in summaries) == whole.stats.applied
    assert sum(s.accepted for s in summaries) == whole.stats.accepted
    assert sum(s.partitions for s in summaries) == len(whole.partitions)
    still_owned = {
        (t.topic, t.partition): MemberId(t.client, t.instance) for t in of(events, Tenure) if t.end_ms is None
    }
    assert still_owned == {key: p.owner for key, p in whole.partitions.items() if p.owner is not None}

    handoffs, zombies = of(events, Handoff), of(events, Zombie)
    assert {h.kind for h in handoffs} >= {"release", "stale", "reclaim", "pause"}, "the log has every kind"
    assert zombies and sum(c.zombie_records for c in of(events, ClientCounts)) == len(zombies)
    assert all(0 <= h.gap_ms <= h.silence_ms for h in handoffs)
    # The timeline of a partition: tenures one after another, never two owners at once, each hand-over
    # joining the end of one tenure to the start of the next.
    tenures: dict[tuple[str, int], list[Tenure]] = defaultdict(list)
    for t in of(events, Tenure):
        tenures[(t.topic, t.partition)].append(t)
    starts = {(h.topic, h.partition, h.claimed_ms, h.to_instance) for h in handoffs}
    for held in tenures.values():
        held.sort(key=lambda t: t.log_offset)
        for before, after in itertools.pairwise(held):
            assert before.end_ms is not None and before.end_ms <= after.start_ms
        assert all(t.end_ms is not None for t in held[:-1])
    assert starts <= {(t.topic, t.partition, t.start_ms, t.instance) for t in of(events, Tenure)}


@given(st.lists(st.sampled_from(["claim", "heartbeat", "release"]), max_size=40), st.randoms(use_true_random=False))
def test_every_zombie_is_a_refused_record_from_a_non_owner(kinds: list[str], rng) -> None:
    audit = OwnershipAudit(GROUP, HB, None, 0)
    now = 0
    for offset, kind in enumerate(kinds):
        now += rng.choice([1, 500, 2500])
        client, instance = rng.choice([("a", "a1"), ("a", "a2"), ("b", "b1")])
        owner = audit.state.owner("orders", 0)
        if kind == "claim":
            record = rec(codec.Claim, client, instance, now)
        else:
            record = rec(codec.Heartbeat if kind == "heartbeat" else codec.Release, client, instance, now, offset=1)
        events = audit.feed(record, record.ts, offset)
        zombie = [e for e in events if isinstance(e, Zombie)]
        expected = kind == "heartbeat" and owner is not None and owner != (client, instance)
        assert bool(zombie) == expected


def test_operators_orders_are_folded_and_the_hand_overs_they_cause_audited_as_usual() -> None:
    from marshal_workers.spark.audit import RECORD_COLUMNS, _row

    orders = [
        codec.Control(v=1, ts=T0 + 100, group=GROUP, client="admin@ops", instance="o1", target="a", action="drain"),
        codec.PauseTopic(v=1, ts=T0 + 200, group=GROUP, client="admin@ops", instance="o1", topic="payments", expires=0),
        rec(codec.ReleasePartition, "admin@ops", "o1", 300),
    ]
    audit, events = audit_of(
        rec(codec.Claim, "a", "a1", 0),
        *orders,
        rec(codec.Release, "a", "a1", 500, offset=9),
        rec(codec.Claim, "a", "a1", 600),
        rec(codec.Claim, "b", "b1", 700),
    )
    [handoff] = of(events, Handoff)
    assert (handoff.kind, handoff.from_client, handoff.to_client) == ("release", "a", "b")
    assert audit.state.is_drained("a"), "a's claim after the drain was refused"
    rows = [_row(order, 0, offset, order.ts) for offset, order in enumerate(orders)]
    assert all(len(row) == len(RECORD_COLUMNS) for row in rows)
    assert rows[0][-1] == "drain a" and rows[1][7] == "payments" and rows[2][7:9] == ("orders", 0)
