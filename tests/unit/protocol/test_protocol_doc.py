"""docs/protocol.md stays true to the code.

Every record type the codec decodes has a section (``## <type tag>``) that names each of its
fields in a table with the right JSON type and required/optional, states the release that
introduced it, and gives examples (```json blocks) that decode to it.  Everything is derived
from the codec's msgspec structs, so a new record type or field fails here until it is
documented.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import msgspec
import pytest

from marshal_workers.protocol import codec, done_set
from marshal_workers.protocol.world_view import Liveness, PartitionState

PAGE = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()

# What codec.decode accepts: the members of the Record union, by their tag (the ``type`` field).
RECORDS: dict[str, type[msgspec.Struct]] = {cls.__struct_config__.tag: cls for cls in typing.get_args(codec.Record)}
TAG_FIELD = {cls.__struct_config__.tag_field for cls in RECORDS.values()}.pop()
# The fields every record has, described once in the page's introduction.
COMMON = set.intersection(*({f.name for f in msgspec.structs.fields(cls)} for cls in RECORDS.values()))
EXTRAS = ("lag", "rate", "in_flight", "window_used", "call_age_s")
RELEASE = re.compile(r"Introduced in release (\d+\.\d+\.\d+)")


def split_sections() -> list[tuple[str, str]]:
    """(heading, body) of every ``## `` section; the text before the first is the introduction ''."""
    parts = re.split(r"^## (.+)\n", PAGE, flags=re.MULTILINE)
    return [("", parts[0]), *zip(parts[1::2], parts[2::2])]


SECTIONS = dict(split_sections())


def section(heading: str) -> str:
    assert heading in SECTIONS, f"docs/protocol.md has no section '## {heading}'"
    return SECTIONS[heading]


def tables(text: str) -> list[dict[str, tuple[str, str, int]]]:
    """The tables in ``text``: field name -> (JSON type cell, required cell, names in the row)."""
    found: list[dict[str, tuple[str, str, int]]] = []
    current: dict[str, tuple[str, str, int]] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        if current is None:
            current = {}
            found.append(current)
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        for name in names:
            current[name] = (cells[1] if len(cells) > 1 else "", cells[2] if len(cells) > 2 else "", len(names))
    return found


def json_type(t: msgspec.inspect.Type) -> str | None:
    """The JSON type the doc must state for a field of this msgspec type; None if any value goes."""
    inspect = msgspec.inspect
    if isinstance(t, inspect.UnionType):
        kinds = {json_type(member) for member in t.types if not isinstance(member, inspect.NoneType)}
        return kinds.pop() if len(kinds) == 1 else None
    if isinstance(t, inspect.IntType) or (
        isinstance(t, inspect.LiteralType) and all(isinstance(v, int) for v in t.values)
    ):
        return "integer"
    if isinstance(t, inspect.StrType):
        return "string"
    if isinstance(t, inspect.StructType):
        return "object"
    if isinstance(t, (inspect.ListType, inspect.VarTupleType, inspect.TupleType)):
        return "array"
    return None


def nested_structs(t: msgspec.inspect.Type) -> list[type[msgspec.Struct]]:
    """The Struct classes inside a field's type (entries of ``beats``, ``positions``, the ``pause``)."""
    inspect = msgspec.inspect
    if isinstance(t, inspect.StructType):
        return [t.cls]
    inner = [*getattr(t, "types", ()), *getattr(t, "item_types", ())]
    inner += [getattr(t, name) for name in ("item_type", "key_type", "value_type") if hasattr(t, name)]
    return [cls for member in inner for cls in nested_structs(member)]


def assert_table_matches(cls: type[msgspec.Struct], table: dict[str, tuple[str, str, int]], where: str) -> None:
    for field in msgspec.inspect.type_info(cls).fields:
        assert field.name in table, f"{where}: field `{field.name}` has no row"
        kind, required, _ = table[field.name]
        assert required == ("required" if field.required else "optional"), f"{where}: `{field.name}` is {required!r}"
        expected = json_type(field.type)
        if expected is not None and not kind.startswith(("see above", "as in")):
            assert kind.startswith(expected), f"{where}: `{field.name}` is a JSON {expected}, the doc says {kind!r}"


def examples() -> list[tuple[str, str]]:
    """(section heading, text) of every ```json block of the page."""
    return [
        (heading, block)
        for heading, body in split_sections()
        for block in re.findall(r"^```json\n(.*?)\n```", body, re.DOTALL | re.MULTILINE)
    ]


def test_the_record_types_are_every_tagged_struct_of_the_codec() -> None:
    tagged = {  # the public ones: the private bases are tagged with their class names
        value
        for name, value in vars(codec).items()
        if isinstance(value, type)
        and issubclass(value, msgspec.Struct)
        and not name.startswith("_")
        and isinstance(value.__struct_config__.tag, str)
    }
    assert tagged == set(RECORDS.values())
    assert TAG_FIELD == "type" and COMMON >= {"v", "ts", "group", "client", "instance"}


def test_section_headings_are_unique() -> None:
    headings = [heading for heading, _ in split_sections()]
    assert len(headings) == len(set(headings))


def test_the_common_fields_are_described_once() -> None:
    [table] = [t for t in tables(section("Records on the wire")) if COMMON <= set(t)]
    assert TAG_FIELD in table and table[TAG_FIELD][:2] == ("string", "required")
    for name in COMMON | {TAG_FIELD}:
        assert table[name][2] == 1, f"`{name}` deserves a row of its own"
    common_only = msgspec.defstruct(
        "Common", [(f.name, f.type) for f in msgspec.structs.fields(codec.Claim) if f.name in COMMON], kw_only=True
    )
    assert_table_matches(common_only, table, "common fields")


@pytest.mark.parametrize("tag", sorted(RECORDS))
def test_every_field_of_a_record_type_is_in_its_section(tag: str) -> None:
    cls, text = RECORDS[tag], section(tag)
    names = {f.name for f in msgspec.structs.fields(cls)} | {TAG_FIELD}
    covering = [t for t in tables(text) if names <= set(t)]
    assert covering, f"{tag}: no table names every field of {cls.__name__}: {sorted(names)}"
    assert_table_matches(cls, covering[0], tag)


@pytest.mark.parametrize("tag", sorted(RECORDS))
def test_the_fields_of_nested_objects_are_in_their_section(tag: str) -> None:
    text = section(tag)
    for field in msgspec.inspect.type_info(RECORDS[tag]).fields:
        for nested in nested_structs(field.type):
            for name in (f.name for f in msgspec.structs.fields(nested)):
                assert f"`{name}`" in text, f"{tag}: `{name}` of {nested.__name__} (in `{field.name}`) is not named"
            covering = [t for t in tables(text) if {f.name for f in msgspec.structs.fields(nested)} <= set(t)]
            if covering:  # a small object may be described in prose instead
                assert_table_matches(nested, covering[-1], f"{tag}.{field.name}")


@pytest.mark.parametrize("tag", sorted(RECORDS))
def test_each_record_type_states_its_release(tag: str) -> None:
    match = RELEASE.search(section(tag))
    assert match, f"{tag}: which release introduced it? ('Introduced in release X.Y.Z')"
    rows = {
        cells[0]: cells[1]
        for line in section("Changes by release").splitlines()
        if line.startswith("|") and len(cells := [c.strip() for c in line.strip("|").split("|")]) >= 2
    }
    assert match.group(1) in rows, f"{tag}: release {match.group(1)} is not in 'Changes by release'"
    assert f"`{tag}`" in rows[match.group(1)], f"{tag}: the row of release {match.group(1)} does not name it"


@pytest.mark.parametrize("tag", sorted(RECORDS))
def test_each_record_type_has_an_example(tag: str) -> None:
    assert any(heading == tag for heading, _ in examples()), f"{tag}: no ```json example in its section"


@pytest.mark.parametrize(("heading", "example"), examples(), ids=[h for h, _ in examples()])
def test_every_example_decodes_to_the_record_type_of_its_section(heading: str, example: str) -> None:
    assert heading in RECORDS, f"an example in section '{heading}', which is not a record type's"
    record = codec.decode(example.encode())
    assert type(record) is RECORDS[heading]


@pytest.mark.parametrize(("heading", "example"), examples(), ids=[h for h, _ in examples()])
def test_the_examples_hold_nothing_the_fold_would_drop(heading: str, example: str) -> None:
    """An example's ``done`` and number extras are ones the fold keeps, not silently dropped ones."""
    record = codec.decode(example.encode())
    states: list[typing.Any] = list(record.positions) if isinstance(record, codec.Checkpoint) else codec.expand(record)
    for state in states:
        if getattr(state, "done", None) is not None:
            assert done_set.parse(state.offset, state.done) is not None, f"{heading}: `done` is not canonical"
        for name in EXTRAS:
            if getattr(state, name, None) is not None:
                assert codec.reported_number(getattr(state, name)) is not None, f"{heading}: `{name}` is dropped"


def test_derived_state_names_what_the_fold_keeps() -> None:
    text = section("Derived state")
    for field in dataclasses.fields(PartitionState):
        assert f"`{field.name}`" in text, f"PartitionState.{field.name} is not described"
    for liveness in Liveness:
        assert f"`{liveness.value}`" in text, f"liveness {liveness.value} is not described"
    for name in ("resume_offset", "skip_ranges"):
        assert hasattr(PartitionState, name) and re.search(rf"\b{name}\b", text), name
