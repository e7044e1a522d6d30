"""docs/protocol.md stays true: every record type and field of the codec is there, and its examples decode."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from marshal_workers import codec

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
TAGS = {cls.__struct_config__.tag: cls for cls in codec.RECORD_TYPES}


def section(tag: str) -> str:
    match = re.search(rf"^## {re.escape(tag)}\n(.*?)(?=^## |\Z)", PAGE, re.DOTALL | re.MULTILINE)
    assert match, f"docs/protocol.md has no section '## {tag}'"
    return match.group(1)


@pytest.mark.parametrize("tag", sorted(TAGS))
def test_every_record_type_has_a_section_naming_its_fields_and_its_release(tag: str) -> None:
    text = section(tag)
    assert re.search(r"Since 0\.\d+\.\d+", text), f"{tag}: which release introduced it?"
    for field in msgspec.structs.fields(TAGS[tag]):
        if field.name not in {"v", "ts", "group", "client", "instance"}:  # the common fields, described once
            assert f"`{field.name}`" in text, f"{tag}: field {field.name} is not described"


@pytest.mark.parametrize("tag", sorted(TAGS))
def test_the_example_of_each_record_type_decodes_to_it(tag: str) -> None:
    examples = re.findall(r"```json\n(.*?)\n```", section(tag), re.DOTALL)
    assert examples, f"{tag}: no example"
    for example in examples:
        assert type(codec.decode(example.encode())) is TAGS[tag]


def test_the_nested_fields_are_described_too() -> None:
    for cls, where in ((codec.Beat, "heartbeats"), (codec.Position, "checkpoint"), (codec.PausePosition, "checkpoint")):
        for field in msgspec.structs.fields(cls):
            assert f"`{field.name}`" in section(where), f"{cls.__name__}.{field.name} is not described"
