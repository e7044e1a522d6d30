"""The audit on a local Spark session, of a coordination log the test writes on the real broker.

The log's records carry their own times (``ts``; the test's coordination topic keeps the producer's
timestamps, so the fold uses ``ts``), which makes every gap exact.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from spark_support import T0, LogWriter, create_topic

from marshal_workers.core.config import Settings
from marshal_workers.errors import UnknownGroupError
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.protocol import codec
from marshal_workers.spark.audit import audit, document, plan_log, render

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.xdist_group("spark-audit")]  # a Spark session


def second_topic(first: str, partitions: int) -> str:
    """A topic whose records go to another coordination partition than ``first``'s."""
    home = codec.coordination_partition(first, partitions)
    return next(f"{first}-{n}" for n in range(100) if codec.coordination_partition(f"{first}-{n}", partitions) != home)


@pytest.fixture
def history(settings: Settings, unique: str) -> tuple[LogWriter, str, str]:
    """A clean release on one topic and a stale take-over on another, with a lost race, another group and garbage."""
    create_topic(settings.brokers, settings.coordination_topic, settings.coordination_partitions)
    write = LogWriter(settings)
    orders = f"orders-{unique}"
    refunds = second_topic(orders, settings.coordination_partitions)
    # orders[0]: a holds it, releases at 1500; b claims it 300 ms later.
    write(codec.Claim, "a", 0, orders)
    write(codec.Heartbeat, "a", 500, orders, offset=10)
    write(codec.Release, "a", 1500, orders, offset=30)
    write(codec.Claim, "b", 1800, orders)
    write(codec.Heartbeat, "b", 2300, orders, offset=31)
    # refunds[1]: c holds it, last heard at 500; d's claim at 1000 loses (c is fresh), at 3000 wins (c is stale).
    write(codec.Claim, "c", 0, refunds, partition=1)
    write(codec.Heartbeat, "c", 500, refunds, partition=1, offset=5)
    write(codec.Claim, "d", 1000, refunds, partition=1)
    write(codec.Claim, "d", 3000, refunds, partition=1)
    write(codec.Heartbeat, "d", 3400, refunds, partition=1, offset=6)
    write(codec.Claim, "x", 100, orders, group="another-group")
    write.write(b"not a record", 0, key=f"{settings.group}/{orders}/0".encode())
    return write, orders, refunds


def run_audit(spark, settings: Settings, out: Path | None = None, from_beginning: bool = False):
    partitions, splits, seeds = plan_log(settings, from_beginning)
    return audit(spark, settings, partitions, splits, out, seeds)


def test_the_audit_reports_hand_overs_with_their_gaps_and_no_zombie_in_a_clean_log(
    spark, settings: Settings, history, tmp_path: Path
) -> None:
    _, orders, refunds = history
    report = run_audit(spark, settings, tmp_path / "tables")

    assert document(report) == {
        "group": settings.group,
        "records": 10,
        "garbage": 1,
        "partitions": 2,
        "handoffs": {"count": 2, "p50_ms": 400.0, "max_ms": 500},
        "zombie_records": 0,
    }
    handoffs = spark.read.parquet(str(tmp_path / "tables" / "handoffs")).orderBy("gap_ms").collect()
    assert [(h.topic, h.kind, h.from_client, h.to_client, h.gap_ms, h.silence_ms) for h in handoffs] == [
        (orders, "release", "a", "b", 300, 300),  # from the release at 1500 to b's claim at 1800
        (refunds, "stale", "c", "d", 500, 2500),  # from c going stale (500 + 2 HB) to d's claim at 3000
    ]
    assert [h.resume_offset for h in handoffs] == [30, 5]
    timeline = [(t.topic, t.partition, t.client, t.start_ms - T0, t.end_reason) for t in report.timeline]
    assert timeline == [
        (orders, 0, "a", 0, "release"),
        (orders, 0, "b", 1800, None),
        (refunds, 1, "c", 0, "stale"),
        (refunds, 1, "d", 3000, None),
    ]
    clients = {c["client"]: c for c in report.clients}
    assert (clients["d"]["claims"], clients["d"]["claims_accepted"], clients["d"]["records"]) == (2, 1, 3)
    assert "x" not in clients, "another group's records are not the audit's"
    garbage = spark.read.parquet(str(tmp_path / "tables" / "garbage")).collect()
    assert [(g.key, g.log_partition) for g in garbage] == [(f"{settings.group}/{orders}/0", 0)]
    assert spark.read.parquet(str(tmp_path / "tables" / "records")).count() == 10
    assert spark.read.parquet(str(tmp_path / "tables" / "zombies")).count() == 0
    assert any("hand-overs: 2 (gap p50 400 ms, max 500 ms)" in line for line in render(report))


def test_the_audit_flags_a_zombie_heartbeat(spark, settings: Settings, history, tmp_path: Path) -> None:
    write, _, refunds = history
    write(codec.Heartbeat, "c", 3600, refunds, partition=1, offset=7)  # c missed the news: d owns it since 3000
    report = run_audit(spark, settings, tmp_path)

    assert report.zombie_records == 1 and report.handoffs == 2
    [zombie] = spark.read.parquet(str(tmp_path / "zombies")).collect()
    assert (zombie.client, zombie.type, zombie.offset, zombie.owner_client, zombie.owner_since_ms - T0) == (
        "c",
        "heartbeat",
        7,
        "d",
        3000,
    )
    clients = {c["client"]: c for c in report.clients}
    assert (clients["c"]["zombie_records"], clients["c"]["heartbeats"], clients["c"]["heartbeats_accepted"]) == (
        1,
        2,
        1,
    )


def test_a_group_without_records_is_unknown(spark, settings: Settings, history) -> None:
    with pytest.raises(UnknownGroupError, match="has no record"):
        run_audit(spark, replace(settings, group="nobody-here"))


def test_the_audit_starts_at_the_latest_checkpoints_and_knows_the_owners_they_hold(
    spark, settings: Settings, history, tmp_path: Path
) -> None:
    """Issue 11: like every reader, the audit reads what came after the latest checkpoints (seeded by them);
    --from-beginning reads all the log still kept."""
    write, _, refunds = history
    log = CoordinationLog(settings, settings.group, settings.coordination_partitions, from_beginning=True).start()
    try:
        log.wait_caught_up(stall_timeout=30)
        common = {"v": 1, "ts": T0 + 3500, "group": settings.group, "client": "e", "instance": "e-1"}
        for partition in range(settings.coordination_partitions):
            for record in log.checkpoint(partition, common):
                write.write(codec.encode(record), partition)
    finally:
        log.close()
    write(codec.Heartbeat, "c", 3600, refunds, partition=1, offset=7)  # c missed the news: d owns it since 3000

    report = run_audit(spark, settings, tmp_path)
    assert (report.records, report.handoffs, report.zombie_records) == (1, 0, 1)
    [zombie] = spark.read.parquet(str(tmp_path / "zombies")).collect()
    # The checkpoint says d owns it; since when, the audit knows only as "at least since the checkpoint".
    assert (zombie.client, zombie.owner_client, zombie.owner_since_ms - T0) == ("c", "d", 3500)

    everything = run_audit(spark, settings, from_beginning=True)
    assert (everything.records, everything.handoffs, everything.zombie_records) == (11, 2, 1)


def test_the_audit_summarises_the_range_leases_of_shared_partitions(
    spark, settings: Settings, history, tmp_path: Path
) -> None:
    write, orders, _ = history
    thumbs = f"thumbs-{orders}"
    home = codec.coordination_partition(thumbs, settings.coordination_partitions)

    def put(kind: type, client: str, at: int, **fields: object) -> None:
        record = kind(
            v=1, ts=T0 + at, group=settings.group, client=client, instance=f"{client}-1", topic=thumbs, **fields
        )
        write.write(codec.encode(record), home)

    def span(partition: int, offset: int, end: int) -> codec.RangeEntry:
        return codec.RangeEntry(partition=partition, offset=offset, end=end)

    put(codec.ClaimRanges, "a", 0, lease_ms=1000, ranges=(span(0, 0, 50), span(0, 50, 100)))
    put(codec.AckRanges, "a", 300, ranges=(codec.AckEntry(partition=0, offset=0, end=50, dead=(7,)),))
    # a dies holding 50..99: the lease lapses at 1000; b gets those offsets again at 2000 and acks them at 2500.
    put(codec.ClaimRanges, "b", 2000, lease_ms=1000, ranges=(span(0, 50, 100),))
    put(codec.AckRanges, "b", 2500, ranges=(codec.AckEntry(partition=0, offset=50, end=100),))
    put(codec.ClaimRanges, "b", 2600, lease_ms=1000, ranges=(span(0, 100, 150),))
    put(codec.CancelRanges, "b", 2700, ranges=(span(0, 100, 150),))

    report = run_audit(spark, settings, out=tmp_path / "tables")
    (shared,) = report.shared
    assert shared["topic"] == thumbs
    assert (shared["leases"], shared["acked"], shared["cancelled"], shared["lapsed"], shared["open"]) == (4, 2, 1, 1, 0)
    assert (shared["offsets_delivered_again"], shared["offsets_lost"], shared["dead_letters"]) == (50, 0, 1)
    assert shared["claim_to_ack_p50_ms"] in (300, 400, 500)
    assert any("shared partitions (range leases)" in line for line in render(report))
    assert document(report)["shared"][0]["lapsed"] == 1
    assert "leases" in report.tables
