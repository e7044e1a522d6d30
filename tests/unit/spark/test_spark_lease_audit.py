"""The audit of range leases (marshal_workers.spark.lease_audit), fed through the ownership audit: no Spark."""

from __future__ import annotations

from marshal_workers.protocol import codec
from marshal_workers.spark.lease_audit import RangeLease
from marshal_workers.spark.ownership import OwnershipAudit

GROUP, HB, T0 = "media", 1000, 1_764_000_000_000


def rec(kind: type, client: str, at: int, topic: str = "thumbs", **fields: object) -> codec.Record:
    common = {"v": 1, "ts": at, "group": GROUP, "client": client, "instance": client + "-1"}
    return kind(**common, topic=topic, **fields)  # type: ignore[no-any-return]


def entry(partition: int, offset: int, end: int, kind: type = codec.RangeEntry, **more: object) -> codec.RangeEntry:
    return kind(partition=partition, offset=offset, end=end, **more)  # type: ignore[no-any-return]


def audit(*records: tuple[codec.Record, int]) -> list[RangeLease]:
    found: list[RangeLease] = []
    audit = OwnershipAudit(GROUP, HB, None, 0)
    for offset, (record, at) in enumerate(records):
        found += [e for e in audit.feed(record, at, offset) if isinstance(e, RangeLease)]
    return found + [e for e in audit.finish() if isinstance(e, RangeLease)]


def test_every_lease_is_audited_with_how_it_ended() -> None:
    log = [
        (rec(codec.ClaimRanges, "a", T0, lease_ms=5000, ranges=(entry(0, 0, 10), entry(0, 10, 20))), T0),
        (rec(codec.ClaimRanges, "b", T0 + 10, lease_ms=5000, ranges=(entry(0, 20, 30), entry(1, 0, 10))), T0 + 10),
        (
            rec(codec.AckRanges, "a", T0 + 400, ranges=(entry(0, 0, 10, codec.AckEntry, failed=(3,), dead=(5,)),)),
            T0 + 400,
        ),
        (rec(codec.CancelRanges, "b", T0 + 500, ranges=(entry(1, 0, 10),)), T0 + 500),
        (rec(codec.AckRanges, "b", T0 + 600, ranges=(entry(0, 10, 20, codec.AckEntry),)), T0 + 600),  # not b's: refused
        (rec(codec.RenewRanges, "a", T0 + 3000, lease_ms=5000, ranges=(entry(0, 10, 20),)), T0 + 3000),
        # b went silent: its lease on 20..29 lapses at T0 + 5010, noticed at the next record about partition 0
        (rec(codec.ClaimRanges, "a", T0 + 9000, lease_ms=5000, ranges=(entry(0, 20, 30), entry(0, 3, 4))), T0 + 9000),
        (rec(codec.AckRanges, "a", T0 + 9100, ranges=(entry(0, 20, 25, codec.AckEntry),)), T0 + 9100),  # a prefix
    ]
    found = {(lease.partition, lease.start, lease.claimed_ms): lease for lease in audit(*log)}
    first = found[(0, 0, T0)]
    assert (first.outcome, first.failed, first.dead, first.claim_to_end_ms, first.deliveries) == ("acked", 1, 1, 400, 1)
    assert found[(1, 0, T0 + 10)].outcome == "cancelled"
    lapsed = found[(0, 20, T0 + 10)]
    assert (lapsed.outcome, lapsed.client, lapsed.ended_ms) == ("lapsed", "b", T0 + 5010)
    again = found[(0, 20, T0 + 9000)]
    assert (again.outcome, again.deliveries, again.acked_end) == ("acked", 2, 25), "handed out a second time"
    assert found[(0, 3, T0 + 9000)].deliveries == 2, "the failed offset's second delivery"
    renewed = found[(0, 10, T0)]
    assert (renewed.outcome, renewed.ended_ms) == ("lapsed", T0 + 8000), "renewed once, then left to lapse"
    assert found[(0, 3, T0 + 9000)].outcome == "open" and found[(0, 3, T0 + 9000)].log_offset == 6


def test_an_at_most_once_lease_that_lapses_is_audited_as_such() -> None:
    log = [
        (rec(codec.ClaimRanges, "a", T0, lease_ms=1000, amo=True, ranges=(entry(0, 0, 50),)), T0),
        (
            rec(codec.ClaimRanges, "b", T0 + 2000, lease_ms=1000, amo=True, ranges=(entry(0, 0, 50), entry(0, 50, 60))),
            T0 + 2000,
        ),
    ]
    leases = audit(*log)
    assert [(lease.outcome, lease.amo, lease.start) for lease in leases] == [("lapsed", 1, 0), ("open", 1, 50)]
