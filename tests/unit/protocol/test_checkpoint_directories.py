"""Checkpoint directories: a new group's reader starts at another group's checkpoint that does not
name it, and agrees with a reader that read everything."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples
from test_world_state_properties import GROUP, HB, logs
from test_world_state_properties import fold_all as fold

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.codec import MAX_DIRECTORY
from marshal_workers.protocol.world_state import WorldState

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
OTHER = "busy"
OTHER_WRITER = {"v": 1, "group": OTHER, "client": "h", "instance": "h1"}
WRITER = {"v": 1, "group": GROUP, "client": "w", "instance": "w1"}


def claim(group: str, ts: int = 1, topic: str = "orders", partition: int = 0) -> codec.Claim:
    return codec.Claim(v=1, ts=ts, group=group, client="c", instance="c1", topic=topic, partition=partition)


def from_the_beginning(group: str) -> WorldState:
    """A reader's state before it reads a partition from its start (it knows every group it will see there)."""
    state = WorldState(group, HB)
    checkpoints.begin(state, checkpoints.BEGINNING, 0)
    return state


def wire(parts: list[codec.Checkpoint]) -> list[codec.Checkpoint]:
    """The parts as a reader gets them."""
    return [codec.decode(codec.encode(part)) for part in parts]  # type: ignore[misc]


def start_for(group: str, *checkpoints_read: list[codec.Checkpoint]) -> checkpoints.Start:
    """Where a reader of ``group`` starts after scanning these checkpoints (its own, and other groups')."""
    own, finder = checkpoints.Assembler(), checkpoints.DirectoryFinder(group)
    for parts in checkpoints_read:
        for part in wire(parts):
            (own if part.group == group else finder).add(part)
    return checkpoints.choose_start(own.latest, finder.latest)


def agree(a: WorldState, b: WorldState) -> None:
    assert a.partitions == b.partitions and a.pauses == b.pauses and a.shared == b.shared
    assert a.controls == b.controls and a.topic_pauses == b.topic_pauses
    assert a.checkpoints == b.checkpoints


# ---------------------------------------------------------------- the property


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), logs(max_size=60), st.data())
def test_a_new_groups_reader_starting_at_another_groups_directory_agrees_with_one_that_read_everything(
    ours: list[codec.Record], theirs: list[codec.Record], data: st.DataObject
) -> None:
    theirs = [msgspec.structs.replace(record, group=OTHER) for record in theirs]
    # Some of their records come first; then both groups write, interleaved as a broker may order them.
    lead = data.draw(st.integers(0, len(theirs)))
    rest_ours, rest_theirs, log = list(ours), theirs[lead:], theirs[:lead]
    while rest_ours or rest_theirs:
        take_ours = rest_theirs == [] or (rest_ours != [] and data.draw(st.booleans()))
        log.append((rest_ours if take_ours else rest_theirs).pop(0))
    # A member of the other group read the partition from its start and wrote its checkpoint of log[:as_of]; it
    # landed at `at`.
    at = data.draw(st.integers(0, len(log)))
    as_of = data.draw(st.integers(0, at))
    per_record = data.draw(st.sampled_from([1, 2, 1000]))
    ts = log[at - 1].ts if at else 0
    written = checkpoints.state_records(
        fold(log[:as_of], from_the_beginning(OTHER)), 0, as_of, OTHER_WRITER | {"ts": ts}, per_record
    )
    log = log[:at] + list(written) + log[at:]
    assert checkpoints.directory_of(written) == {record.group for record in log[:as_of]}

    start = start_for(GROUP, written)
    ours_before = any(record.group == GROUP for record in log[:as_of])
    assert start.kind == ("beginning" if ours_before else "directory")
    if start.kind == "beginning":
        return  # the directory names us: read as before
    assert start.offset == as_of
    started = WorldState(GROUP, HB)
    checkpoints.begin(started, start, 0)
    everything = fold(log)
    agree(fold(log[as_of:], started), everything)
    assert started.stats.applied == everything.stats.applied  # nothing of ours came before as_of
    # And it carries the directory on: its own checkpoints list every group of the whole log (induction).
    assert started.groups_before(0) == {record.group for record in log}


# -------------------------------------------------------- built and carried on


def test_a_reader_from_the_beginning_lists_every_group_before_its_checkpoint_its_own_and_others() -> None:
    state = fold([claim("a"), claim(GROUP), claim("b"), claim("a", ts=2)], from_the_beginning(GROUP))
    [part] = checkpoints.state_records(state, 0, 4, WRITER | {"ts": 3})
    assert part.directory == ("a", "b", GROUP)  # sorted
    assert checkpoints.directory_of(wire([part])) == {"a", "b", GROUP}


def test_a_reader_started_at_a_checkpoint_with_a_directory_carries_it_on_with_what_it_read_since() -> None:
    first = checkpoints.state_records(
        fold([claim("a"), claim(GROUP)], from_the_beginning(GROUP)), 0, 2, WRITER | {"ts": 2}
    )
    later = WorldState(GROUP, HB)
    checkpoints.seed(later, wire(first), 0)
    fold([claim("c"), claim(GROUP, ts=3)], later)
    [part] = checkpoints.state_records(later, 0, 4, WRITER | {"ts": 4})
    assert checkpoints.directory_of([part]) == {"a", "c", GROUP}


def test_a_reader_started_at_a_checkpoint_without_a_directory_writes_none_until_it_learns_the_groups_before() -> None:
    old = checkpoints.state_records(fold([claim("a"), claim(GROUP)]), 0, 2, WRITER | {"ts": 2})  # a 0.6.0 reader
    assert all(part.directory is None for part in old)
    assert b"directory" not in codec.encode(old[0])  # what a 0.6.0 writer wrote
    reader = WorldState(GROUP, HB)
    checkpoints.seed(reader, wire(old), 0)
    fold([claim("c")], reader)
    assert all(part.directory is None for part in checkpoints.state_records(reader, 0, 3, WRITER | {"ts": 3}))
    reader.learn_groups_before(0, {"a", GROUP})  # CoordinationLog.learn_directories read [0, 2) meanwhile
    assert checkpoints.directory_of(checkpoints.state_records(reader, 0, 3, WRITER | {"ts": 3})) == {"a", "c", GROUP}


def test_a_value_that_is_not_a_valid_record_still_counts_for_its_group() -> None:
    state = from_the_beginning(GROUP)
    newer = b'{"v":1,"type":"a_record_of_release_9","ts":1,"group":"future","client":"x","instance":"x1"}'
    for value in (newer, b"not json", b"[1, 2]", b'{"group": ""}'):
        with pytest.raises(DecodeError):
            state.apply_value(value, 0)
    assert state.groups_before(0) == {"future"}
    assert state.stats.garbage == 4


def test_a_large_directory_spreads_over_the_parts_and_parts_of_its_own() -> None:
    names = [f"group-{n:05d}-" + "x" * 200 for n in range(1000)]  # some 210 KB of names
    state = fold(
        [claim(name) for name in names] + [claim(GROUP, topic="t", partition=p) for p in range(3)],
        from_the_beginning(GROUP),
    )
    parts = checkpoints.state_records(state, 0, len(names) + 3, WRITER | {"ts": 9}, per_record=2)
    assert len(parts) == 4  # 2 parts of positions, 2 more for the rest of the directory
    assert all(len(codec.encode(part)) < checkpoints.DIRECTORY_BYTES_PER_RECORD + 2_000 for part in parts)
    assert [len(p.positions) for p in parts] == [2, 1, 0, 0]
    assert checkpoints.directory_of(wire(parts)) == {*names, GROUP}
    assembler = checkpoints.Assembler()
    for part in wire(parts):
        assembler.add(part)
    assert assembler.latest is not None
    seeded = WorldState(GROUP, HB)
    checkpoints.seed(seeded, assembler.latest, 0)
    assert seeded.groups_before(0) == {*names, GROUP} and seeded.partitions == state.partitions


def test_past_the_bound_a_reader_forgets_the_directory_and_writes_none() -> None:
    state = fold([claim(f"g{n}") for n in range(MAX_DIRECTORY)], from_the_beginning(GROUP))
    assert state.groups_before(0) is not None and len(state.groups_before(0) or ()) == MAX_DIRECTORY
    fold([claim("one-too-many")], state)
    assert state.groups_before(0) is None
    assert all(part.directory is None for part in checkpoints.state_records(state, 0, 1, WRITER | {"ts": 1}))
    state.learn_groups_before(0, ())  # what it learns later cannot make it whole again
    assert state.groups_before(0) is None


# ----------------------------------------------------------- choosing a start


def other_checkpoint(as_of: int, groups: tuple[str, ...], group: str = OTHER) -> list[codec.Checkpoint]:
    return [codec.Checkpoint(**OTHER_WRITER | {"group": group}, ts=1, source=0, as_of=as_of, directory=groups)]


def own_checkpoint(as_of: int) -> list[codec.Checkpoint]:
    position = codec.Position(topic="t", partition=0)
    return [codec.Checkpoint(**WRITER, ts=1, source=0, as_of=as_of, positions=(position,))]


def test_a_new_group_starts_at_the_latest_other_checkpoint_that_does_not_name_it() -> None:
    start = start_for(GROUP, other_checkpoint(10, ("a",)), other_checkpoint(50, ("a", "b"), group="b"))
    assert (start.kind, start.offset, start.directory) == ("directory", 50, frozenset({"a", "b"}))
    state = WorldState(GROUP, HB)
    checkpoints.begin(state, start, 0)
    assert state.partitions == {} and not state.has_records() and state.groups_before(0) == {"a", "b"}


def test_a_directory_that_names_the_group_is_no_start_for_it() -> None:
    assert start_for(GROUP, other_checkpoint(90, ("a", GROUP))) == checkpoints.BEGINNING
    start = start_for(GROUP, other_checkpoint(10, ("a",)), other_checkpoint(90, ("a", GROUP)))
    assert start.offset == 10  # the earlier one does not name it: sound, if longer to read


def test_the_later_of_the_groups_own_checkpoint_and_another_directory_wins() -> None:
    assert start_for(GROUP, own_checkpoint(40), other_checkpoint(30, ("a",))).kind == "checkpoint"
    assert start_for(GROUP, own_checkpoint(40), other_checkpoint(40, ("a",))).kind == "checkpoint"
    start = start_for(GROUP, own_checkpoint(40), other_checkpoint(60, ("a",)))
    assert (start.kind, start.offset) == ("directory", 60)


def test_only_a_complete_directory_counts() -> None:
    halves = [
        codec.Checkpoint(**OTHER_WRITER, ts=1, source=0, as_of=70, part=i, parts=2, directory=(name,))
        for i, name in enumerate(["a", "b"])
    ]
    assert start_for(GROUP, halves[:1]) == checkpoints.BEGINNING
    assert start_for(GROUP, halves).directory == {"a", "b"}
    without = [halves[0], msgspec.structs.replace(halves[1], directory=None)]  # one part lacks its share
    assert start_for(GROUP, without) == checkpoints.BEGINNING
    disagree = [halves[0], msgspec.structs.replace(halves[1], parts=3)]
    assert start_for(GROUP, disagree) == checkpoints.BEGINNING


GARBAGE_DIRECTORIES = [
    '"a"',  # not an array
    '{"a": 1}',
    '["a", 1]',  # not names
    '["a", null]',
    '[""]',
    '["' + "x" * 1025 + '"]',
    '[["a"]]',
    "[" + ",".join(f'"g{n}"' for n in range(MAX_DIRECTORY + 1)) + "]",  # past the bound
]


@pytest.mark.parametrize("directory", GARBAGE_DIRECTORIES, ids=range(len(GARBAGE_DIRECTORIES)))
def test_a_malformed_directory_is_ignored_and_leaves_the_checkpoint_valid(directory: str) -> None:
    for group in (OTHER, GROUP):
        value = (
            f'{{"v":1,"type":"checkpoint","ts":1,"group":"{group}","client":"h","instance":"h1","source":0,'
            f'"as_of":5,"positions":[{{"topic":"t","partition":0,"offset":3}}],"directory":{directory}}}'
        )
        record = codec.decode(value.encode())
        assert isinstance(record, codec.Checkpoint)
        assert checkpoints.directory_of([record]) is None
        finder = checkpoints.DirectoryFinder(GROUP)
        finder.add(record)
        assert finder.latest is None  # another group's: no start
        state = WorldState(GROUP, HB)
        checkpoints.seed(state, [record], 0)  # our own: seeded as before, without a directory
        assert state.get("t", 0).offset == 3 and state.groups_before(0) is None  # type: ignore[union-attr]


def test_the_directory_field_does_not_change_what_an_older_checkpoint_means() -> None:
    example = (
        b'{"v":1,"type":"checkpoint","ts":1,"group":"g","client":"h","instance":"h1","source":0,"as_of":5,'
        b'"future_field":[1]}'
    )
    record = codec.decode(example)
    assert isinstance(record, codec.Checkpoint) and record.directory is None
