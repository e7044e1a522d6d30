"""Every field a checkpoint carries survives it, and checkpoints written before still read the same
(marshal_workers.protocol.checkpoints; docs/protocol.md, "Checkpoints")."""

from __future__ import annotations

from checkpoint_fixture import AS_OF, ENCODED, GROUP, HB, PER_RECORD, WRITER, full_state

from marshal_workers.protocol import checkpoints, codec
from marshal_workers.protocol.world_state import WorldState


def carried(state: WorldState) -> dict[str, object]:
    """What a checkpoint of coordination partition 0 carries of ``state``."""
    return {
        "partitions": state.partitions,
        "shared": state.shared,
        "pauses": state.pauses,
        "controls": state.controls,
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


def test_a_checkpoint_written_by_release_0_7_0_reads_as_the_state_it_was_written_from() -> None:
    parts = [codec.decode(line) for line in ENCODED.read_bytes().splitlines()]
    assert carried(seeded(parts)) == carried(full_state())  # type: ignore[arg-type]


def test_the_state_is_written_as_release_0_7_0_wrote_it() -> None:
    written = checkpoints.state_records(full_state(), 0, AS_OF, WRITER, PER_RECORD)
    assert [codec.encode(part) for part in written] == ENCODED.read_bytes().splitlines()
