"""copy_on_write.copy_before, the simulator's members' shared fold (docs/simulation.md): a copy to fold one record
into is the state that record's fold would make, and the state it was made from stays as it was."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples
from test_world_state_properties import CLIENTS, GROUP, HB, STEPS, TOPICS, batched, fold_all, logs
from test_world_view import group_view_by_scan, group_view_of, holdings_by_scan, release_requests_by_scan

from marshal_workers.protocol import codec
from marshal_workers.protocol.copy_on_write import copy_before
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.lists(st.sampled_from(STEPS), min_size=1, max_size=3), st.booleans())
def test_a_copy_before_a_record_folds_it_as_the_state_would_and_leaves_the_state_as_it_was(
    log: list[codec.Record], lags: list[int], as_members_write: bool
) -> None:
    """copy_before (the simulator's members share one fold through it): a chain of copies, one per record, is at
    every step equal to the state folding the log itself, gives the same verdicts and answers, and every state of
    the chain stays the fold of its own prefix while the later ones fold on.  Also with the heartbeats joined
    into one record per writer, as members write them."""
    if as_members_write:
        log = batched(log)
    folded = WorldState(GROUP, HB)
    chain = [WorldState(GROUP, HB)]
    prefixes = [copy.deepcopy(folded)]
    keys = tuple((topic, p) for topic in TOPICS for p in range(4))
    for record in log:
        before = copy.deepcopy(chain[-1])
        state = copy_before(chain[-1], record)
        assert state.apply(record, record.ts) == folded.apply(record, record.ts)
        assert chain[-1] == before and chain[-1].groups_seen == before.groups_seen
        assert state == folded and state.groups_seen == folded.groups_seen
        assert state.directory_known == folded.directory_known
        for lag in lags:
            now = record.ts + lag
            state.relearn_free_index(now - HB)  # as the simulator's shared fold does now and then: no answer changes
            for who in CLIENTS[:3]:
                assert state.free_partitions(keys, now, *who) == folded.free_partitions(list(keys), now, *who)
            assert list(state.holdings(now).items()) == holdings_by_scan(folded, now)
        for who in CLIENTS:
            assert state.release_requests(MemberId(*who)) == release_requests_by_scan(folded, MemberId(*who))
        for lag in lags:  # the view kept in a box the copies share stays each state's own
            for who in CLIENTS[:3]:
                for earlier, prefix in [(state, folded), (chain[-1], prefixes[-1])]:
                    now = record.ts + lag
                    assert group_view_of(earlier, now, MemberId(*who)) == group_view_by_scan(
                        prefix, now, MemberId(*who)
                    )
        chain.append(state)
        prefixes.append(copy.deepcopy(folded))
    for kept, prefix in zip(chain, prefixes, strict=True):
        assert kept == prefix and kept.stats == prefix.stats
        for who in CLIENTS:  # the index a later copy changed is not this state's
            assert kept.release_requests(MemberId(*who)) == release_requests_by_scan(prefix, MemberId(*who))
            for now in (prefix.stats.applied * HB, 0, 10 * HB):
                assert group_view_of(kept, now, MemberId(*who)) == group_view_by_scan(prefix, now, MemberId(*who))


def test_a_copy_before_a_record_it_does_not_know_is_a_whole_copy() -> None:
    """A release_group changes every partition of its coordination partition: the copy shares none of them."""
    state = fold_all([codec.Claim(v=1, ts=1, group=GROUP, client="a", instance="a1", topic="orders", partition=0)])
    record = codec.ReleaseGroup(v=1, ts=2, group=GROUP, client="op", instance="op1", expires=3 * HB)
    copied = copy_before(state, record)
    copied.apply(record, 2)
    assert state.owner("orders", 0) == MemberId("a", "a1") and copied.owner("orders", 0) is None


def test_a_copy_before_a_range_record_leaves_the_source_s_leases_alone() -> None:
    """Range records change a shared partition's leases: the copy folds them, the state it was made from keeps its own."""
    common = {"v": 1, "group": GROUP, "client": "a", "instance": "a1", "topic": "orders"}
    first = codec.ClaimRanges(**common, ts=1, lease_ms=HB, ranges=(codec.RangeEntry(partition=0, offset=0, end=10),))
    state = fold_all([first])
    before = copy.deepcopy(state)
    ack = codec.AckRanges(**common, ts=2, ranges=(codec.AckEntry(partition=0, offset=0, end=10),))
    folded = fold_all([first])
    verdict = folded.apply(ack, 2)
    copied = copy_before(state, ack)
    assert copied.apply(ack, 2) == verdict and all(verdict)
    assert state == before and state.shared == before.shared
    assert copied == folded and copied.shared != state.shared
