"""partition_end.py: a partition's end from what ListOffsets lists and what a fetch response carried."""

from __future__ import annotations

from marshal_workers.protocol.partition_end import partition_end


def test_on_kafka_the_listed_and_the_fetched_end_agree() -> None:
    assert partition_end(120, 120) == 120


def test_the_embedded_brokers_short_listed_end_is_made_good_by_a_fetch() -> None:
    # A last batch of 5 records at 115..119: the embedded broker lists 116 (its base offset plus one); a fetch says 120.
    assert partition_end(116, 120) == 120


def test_an_older_fetch_never_takes_the_end_back() -> None:
    assert partition_end(130, 120) == 130


def test_either_end_alone_is_the_end_and_neither_is_unknown() -> None:
    assert partition_end(-1, 120) == 120  # not listed (the broker did not answer)
    assert partition_end(116, -1) == 116  # no fetch came back yet
    assert partition_end(-1, -1) == -1
    assert partition_end(-1, -1001) == -1  # librdkafka's "no offset" is unknown too
