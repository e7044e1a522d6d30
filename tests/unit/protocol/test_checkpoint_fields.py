"""Every field a checkpoint carries survives it, and checkpoints written before still read the same
(marshal_workers.protocol.checkpoints; docs/protocol.md, "Checkpoints")."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from checkpoint_fixture import AS_OF, ENCODED, PER_RECORD, WRITER, full_state
from fold_values import GROUP, HB, world_states
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.checkpoints import NoCheckpointRule, by_name, check_carried
from marshal_workers.protocol.world_state import WorldState

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


def carried(state: WorldState) -> dict[str, object]:
    """What a checkpoint of coordination partition 0 carries of ``state``."""
    return {
        "partitions": state.partitions,
        "shared": state.shared,
        "pause": state.pauses.get(0),
        "controls": state.controls.get(0),
        "topic_pauses": state.topic_pauses,
        "directory": state.groups_before(0),
    }


def seeded(parts: list[codec.Checkpoint]) -> WorldState:
    """A reader's state started at ``parts``, assembled as a reader assembles them."""
    assembler = checkpoints.Assembler()
    for part in parts:
        assembler.add(part)
    assert assembler.latest is not None
    state = WorldState(GROUP, HB)
    checkpoints.seed(state, assembler.latest, 0)
    return state


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_states(), st.sampled_from([1, 2, 1000]))
def test_every_field_a_checkpoint_carries_survives_writing_and_reading_it(state: WorldState, per_record: int) -> None:
    written = checkpoints.state_records(state, 0, AS_OF, WRITER, per_record)
    read = [codec.decode(codec.encode(part)) for part in written]  # through the wire, as a reader gets them
    assert carried(seeded(read)) == carried(state)  # type: ignore[arg-type]


def test_a_checkpoint_written_before_reads_as_the_state_it_was_written_from() -> None:
    parts = [codec.decode(line) for line in ENCODED.read_bytes().splitlines()]
    assert carried(seeded(parts)) == carried(full_state())  # type: ignore[arg-type]


def test_the_state_is_written_byte_for_byte_as_before() -> None:
    written = checkpoints.state_records(full_state(), 0, AS_OF, WRITER, PER_RECORD)
    assert [codec.encode(part) for part in written] == ENCODED.read_bytes().splitlines()


def test_a_checkpoint_is_trusted_no_more_than_the_records_it_stands_for() -> None:
    # Reported numbers are checked as a heartbeat's are, and a request to hand over needs an owner to ask.
    position = codec.Position(
        topic="orders",
        partition=0,
        offset=5,
        lag=-1,
        rate="fast",
        in_flight=True,
        window_used=2**64,
        call_age_s=1.5,
        release_requested=True,
    )
    state = seeded([codec.Checkpoint(**WRITER, source=0, as_of=1, positions=(position,))])
    found = state.get("orders", 0)
    assert found is not None
    reported = (found.lag, found.rate, found.in_flight, found.window_used, found.call_age_s)
    assert reported == (None, None, None, None, 1.5)
    assert found.release_requested is False


@dataclass
class Kept:
    name: str
    size: int
    owner: tuple[str, str]


class Wire(msgspec.Struct):
    topic: str
    name: str
    size: int
    owner_client: str
    owner_instance: str


def test_fields_are_carried_by_name_but_those_with_a_rule_of_their_own() -> None:
    rules = {"kept_rules": ["owner"], "wire_rules": ["topic", "owner_client", "owner_instance"]}
    assert by_name(Kept, Wire, **rules) == ("name", "size")


def test_a_new_field_without_a_checkpoint_rule_is_named() -> None:
    @dataclass
    class Grown(Kept):
        colour: str = "blue"

    with pytest.raises(NoCheckpointRule, match=r"Grown\.colour has no checkpoint rule"):
        by_name(Grown, Wire, kept_rules=["owner"], wire_rules=["topic", "owner_client", "owner_instance"])

    class WideWire(Wire):
        colour: str = "blue"

    with pytest.raises(NoCheckpointRule, match=r"codec\.WideWire\.colour has no checkpoint rule"):
        by_name(Kept, WideWire, kept_rules=["owner"], wire_rules=["topic", "owner_client", "owner_instance"])
    with pytest.raises(NoCheckpointRule, match=r"a rule for Kept\.holder, which is not a field"):
        by_name(Kept, Wire, kept_rules=["owner", "holder"], wire_rules=["topic", "owner_client", "owner_instance"])


def test_a_new_field_of_the_state_is_carried_or_said_not_to_be() -> None:
    @dataclass
    class State:
        positions: dict[str, int]
        seen: int
        cache: dict[str, int] | None = field(default=None, compare=False)  # an index, as WorldState keeps

    check_carried(State, carried=["positions"], not_carried=["seen"])
    with pytest.raises(NoCheckpointRule, match=r"State\.seen has no checkpoint rule"):
        check_carried(State, carried=["positions"], not_carried=[])
