"""How a member splits one write's entries into records: the rule the supervisor's coordinator and the simulated
members share, so both write records of the same size."""

from __future__ import annotations

from marshal_workers.member.record_chunks import MAX_RECORD_BYTES, beat_chunks, entry_verdicts, heartbeat_records
from marshal_workers.protocol import codec

COMMON = {"v": codec.VERSION, "ts": 1, "group": "g", "client": "c", "instance": "i"}


def test_heartbeats_are_split_by_size_before_the_count_limit() -> None:
    chunks = beat_chunks(["t"] * 5000, [0] * 5000)
    assert len(chunks) == 2, "a record of 5,000 beats would pass 256 KB long before 4,096 beats"
    assert len(chunks[0]) * 100 <= MAX_RECORD_BYTES < (len(chunks[0]) + 1) * 100
    assert [i for chunk in chunks for i in chunk] == list(range(5000))


def test_done_sets_make_a_beat_larger_so_fewer_fit_in_a_record() -> None:
    plain, large = beat_chunks(["t"] * 3000, [0] * 3000), beat_chunks(["t"] * 3000, [50] * 3000)
    assert len(large) > len(plain) and max(map(len, large)) < max(map(len, plain))


def test_each_topic_gets_its_own_records_and_verdicts_map_back_to_the_beats() -> None:
    topics = ["a", "b", "a", "b", "a"]
    beats = [codec.Beat(partition=i, offset=10 * i) for i in range(5)]
    chunks = beat_chunks(topics, [0] * 5)
    records = heartbeat_records(COMMON, topics, beats, chunks)
    assert [(r.topic, [b.partition for b in r.beats]) for r in records] == [("a", [0, 2, 4]), ("b", [1, 3])]  # type: ignore[attr-defined]
    assert entry_verdicts(chunks, [True, False], 5) == [True, False, True, False, True]
