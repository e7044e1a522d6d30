"""Checkpoints (marshal_workers.protocol.checkpoints): a reader that starts at one agrees with a reader that read it all."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples
from test_world_state_properties import GROUP, HB, logs
from test_world_state_properties import fold_all as fold

from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.checkpoints import CHECKPOINT_RECORDS
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
WRITER = {"v": 1, "group": GROUP, "client": "w", "instance": "w1"}


def agree(a: WorldState, b: WorldState) -> None:
    assert a.partitions == b.partitions
    assert a.pauses == b.pauses
    assert a.controls == b.controls and a.topic_pauses == b.topic_pauses
    assert a.checkpoints == b.checkpoints and a.checkpoint_offsets == b.checkpoint_offsets


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.data())
def test_a_reader_seeded_from_a_checkpoint_agrees_with_one_that_read_everything(
    records: list[codec.Record], data: st.DataObject
) -> None:
    # A member folded records[:as_of], then wrote its checkpoint, which landed at position `at` (later
    # records may have landed between its fold and its write).
    at = data.draw(st.integers(0, len(records)))
    as_of = data.draw(st.integers(0, at))
    per_record = data.draw(st.sampled_from([1, 2, 1000]))
    ts = records[at - 1].ts if at else 0
    written = checkpoints.state_records(fold(records[:as_of]), 0, as_of, WRITER | {"ts": ts}, per_record)
    log = records[:at] + list(written) + records[at:]
    everything = fold(log)
    # Reading from the checkpoint: seed, then fold from as_of (the checkpoint's parts come along at `at`).
    assembler = checkpoints.Assembler()
    for part in written:
        assembler.add(codec.decode(codec.encode(part)))  # through the wire, as a reader gets them
    assert assembler.latest is not None
    started = WorldState(GROUP, HB)
    checkpoints.seed(started, assembler.latest, 0)
    agree(fold(log[as_of:], started), everything)


def test_a_checkpoint_in_parts_is_used_only_when_every_part_is_there() -> None:
    state = fold([codec.Claim(**WRITER, ts=1, topic="orders", partition=p) for p in range(5)])
    parts = checkpoints.state_records(state, 0, 5, WRITER | {"ts": 2}, per_record=2)
    assert [(p.part, p.parts, len(p.positions)) for p in parts] == [(0, 3, 2), (1, 3, 2), (2, 3, 1)]
    assembler = checkpoints.Assembler()
    assembler.add(parts[2])
    assembler.add(parts[0])
    assert assembler.latest is None
    assembler.add(parts[1])
    assert assembler.latest == parts


def test_a_checkpoint_carries_positions_owners_done_sets_and_the_pause() -> None:
    records: list[codec.Record] = [
        codec.Claim(**WRITER, ts=1, topic="orders", partition=0),
        codec.Heartbeat(**WRITER, ts=2, topic="orders", partition=0, offset=40, done=[2, 1, 3], lag=7),
        codec.Claim(**WRITER, ts=3, topic="orders", partition=1),
        codec.ClaimMessages(**WRITER, ts=4, topic="orders", partition=1, offset=99),
        codec.Release(**WRITER, ts=5, topic="orders", partition=1, offset=12),
        codec.ReleaseGroup(**WRITER | {"client": "op"}, ts=6, expires=10_000),
    ]
    state = fold(records)
    [part] = checkpoints.state_records(state, 0, len(records), WRITER | {"ts": 7})
    seeded = WorldState(GROUP, HB)
    checkpoints.seed(seeded, [codec.decode(codec.encode(part))], 0)
    assert seeded.partitions == state.partitions and seeded.pauses == state.pauses
    assert seeded.get("orders", 1).resume_offset == 99  # type: ignore[union-attr]
    assert seeded.get("orders", 0).skip_ranges() == [(41, 43), (44, 47)]  # type: ignore[union-attr]


def test_positions_of_topics_routed_elsewhere_are_ignored() -> None:
    state = WorldState(GROUP, HB, coordination_partitions=8)
    home = codec.coordination_partition("orders", 8)
    position = codec.Position(topic="orders", partition=0, offset=5)
    stray = codec.Checkpoint(**WRITER, ts=1, source=(home + 1) % 8, as_of=0, positions=(position,))
    checkpoints.seed(state, [stray], (home + 1) % 8)
    assert state.partitions == {}
    checkpoints.seed(state, [codec.Checkpoint(**WRITER, ts=1, source=home, as_of=0, positions=(position,))], home)
    assert state.get("orders", 0).offset == 5  # type: ignore[union-attr]


def test_the_live_member_with_the_lowest_instance_writes_and_anyone_once_it_is_late() -> None:
    state = fold(
        [
            codec.Claim(**WRITER | {"instance": i, "client": i}, ts=0, topic="t", partition=n)
            for n, i in enumerate(["b", "a", "c"])
        ]
    )
    interval = 10 * HB
    assert checkpoints.due(state, 0, 1, interval, MemberId("b", "b"))  # none yet: anyone
    state.apply(codec.Checkpoint(**WRITER, ts=100, source=0, as_of=3), 100)
    assert not checkpoints.due(state, 0, 100 + interval - 1, interval, MemberId("a", "a"))  # not due yet
    now = 100 + interval
    for n, i in enumerate(["b", "a", "c"]):  # all three alive
        state.apply(
            codec.Heartbeat(**WRITER | {"instance": i, "client": i}, ts=now - 500, topic="t", partition=n, offset=0),
            now - 500,
        )
    assert checkpoints.due(state, 0, now, interval, MemberId("a", "a"))
    assert not checkpoints.due(state, 0, now, interval, MemberId("b", "b"))
    assert checkpoints.due(state, 0, 100 + 2 * interval, interval, MemberId("b", "b"))  # a is late: b writes


def test_a_checkpoint_is_due_once_a_thousand_records_came_after_the_last_however_young() -> None:
    """A restart reads the records after the latest checkpoint: on a busy log, a minute of them was thousands."""
    state = fold([codec.Claim(**WRITER | {"instance": i, "client": i}, ts=0, topic="t", partition=0) for i in "ab"])
    interval = 60_000
    state.apply(codec.Checkpoint(**WRITER, ts=100, source=0, as_of=5_000), 100)
    now = 200  # far younger than the interval
    first, writer, other = 5_001 + CHECKPOINT_RECORDS, MemberId("a", "a"), MemberId("b", "b")
    assert not checkpoints.due(state, 0, now, interval, writer, read_to=first - 1)
    assert checkpoints.due(state, 0, now, interval, writer, read_to=first), "the lowest live instance writes"
    assert not checkpoints.due(state, 0, now, interval, other, read_to=first)
    assert checkpoints.due(state, 0, now, interval, other, read_to=5_001 + 2 * CHECKPOINT_RECORDS), "a is late"
    # A checkpoint of 400 parts: the next waits for 4,000 records after them, so checkpoints stay a tenth of the log.
    state.apply(codec.Checkpoint(**WRITER, ts=300, source=0, as_of=9_000, part=0, parts=400), 300)
    assert not checkpoints.due(state, 0, 400, interval, writer, read_to=9_400 + 3_999)
    assert checkpoints.due(state, 0, 400, interval, writer, read_to=9_400 + 4_000)
    # An older checkpoint read later (another member's, written before) does not move the place back.
    state.apply(codec.Checkpoint(**WRITER, ts=500, source=0, as_of=8_000), 500)
    assert checkpoints.records_since_checkpoint(state, 0, 9_400 + 10) == 10


@given(st.integers(min_value=0, max_value=10**7), st.integers(min_value=1, max_value=10_000), st.integers(0, 10**5))
def test_by_its_records_a_checkpoint_is_never_due_before_a_tenth_of_the_log_or_a_thousand_records(
    as_of: int, parts: int, after: int
) -> None:
    state = fold([codec.Claim(**WRITER, ts=0, topic="t", partition=0)])
    state.apply(codec.Checkpoint(**WRITER, ts=100, source=0, as_of=as_of, part=0, parts=parts), 100)
    writer = MemberId(WRITER["client"], WRITER["instance"])
    is_due = checkpoints.due(state, 0, 200, 60_000, writer, read_to=as_of + parts + after)
    assert is_due == (after >= max(CHECKPOINT_RECORDS, 10 * parts))
