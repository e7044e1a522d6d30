"""Range leases of shared partitions (docs/shared-partitions.md): the rules a user relies on, by example.

The bookkeeping itself (range_leases.SharedPartition), the fold of the four range records through
WorldState.apply with real codec records, and the checkpoint of shared partitions; and
also the Read / Ack / Cancel service's per-message records (deliver_messages, ack_messages,
cancel_messages) and how ending a lease settles what clients acked.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from marshal_workers.errors import DecodeError
from marshal_workers.observe.status import status_document
from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import MAX_RANGE, MAX_WINDOW, SharedPartition, Tries
from marshal_workers.protocol.refusals import refusals
from marshal_workers.protocol.world_state import WorldState

A = MemberId("host-a", "a1")
B = MemberId("host-b", "b1")
LEASE = 1000
GROUP = "g"
HB = 1000


def partition(*claims: tuple[int, int, MemberId], amo: bool = False, at: int = 0) -> SharedPartition:
    shared = SharedPartition()
    for start, end, holder in claims:
        assert shared.claim(start, end, holder, at, LEASE, amo)
    return shared


# ------------------------------------------------------------------------------------------- claims


def test_the_first_claim_sets_the_low_water_mark_and_overlapping_claims_are_refused() -> None:
    shared = partition((100, 110, A))
    assert shared.low == 100
    assert not shared.claim(105, 115, B, 1, LEASE, False)  # overlaps A's lease
    assert not shared.claim(95, 101, B, 1, LEASE, False)  # below low, and overlapping
    assert not shared.claim(100, 110, A, 1, LEASE, False)  # the holder itself: still a live lease
    assert not shared.claim(109, 120, A, 1, LEASE, False)
    assert shared.claim(110, 120, B, 1, LEASE, False)  # adjacent: fine
    assert [(lease.start, lease.end, lease.holder) for lease in shared.live_leases(1)] == [(100, 110, A), (110, 120, B)]


def test_empty_and_oversized_ranges_are_refused() -> None:
    shared = SharedPartition()
    assert not shared.claim(5, 5, A, 0, LEASE, False)
    assert not shared.claim(6, 5, A, 0, LEASE, False)
    assert not shared.claim(0, MAX_RANGE + 1, A, 0, LEASE, False)
    assert shared.low is None and not shared.leases  # a refused first claim sets nothing
    assert shared.claim(0, MAX_RANGE, A, 0, LEASE, False)


def test_claims_stay_within_the_window_above_the_low_water_mark() -> None:
    shared = partition((0, 10, A))
    assert not shared.claim(MAX_WINDOW - 5, MAX_WINDOW + 5, B, 1, LEASE, False)  # reaches past low + window
    assert shared.claim(MAX_WINDOW - 10, MAX_WINDOW, B, 1, LEASE, False)  # ends exactly at the window's edge
    # free_ranges offers nothing beyond the window either, whatever the partition's end.
    free = list(shared.free_ranges(1, 10 * MAX_WINDOW, MAX_RANGE, 10_000))
    assert free[-1][1] == MAX_WINDOW - 10
    assert shared.ack(0, 10, A, 2, (), ())
    assert shared.low == 10 and shared.claim(MAX_WINDOW, MAX_WINDOW + 10, A, 3, LEASE, False)  # the window moved


# ------------------------------------------------------------------------------------------- lapses


def test_a_lapsed_at_least_once_lease_is_claimable_again_with_one_try_more() -> None:
    shared = partition((0, 10, A))
    assert not shared.claim(0, 10, B, LEASE - 1, LEASE, False)  # still live a ms before it lapses
    # Before any record lapses it, a query at `now` already sees the lapse: its own range, one try.
    assert list(shared.free_ranges(LEASE, 30, 50, 10)) == [(0, 10), (10, 30)]
    assert shared.tries_in(0, 30, now=LEASE) == [Tries(0, 10, 1)]
    assert shared.leases and shared.lapsed == 0  # queries change nothing
    assert shared.claim(0, 10, B, LEASE, LEASE, False)
    assert shared.lapsed == 1 and shared.lost == 0
    assert shared.tries_in(0, 10) == [Tries(0, 10, 1)]
    assert shared.tries_in(4, 6) == [Tries(4, 6, 1)]  # clipped to the range asked for
    # It lapses again: two tries.
    assert shared.claim(0, 10, A, 2 * LEASE, LEASE, False)
    assert shared.tries_in(0, 10) == [Tries(0, 10, 2)] and shared.lapsed == 2
    assert shared.ack(0, 10, A, 2 * LEASE + 1, (), ())
    assert shared.tries == [] and shared.low == 10  # done: no tries kept


def test_a_lapsed_at_most_once_lease_is_lost_and_never_claimable_again() -> None:
    shared = partition((0, 10, A), amo=True)
    assert shared.claim(10, 20, B, 0, LEASE, True)
    assert list(shared.free_ranges(LEASE, 30, 50, 10)) == [(20, 30)]  # the lapsed AMO leases are not offered
    assert not shared.claim(0, 10, B, LEASE, LEASE, True)
    assert shared.lost == 20 and shared.lapsed == 2 and shared.acked == 0
    assert shared.low == 20 and shared.is_done(5) and shared.is_done(15)
    for later in (LEASE + 1, 10 * LEASE):
        assert not shared.claim(5, 6, A, later, LEASE, True)
        assert not shared.claim(5, 6, A, later, LEASE, False)
    assert shared.tries_in(0, 20) == []


def test_renew_keeps_a_lease_alive_past_its_first_expiry() -> None:
    shared = partition((0, 10, A))
    assert shared.renew(0, 10, A, LEASE - 100, LEASE)
    assert shared.leases[0].expires == 2 * LEASE - 100
    assert not shared.claim(0, 10, B, LEASE + 500, LEASE, False)  # past the first expiry: still A's
    assert shared.lapsed == 0
    assert shared.ack(0, 10, A, 2 * LEASE - 101, (), ())  # A settles it in time
    assert shared.low == 10 and shared.acked == 10


def test_a_renewal_never_shortens_a_lease_and_comes_too_late_once_it_lapsed() -> None:
    shared = partition((0, 10, A))
    assert shared.renew(0, 10, A, 10, 1)
    assert shared.leases[0].expires == LEASE
    assert not shared.renew(0, 10, A, LEASE, LEASE)  # lapsed at LEASE exactly
    assert not shared.leases and shared.tries_in(0, 10) == [Tries(0, 10, 1)]


# --------------------------------------------------------------------------------------- acks, cancels


def test_an_ack_with_failed_offsets_gives_them_back_at_once_and_moves_low_past_the_rest() -> None:
    shared = partition((0, 10, A), (10, 20, B))
    assert shared.ack(0, 10, A, 5, (3, 7), ())
    assert shared.low == 3 and shared.acked == 8
    assert not shared.is_done(3) and shared.is_done(4) and not shared.is_done(7) and shared.is_done(9)
    assert shared.tries_in(0, 20) == [Tries(3, 4, 1), Tries(7, 8, 1)]
    # Claimable at once (no wait for a lapse), each on its own: never mixed with untried offsets.
    assert list(shared.free_ranges(5, 40, 50, 10)) == [(3, 4), (7, 8), (20, 40)]
    assert not shared.claim(3, 5, A, 6, LEASE, False)  # 4 is done
    assert shared.claim(3, 4, B, 6, LEASE, False)
    assert shared.ack(3, 4, B, 7, (3,), ())  # fails again
    assert shared.tries_in(3, 4) == [Tries(3, 4, 2)]
    assert shared.claim(3, 4, A, 8, LEASE, False) and shared.ack(3, 4, A, 9, (), ())
    assert shared.low == 7 and shared.tries_in(0, 20) == [Tries(7, 8, 1)]


def test_failed_offsets_of_an_at_most_once_lease_are_lost() -> None:
    shared = partition((0, 10, A), amo=True)
    assert shared.ack(0, 10, A, 5, (3, 7), ())
    assert shared.lost == 2 and shared.acked == 8 and shared.low == 10 and shared.tries == []
    assert not shared.claim(3, 4, B, 6, LEASE, True)


def test_dead_letters_are_done_and_counted() -> None:
    shared = partition((0, 10, A))
    assert shared.ack(0, 10, A, 5, (1,), (2, 5))
    assert shared.dead_letters == 2 and shared.acked == 9 and shared.low == 1
    assert shared.is_done(2) and shared.is_done(5)


@pytest.mark.parametrize(
    ("failed", "dead"),
    [((10,), ()), ((), (10,)), ((5, 3), ()), ((3, 3), ()), ((), (4, 2)), ((3,), (3,)), ((-1,), ())],
    ids=["failed-outside", "dead-outside", "failed-unordered", "failed-repeated", "dead-unordered", "both", "negative"],
)
def test_an_ack_with_offsets_outside_its_range_or_out_of_order_changes_nothing(
    failed: tuple[int, ...], dead: tuple[int, ...]
) -> None:
    shared = partition((0, 10, A))
    before = copy.deepcopy(shared)
    assert not shared.ack(0, 10, A, 5, failed, dead)
    assert shared == before


def test_a_cancel_gives_the_range_back_untried() -> None:
    shared = partition((0, 10, A), amo=True)
    assert shared.cancel(0, 10, A, 5)
    assert not shared.leases and shared.tries == [] and shared.lost == 0 and shared.low == 0
    assert shared.claim(0, 10, B, 6, LEASE, True)


@pytest.mark.parametrize(
    "attempt",
    [
        lambda s: s.ack(0, 10, B, 5, (), ()),  # not the holder
        lambda s: s.ack(0, 10, MemberId("host-a", "a2"), 5, (), ()),  # the holder's client, another instance
        lambda s: s.ack(0, 20, A, 5, (), ()),  # two leases at once
        lambda s: s.ack(5, 10, A, 5, (), ()),
        lambda s: s.ack(30, 40, A, 5, (), ()),  # nothing leased there
        lambda s: s.cancel(0, 10, B, 5),
        lambda s: s.cancel(0, 5, A, 5),
        lambda s: s.renew(0, 10, B, 5, LEASE),
        lambda s: s.renew(0, 11, A, 5, LEASE),
        lambda s: s.renew(10, 20, B, 5, LEASE),  # the other lease of A
    ],
)
def test_acks_cancels_and_renewals_from_a_non_holder_or_not_matching_a_lease_change_nothing(attempt) -> None:  # type: ignore[no-untyped-def]
    shared = partition((0, 10, A), (10, 20, A))
    before = copy.deepcopy(shared)
    assert not attempt(shared)
    assert shared == before


def test_an_ack_after_the_lease_lapsed_is_refused_even_if_nobody_claimed_it_since() -> None:
    shared = partition((0, 10, A))
    assert not shared.ack(0, 10, A, LEASE, (), ())
    assert shared.acked == 0 and shared.low == 0 and shared.tries_in(0, 10) == [Tries(0, 10, 1)]


# ------------------------------------------------------------------------------------------ free_ranges


def test_free_ranges_skip_leased_and_done_offsets_and_never_mix_try_counts() -> None:
    shared = partition((0, 10, A), (10, 20, A), (20, 30, B), (40, 45, B))
    assert shared.ack(10, 20, A, 1, (), ())  # done above low
    assert shared.ack(20, 30, B, 1, (25,), ())  # 25: one try
    assert shared.cancel(40, 45, B, 1)  # back untried
    assert shared.claim(60, 70, B, 1, LEASE, False)
    # Leased: 0-9, 60-69.  Done: 10-24, 26-29.  One try: 25.
    assert list(shared.free_ranges(2, 100, 50, 10)) == [(25, 26), (30, 60), (70, 100)]
    assert list(shared.free_ranges(2, 100, 12, 3)) == [(25, 26), (30, 42), (42, 54)]  # size and most
    assert list(shared.free_ranges(2, 50, 50, 10)) == [(25, 26), (30, 50)]  # the partition's end
    assert list(shared.free_ranges(2, 100, 50, 0)) == []
    assert list(SharedPartition().free_ranges(2, 100, 50, 10)) == []  # no low yet: the caller knows the start
    for start, end in shared.free_ranges(2, 100, 50, 10):
        assert len({t.count for t in shared.tries_in(start, end)}) <= 1
        assert not shared.tries_in(start, end) or shared.tries_in(start, end)[0][:2] == (start, end)
        assert shared.claim(start, end, A, 2, LEASE, False)


def test_free_ranges_split_where_the_try_count_changes() -> None:
    shared = partition((0, 10, A))
    assert shared.ack(0, 10, A, 1, tuple(range(10)), ())  # everything failed once: 0-9 one try
    assert shared.claim(0, 5, B, 2, LEASE, False)
    assert shared.ack(0, 5, B, 3, (0, 1, 2, 3, 4), ())  # 0-4 two tries
    assert shared.tries == [Tries(0, 5, 2), Tries(5, 10, 1)]
    assert list(shared.free_ranges(4, 20, 50, 10)) == [(0, 5), (5, 10), (10, 20)]


# ------------------------------------------------------------------------- through WorldState.apply


def common(holder: MemberId, ts: int, group: str = GROUP) -> dict[str, object]:
    return {"v": 1, "ts": ts, "group": group, "client": holder.client, "instance": holder.instance}


def ranges(*entries: tuple[int, int, int]) -> tuple[codec.RangeEntry, ...]:
    return tuple(codec.RangeEntry(partition=p, offset=start, end=end) for p, start, end in entries)


def wire(record: codec.Record) -> codec.Record:
    decoded = codec.decode(codec.encode(record))
    assert decoded == record
    return decoded


def fold_wire(state: WorldState, record: codec.Record, source: int = 0) -> object:
    return state.apply(wire(record), record.ts, source)


def test_queries_at_a_time_see_a_lease_lapsed_after_the_partitions_last_record() -> None:
    """The last lease of a partition lapses with no record after it: status and the metrics see it lapsed (the
    nemesis found status stuck at an at-most-once lease of one offset once production had stopped)."""
    state = WorldState(GROUP, HB)
    claim = codec.ClaimRanges(**common(A, 1_000), topic="t", lease_ms=LEASE, amo=True, ranges=ranges((0, 10, 11)))
    assert tuple(fold_wire(state, claim)) == (True,)  # type: ignore[arg-type]
    shared = state.shared[("t", 0)]
    assert shared.as_of(1_000 + LEASE - 1) is shared  # nothing lapsed yet: no copy
    assert state.shared_marks(1_000 + LEASE - 1) == {("t", 0): (10, 0)}
    assert state.shared_marks(1_000 + LEASE) == {("t", 0): (11, 1)}  # lost, and the low-water mark past it
    [row] = status_document(state, 1_000 + LEASE, topic="t")["shared"]
    assert (row["low_water_mark"], row["lost"], row["lapsed_leases"], row["leases"]) == (11, 1, 1, [])
    assert shared.low == 10 and shared.lost == 0  # a query changes nothing: the lapse is the next record's


def test_range_records_fold_with_one_verdict_per_entry() -> None:
    state = WorldState(GROUP, HB)
    claim = codec.ClaimRanges(
        **common(A, 10), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10), (1, 5, 9), (0, 5, 15))
    )
    verdicts = fold_wire(state, claim)
    assert tuple(verdicts) == (True, True, False) and verdicts  # type: ignore[arg-type]
    assert state.shared_partition("t", 0).low == 0 and state.shared_partition("t", 1).low == 5  # type: ignore[union-attr]
    assert state.shared_partition("t", 2) is None
    renew = codec.RenewRanges(
        **common(A, LEASE), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10), (1, 5, 8), (2, 0, 1))
    )
    assert tuple(fold_wire(state, renew)) == (True, False, False)  # type: ignore[arg-type]
    ack = codec.AckRanges(
        **common(A, LEASE + 20),
        topic="t",
        ranges=(
            codec.AckEntry(partition=0, offset=0, end=10, failed=(4,), dead=(6,)),
            codec.AckEntry(partition=1, offset=5, end=9),
        ),
    )
    assert tuple(fold_wire(state, ack)) == (True, False)  # type: ignore[arg-type]  # partition 1 lapsed at 1010
    shared = state.shared_partition("t", 0)
    assert shared is not None and shared.low == 4 and shared.tries == [Tries(4, 5, 1)] and shared.dead_letters == 1
    assert state.shared_partition("t", 1).tries == [Tries(5, 9, 1)]  # type: ignore[union-attr]
    cancel = codec.CancelRanges(**common(B, LEASE + 30), topic="t", ranges=ranges((0, 4, 5)))
    assert tuple(fold_wire(state, cancel)) == (False,)  # type: ignore[arg-type]
    amo = codec.ClaimRanges(**common(B, LEASE + 40), topic="m", lease_ms=LEASE, amo=True, ranges=ranges((0, 0, 10)))
    assert tuple(fold_wire(state, amo)) == (True,)  # type: ignore[arg-type]
    held = state.shared_partition("m", 0).leases[0]  # type: ignore[union-attr]
    assert held.amo and held.holder == B and held.claimed_at == LEASE + 40 and held.expires == 2 * LEASE + 40
    assert state.stats.applied == 5 and state.stats.accepted == 4


def test_a_pause_refuses_range_claims_and_renewals_but_not_acks_and_cancels() -> None:
    state = WorldState(GROUP, HB)
    claim = codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=10 * LEASE, ranges=ranges((0, 0, 10), (0, 10, 20)))
    assert fold_wire(state, claim)
    fold_wire(state, codec.ReleaseGroup(**common(MemberId("admin@ops", "op1"), 5), expires=5000))
    before = copy.deepcopy(state.shared)
    paused_claim = codec.ClaimRanges(**common(B, 10), topic="t", lease_ms=LEASE, ranges=ranges((0, 20, 30)))
    assert tuple(fold_wire(state, paused_claim)) == (False,)  # type: ignore[arg-type]
    renew = codec.RenewRanges(**common(A, 10), topic="t", lease_ms=LEASE * 20, ranges=ranges((0, 0, 10)))
    assert tuple(fold_wire(state, renew)) == (False,)  # type: ignore[arg-type]
    assert state.shared == before
    ack = codec.AckRanges(**common(A, 20), topic="t", ranges=(codec.AckEntry(partition=0, offset=0, end=10),))
    cancel = codec.CancelRanges(**common(A, 20), topic="t", ranges=ranges((0, 10, 20)))
    assert fold_wire(state, ack) and fold_wire(state, cancel)
    assert state.shared_partition("t", 0).low == 10  # type: ignore[union-attr]
    assert fold_wire(state, codec.ClaimRanges(**common(B, 5000), topic="t", lease_ms=LEASE, ranges=ranges((0, 10, 20))))


def test_range_records_of_other_groups_or_on_the_wrong_coordination_partition_are_ignored() -> None:
    state = WorldState(GROUP, HB, coordination_partitions=4)
    home = codec.coordination_partition("t", 4)
    other = codec.ClaimRanges(**common(A, 0, group="other"), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10)))
    misrouted = codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10)))
    assert not fold_wire(state, other, home)
    assert not fold_wire(state, misrouted, (home + 1) % 4)
    assert state.shared == {} and state.stats.other_groups == 1 and state.stats.misrouted == 1
    assert fold_wire(state, misrouted, home)
    before = copy.deepcopy(state.shared)
    for record in (
        codec.AckRanges(**common(A, 1), topic="t", ranges=(codec.AckEntry(partition=0, offset=0, end=10),)),
        codec.CancelRanges(**common(A, 1), topic="t", ranges=ranges((0, 0, 10))),
        codec.RenewRanges(**common(A, 1), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))),
    ):
        assert not fold_wire(state, record, (home + 1) % 4)
    assert state.shared == before


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"{",
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"b","instance":"b1","topic":"t","lease_ms":1000,'
            b'"ranges":[]}'
        ),  # no entry
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"b","instance":"b1","topic":"t","lease_ms":0,'
            b'"ranges":[{"partition":0,"offset":20,"end":30}]}'
        ),  # a lease of 0 ms
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"b","instance":"b1","topic":"t","lease_ms":86400001,'
            b'"ranges":[{"partition":0,"offset":20,"end":30}]}'
        ),  # longer than a day
        (
            b'{"v":1,"type":"claim_ranges","ts":1,"group":"g","client":"b","instance":"b1","topic":"t","lease_ms":1000,'
            b'"ranges":[{"partition":0,"offset":-1,"end":30}]}'
        ),
        (
            b'{"v":1,"type":"renew_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"ranges":[{"partition":0,"offset":0,"end":10}]}'
        ),  # no lease_ms
        (
            b'{"v":1,"type":"ack_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"ranges":[{"partition":0,"offset":0,"end":10,"failed":[-3]}]}'
        ),
        (
            b'{"v":1,"type":"ack_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"ranges":[{"partition":0,"offset":0,"end":10,"dead":"all"}]}'
        ),
        (
            b'{"v":1,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"ranges":[{"partition":0,"offset":0}]}'
        ),  # no end
        b'{"v":1,"type":"cancel_ranges","ts":1,"group":"g","client":"a","instance":"a1","topic":"t","ranges":{}}',
        (
            b'{"v":1,"type":"deliver_messages","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"pending_ms":0,"messages":[[0,3]]}'
        ),  # pending for 0 ms
        (
            b'{"v":1,"type":"deliver_messages","ts":1,"group":"g","client":"a","instance":"a1","topic":"t",'
            b'"messages":[[0,3]]}'
        ),  # no pending_ms
        b'{"v":1,"type":"ack_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"t","messages":[]}',
        (
            b'{"v":1,"type":"ack_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"t",'
            b'"messages":[{"partition":0,"offset":3}]}'
        ),  # an object, not [partition, offset]
        (
            b'{"v":1,"type":"cancel_messages","ts":1,"group":"g","client":"b","instance":"b1","topic":"t",'
            b'"messages":[[0,-3]]}'
        ),
    ],
)
def test_garbage_range_records_never_change_the_state(value: bytes | None) -> None:
    state = WorldState(GROUP, HB)
    fold_wire(state, codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))))
    before = copy.deepcopy(state)
    with pytest.raises(DecodeError):
        state.apply_value(value)
    assert state.shared == before.shared and state.partitions == before.partitions
    assert state.stats.garbage == before.stats.garbage + 1


def test_the_json_of_an_ack_leaves_out_empty_failed_and_dead() -> None:
    ack = codec.AckRanges(**common(A, 1), topic="t", ranges=(codec.AckEntry(partition=0, offset=0, end=10),))
    assert b"failed" not in codec.encode(ack) and b"dead" not in codec.encode(ack)
    assert codec.record_key(ack) == b"g/t"


# ------------------------------------------------------------------------------------------ checkpoints

WRITER = {"v": 1, "group": GROUP, "client": "w", "instance": "w1"}


def busy_state() -> WorldState:
    state = WorldState(GROUP, HB)
    records: list[codec.Record] = [
        codec.ClaimRanges(
            **common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10), (0, 10, 20), (1, 50, 60))
        ),
        codec.ClaimRanges(**common(B, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 30, 40))),
        codec.ClaimRanges(**common(B, 0), topic="m", lease_ms=LEASE, amo=True, ranges=ranges((0, 0, 5), (0, 5, 10))),
        codec.AckRanges(
            **common(A, 10),
            topic="t",
            ranges=(codec.AckEntry(partition=0, offset=10, end=20, failed=(12,), dead=(15,)),),
        ),
        codec.AckRanges(
            **common(B, 10), topic="m", ranges=(codec.AckEntry(partition=0, offset=5, end=10, failed=(7,)),)
        ),
        codec.CancelRanges(**common(B, 20), topic="t", ranges=ranges((0, 30, 40))),
        codec.RenewRanges(**common(A, 900), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))),
        codec.ClaimRanges(**common(B, 1000), topic="t", lease_ms=LEASE, ranges=ranges((1, 60, 70))),  # 50-59 lapsed
        codec.ClaimRanges(
            **common(A, 1000), topic="m", lease_ms=LEASE, amo=True, ranges=ranges((0, 10, 20))
        ),  # 0-4 lost
    ]
    for record in records:
        fold_wire(state, record)
    return state


def test_a_checkpoint_carries_shared_partitions_and_a_seeded_reader_holds_the_same() -> None:
    state = busy_state()
    t0, t1, m0 = state.shared[("t", 0)], state.shared[("t", 1)], state.shared[("m", 0)]
    assert t0.low == 0 and t0.done == [(10, 12), (13, 20)] and t0.tries == [Tries(12, 13, 1)] and t0.dead_letters == 1
    assert t1.lapsed == 1 and t1.tries == [Tries(50, 60, 1)] and set(t1.leases) == {60}
    assert m0.lost == 6 and m0.low == 10 and m0.lapsed == 1
    for per_record in (1, 10, 1000):
        parts = [wire(part) for part in checkpoints.state_records(state, 0, 42, WRITER | {"ts": 1000}, per_record)]
        assert all(isinstance(part, codec.Checkpoint) for part in parts)
        assert sum(len(part.shared) for part in parts) == 3  # type: ignore[union-attr]
        seeded = WorldState(GROUP, HB)
        checkpoints.seed(seeded, parts, 0)  # type: ignore[arg-type]
        assert seeded.shared == state.shared
    # The seeded reader goes on as the other: the same rules apply to the same leases.
    later = codec.ClaimRanges(**common(B, 2000), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10), (0, 12, 13)))
    seeded_verdicts = fold_wire(seeded, later)
    assert tuple(seeded_verdicts) == tuple(fold_wire(state, later)) == (True, True)  # type: ignore[arg-type]
    assert seeded.shared == state.shared


def lease(offset: int, end: int, client: str = "a", **messages: Any) -> codec.LeasePosition:
    """A checkpoint's lease; ``messages``: its ``handed`` and ``acked``."""
    return codec.LeasePosition(
        offset=offset, end=end, client=client, instance=client + "1", expires=LEASE, claimed_at=0, **messages
    )


@pytest.mark.parametrize(
    "hostile",
    [
        {"low": 0, "leases": (lease(0, 10), lease(5, 15, "b"))},  # overlapping leases
        {"low": 0, "leases": (lease(0, 10), lease(0, 5, "b"))},  # two leases at one offset
        {"low": 20, "done": ((10, 15),)},  # done below low
        {"low": 20, "done": ((25, 30),), "leases": (lease(10, 30),)},  # a lease below low, over a done range
        {"low": 0, "done": ((50, 60), (20, 30))},  # done ranges out of order
        {"low": 0, "done": ((20, 30), (25, 40))},  # overlapping done ranges
        {"low": 0, "done": ((0, 10),)},  # a done range at low: low would be past it
        {"low": 0, "done": ((5, 5),)},  # an empty range
        {"low": None, "done": ((5, 10),)},  # done without low
        {"low": None, "leases": (lease(0, 10),)},  # a lease without low
        {"low": 0, "tries": ((10, 5, 1),)},  # an upside-down try range
        {"low": 0, "tries": ((0, 10, 1), (5, 15, 1))},  # overlapping tries
        {"low": 0, "tries": ((0, 10, 0),)},  # zero tries
        {"low": 0, "leases": (lease(0, 10, handed=((10, 500, 1),)),)},  # a client's message outside its lease
        {"low": 0, "leases": (lease(0, 10, handed=((3, 500, 1),), acked=(3, 12)),)},  # an ack outside it
    ],
)
def test_a_hostile_checkpoint_entry_is_ignored(hostile: dict[str, object]) -> None:
    honest = codec.SharedPosition(topic="t", partition=1, low=0, done=((5, 8),))
    bad = codec.SharedPosition(topic="t", partition=0, **hostile)  # type: ignore[arg-type]
    part = codec.Checkpoint(**WRITER, ts=1, source=0, as_of=3, shared=(bad, honest))
    state = WorldState(GROUP, HB)
    checkpoints.seed(state, [wire(part)], 0)  # type: ignore[list-item]
    assert set(state.shared) == {("t", 1)}
    assert state.shared[("t", 1)].done == [(5, 8)]


def test_shared_partitions_of_topics_routed_elsewhere_are_not_seeded() -> None:
    state = busy_state()
    count = 4
    routed = WorldState(GROUP, HB, coordination_partitions=count)
    home = codec.coordination_partition("t", count)
    elsewhere = (home + 1) % count
    routed.shared = copy.deepcopy(state.shared)
    parts = checkpoints.state_records(routed, home, 1, WRITER | {"ts": 1})
    assert {(s.topic, s.partition) for part in parts for s in part.shared} >= {("t", 0), ("t", 1)}
    reader = WorldState(GROUP, HB, coordination_partitions=count)
    checkpoints.seed(reader, parts, elsewhere)
    assert not any(topic == "t" for topic, _ in reader.shared)


def test_an_ack_of_a_prefix_settles_it_and_gives_the_rest_back_untried() -> None:
    shared = partition((0, 10, A))
    assert shared.ack(0, 4, A, 5, (2,), (), high=40)  # a worker stopped at the partition's end after offset 3
    assert not shared.leases and shared.low == 2 and shared.done == [(3, 4)] and shared.high == 40
    assert shared.tries_in(0, 10) == [Tries(2, 3, 1)], "only the failed offset was tried: 4..9 go back untried"
    assert list(shared.free_ranges(6, 40, 100, 5)) == [(2, 3), (4, 40)]


def test_the_log_command_prints_range_records_with_their_entries() -> None:
    from marshal_workers.ops.admin import format_record

    common = {"v": 1, "ts": 1_764_000_005_000, "group": "g", "client": "host-a", "instance": "5f1c"}
    claim = codec.ClaimRanges(
        **common,
        topic="thumbs",
        lease_ms=60_000,
        amo=True,
        ranges=(codec.RangeEntry(partition=0, offset=1500, end=1550),),
    )
    ack = codec.AckRanges(
        **common,
        topic="thumbs",
        ranges=(codec.AckEntry(partition=0, offset=1500, end=1550, failed=(1507,), dead=(1512, 1513), high=4210),),
    )
    cancel = codec.CancelRanges(**common, topic="thumbs", ranges=(codec.RangeEntry(partition=1, offset=9, end=10),))
    lines = [format_record(codec.encode(r), 3, 7, "g") for r in (claim, ack, cancel)]
    assert lines[0] == "3@7 2025-11-24T16:00:05.000Z claim_ranges host-a/5f1c thumbs lease=60000ms amo [0]1500..1549"
    assert lines[1].endswith("ack_ranges host-a/5f1c thumbs [0]1500..1549 failed=1507 dead=1512,1513 high=4210")
    assert lines[2].endswith("cancel_ranges host-a/5f1c thumbs [1]9..9")


# ------------------------------------------------- the Read / Ack / Cancel service's messages


def messages(*entries: tuple[int, int]) -> tuple[codec.MessageEntry, ...]:
    return tuple(codec.MessageEntry(partition=p, offset=offset) for p, offset in entries)


def deliver(holder: MemberId, ts: int, *entries: tuple[int, int], pending_ms: int = 100) -> codec.DeliverMessages:
    return codec.DeliverMessages(**common(holder, ts), topic="t", pending_ms=pending_ms, messages=messages(*entries))


def client_ack(server: MemberId, ts: int, *entries: tuple[int, int]) -> codec.AckMessages:
    return codec.AckMessages(**common(server, ts), topic="t", messages=messages(*entries))


def client_cancel(server: MemberId, ts: int, *entries: tuple[int, int]) -> codec.CancelMessages:
    return codec.CancelMessages(**common(server, ts), topic="t", messages=messages(*entries))


def test_hand_outs_client_acks_and_cancels_then_a_lapse_settle_the_acked_offset_and_retry_the_other() -> None:
    """A server (A) holds a lease and hands two offsets to clients; a client's ack and another's cancel reach the
    other server (B).  When the lease lapses, the acked offset is done and counted, the other has one try more."""
    state = WorldState(GROUP, HB)
    assert fold_wire(state, codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))))
    assert tuple(fold_wire(state, deliver(A, 10, (0, 3), (0, 4)))) == (True, True)  # type: ignore[arg-type]
    shared = state.shared_partition("t", 0)
    assert shared is not None
    held = shared.leases[0]
    assert held.handed == {3: (110, 1), 4: (110, 1)} and held.acked == set()
    assert tuple(fold_wire(state, client_ack(B, 20, (0, 3)))) == (True,)  # type: ignore[arg-type]  # B: not the holder
    assert held.acked == {3} and not shared.is_done(3) and shared.acked == 0  # done once the lease ends
    assert tuple(fold_wire(state, client_cancel(B, 30, (0, 4)))) == (True,)  # type: ignore[arg-type]
    assert held.handed[4] == (30, 1)  # no longer pending: the holder may hand it out at once
    # 4 goes out again (a second hand-out); 3, acked, never does.
    assert tuple(fold_wire(state, deliver(A, 30, (0, 4), (0, 3)))) == (True, False)  # type: ignore[arg-type]
    assert held.handed == {3: (110, 1), 4: (130, 2)}
    again = deliver(A, 30, (0, 3))
    verdict = fold_wire(state, again)
    assert refusals(state, again, 30, 0, verdict) == [  # type: ignore[arg-type]
        "refused [0]3: not in a live lease of its writer, or pending with a client"
    ]
    # The lease lapses: the next record about the partition, at its expiry, settles it.
    claim = codec.ClaimRanges(**common(B, LEASE), topic="t", lease_ms=LEASE, ranges=ranges((0, 3, 4), (0, 4, 5)))
    assert tuple(fold_wire(state, claim)) == (False, True)  # type: ignore[arg-type]  # 3 is done; 4 is claimable
    assert shared.lapsed == 1 and shared.acked == 1 and shared.lost == 0 and shared.is_done(3)
    assert shared.low == 0 and shared.done == [(3, 4)]
    # Every offset not acked has one try more, 4 too: handed out twice, tried once in that lease.
    assert shared.tries == [Tries(0, 3, 1), Tries(4, 10, 1)]
    assert list(shared.free_ranges(LEASE, 10, 10, 10)) == [(0, 3), (5, 10)]
    assert shared.leases[4].handed == {} and shared.leases[4].acked == set()  # a new lease starts with no messages


def test_an_ack_or_cancel_after_the_pending_deadline_is_refused_and_the_offset_may_go_out_again() -> None:
    shared = partition((0, 10, A))
    assert shared.deliver(5, A, 10, 100)  # pending until 110
    before = copy.deepcopy(shared)
    assert not shared.ack_offset(5, 110) and not shared.cancel_offset(5, 110)  # the deadline passed
    assert not shared.ack_offset(6, 20)  # never handed out
    assert shared == before
    assert shared.deliver(5, A, 110, 100)  # no longer pending: a second hand-out
    assert shared.leases[0].handed == {5: (210, 2)}
    assert shared.ack_offset(5, 209) and shared.leases[0].acked == {5}
    assert not shared.ack_offset(5, 209) and not shared.cancel_offset(5, 209)  # acked already
    assert not shared.deliver(5, A, 300, 100)  # acked: never handed out again
    assert shared.ack(0, 10, A, 400, (5,), ())  # done whatever the holder says, and counted once
    assert shared.acked == 10 and shared.tries == [] and shared.low == 10


def test_an_ack_after_the_lease_lapsed_is_refused_even_before_the_pending_deadline() -> None:
    shared = partition((0, 10, A))
    assert shared.deliver(5, A, 900, 500)  # pending until 1400, but the lease ends at 1000
    assert not shared.ack_offset(5, LEASE)
    assert not shared.leases and shared.acked == 0 and shared.tries == [Tries(0, 10, 1)]


@pytest.mark.parametrize(
    "attempt",
    [
        lambda s: s.deliver(5, B, 5, 100),  # not the holder
        lambda s: s.deliver(5, MemberId("host-a", "a2"), 5, 100),  # the holder's client, another instance
        lambda s: s.deliver(15, A, 5, 100),  # outside every lease
        lambda s: s.deliver(25, A, 5, 100),  # in B's lease
        lambda s: s.deliver(3, A, 5, 100),  # pending with a client already
        lambda s: s.ack_offset(15, 5),  # outside every lease
        lambda s: s.cancel_offset(5, 5),  # never handed out
    ],
    ids=["other-holder", "other-instance", "outside", "other-lease", "pending", "ack-outside", "cancel-not-handed"],
)
def test_a_hand_out_by_a_non_holder_or_of_an_offset_it_may_not_hand_out_changes_nothing(attempt) -> None:  # type: ignore[no-untyped-def]
    shared = partition((0, 10, A), (20, 30, B))
    assert shared.deliver(3, A, 1, 100)
    before = copy.deepcopy(shared)
    assert not attempt(shared)
    assert shared == before


def test_a_hand_out_in_a_lapsed_lease_is_refused() -> None:
    state = WorldState(GROUP, HB)
    assert fold_wire(state, codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))))
    assert tuple(fold_wire(state, deliver(A, LEASE, (0, 5), (1, 5)))) == (False, False)  # type: ignore[arg-type]
    shared = state.shared_partition("t", 0)
    assert shared is not None and not shared.leases and shared.lapsed == 1
    assert state.shared_partition("t", 1) is None  # a message record creates no shared partition


def test_an_ack_of_a_prefix_settles_what_clients_acked_whatever_failed_says() -> None:
    shared = partition((0, 10, A))
    for offset in (2, 3, 7):
        assert shared.deliver(offset, A, 1, 100)
    assert shared.ack_offset(2, 2) and shared.ack_offset(7, 2)
    assert shared.ack(0, 5, A, 3, (2, 3), ())  # 2 was acked by a client: done; 3 failed
    # Done and counted: 0, 1, 4 (handled), 2 and 7 (acked by clients, 7 past the prefix).  3: one try more.
    # 5, 6, 8, 9: back untried.
    assert shared.acked == 5 and shared.low == 3 and shared.done == [(4, 5), (7, 8)]
    assert shared.tries == [Tries(3, 4, 1)]
    assert list(shared.free_ranges(3, 10, 10, 10)) == [(3, 4), (5, 7), (8, 10)]


@pytest.mark.parametrize("amo", [False, True], ids=["alo", "amo"])
def test_a_cancel_settles_client_acks_and_counts_a_try_for_what_was_handed_out(amo: bool) -> None:
    shared = partition((0, 10, A), amo=amo)
    assert shared.deliver(2, A, 1, 100) and shared.deliver(3, A, 1, 100) and shared.cancel_offset(3, 1)
    assert shared.deliver(4, A, 1, 100) and shared.ack_offset(2, 2)
    assert shared.cancel(0, 10, A, 3)
    assert shared.acked == 1 and shared.is_done(2)
    if amo:  # handed out, not acked: lost, never delivered again
        assert shared.lost == 2 and shared.tries == [] and shared.done == [(2, 5)]
        assert list(shared.free_ranges(4, 10, 10, 10)) == [(0, 2), (5, 10)]
    else:  # handed out, not acked: one try more (3's cancelled hand-out counts too)
        assert shared.lost == 0 and shared.tries == [Tries(3, 5, 1)] and shared.done == [(2, 3)]
        assert list(shared.free_ranges(4, 10, 10, 10)) == [(0, 2), (3, 5), (5, 10)]


def test_a_lapsed_at_most_once_lease_counts_client_acks_as_acked_and_the_rest_as_lost() -> None:
    shared = partition((0, 10, A), amo=True)
    assert shared.deliver(4, A, 1, 100) and shared.ack_offset(4, 2)
    assert shared.claim(10, 20, B, LEASE, LEASE, True)  # lapses A's lease
    assert shared.acked == 1 and shared.lost == 9 and shared.low == 10 and shared.lapsed == 1


def test_a_checkpoint_keeps_hand_outs_and_client_acks_and_a_seeded_reader_settles_them_alike() -> None:
    state = WorldState(GROUP, HB)
    for record in (
        codec.ClaimRanges(**common(A, 0), topic="t", lease_ms=LEASE, ranges=ranges((0, 0, 10))),
        deliver(A, 10, (0, 3), (0, 4), (0, 5), pending_ms=500),
        client_ack(B, 20, (0, 3)),
        client_cancel(B, 30, (0, 4)),
        deliver(A, 30, (0, 4), pending_ms=500),
    ):
        assert all(fold_wire(state, record))  # type: ignore[call-overload]
    held = state.shared[("t", 0)].leases[0]
    assert held.handed == {3: (510, 1), 4: (530, 2), 5: (510, 1)} and held.acked == {3}
    for per_record in (1, 1000):
        parts = [wire(part) for part in checkpoints.state_records(state, 0, 42, WRITER | {"ts": 40}, per_record)]
        assert b'"handed":[[3,510,1],[4,530,2],[5,510,1]],"acked":[3]' in b"".join(codec.encode(p) for p in parts)
        seeded = WorldState(GROUP, HB)
        checkpoints.seed(seeded, parts, 0)  # type: ignore[arg-type]
        assert seeded.shared == state.shared
    # Both readers judge the next records alike: 5 is still pending, 3 acked; the cancel settles them.
    cancel = codec.CancelRanges(**common(A, 200), topic="t", ranges=ranges((0, 0, 10)))
    for record in (client_ack(B, 100, (0, 5), (0, 3)), cancel):
        assert tuple(fold_wire(seeded, record)) == tuple(fold_wire(state, record))  # type: ignore[arg-type]
    assert seeded.shared == state.shared
    shared = state.shared[("t", 0)]
    assert shared.acked == 2 and shared.done == [(3, 4), (5, 6)] and shared.tries == [Tries(4, 5, 1)]


def test_the_log_command_prints_message_records() -> None:
    from marshal_workers.ops.admin import format_record

    records = (deliver(A, 0, (0, 1500), (1, 9)), client_ack(B, 0, (0, 1500)))
    lines = [format_record(codec.encode(r), 3, 7, "g") for r in records]
    assert lines[0].endswith("deliver_messages host-a/a1 t pending=100ms [0]1500 [1]9")
    assert lines[1].endswith("ack_messages host-b/b1 t [0]1500")
