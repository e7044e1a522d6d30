"""The wire format of the coordination topic (docs/protocol.md), without a broker.

Everything a reader takes from the coordination topic is untrusted: whatever
the bytes, ``decode`` returns a valid record or raises DecodeError, never
anything else and never a half-valid record.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import codec
from marshal_workers.protocol.codec import Claim, ClaimMessages, Heartbeat, Release, ReleaseGroup

MAX_INT64 = 2**63 - 1

COMMON_FIELDS = ("v", "type", "ts", "group", "client", "instance")
FIELDS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "claim": COMMON_FIELDS + ("topic", "partition"),
    "heartbeat": COMMON_FIELDS + ("topic", "partition", "offset"),
    "release": COMMON_FIELDS + ("topic", "partition", "offset"),
    "claim_messages": COMMON_FIELDS + ("topic", "partition", "offset"),
    "release_group": COMMON_FIELDS + ("expires",),
}
CLASS_BY_TYPE: dict[str, type] = {
    "claim": Claim,
    "heartbeat": Heartbeat,
    "release": Release,
    "claim_messages": ClaimMessages,
    "release_group": ReleaseGroup,
}
NAME_FIELDS = ("group", "client", "instance", "topic")
INT_FIELDS = ("ts", "partition", "offset", "expires")

# One valid wire object of each type, as another implementation would write it.
VALID: dict[str, dict[str, Any]] = {
    "claim": {
        "v": 1,
        "type": "claim",
        "ts": 1_700_000_000_000,
        "group": "billing",
        "client": "host-a",
        "instance": "5f1c",
        "topic": "orders",
        "partition": 3,
    },
    "heartbeat": {
        "v": 1,
        "type": "heartbeat",
        "ts": 1_700_000_001_000,
        "group": "billing",
        "client": "host-a",
        "instance": "5f1c",
        "topic": "orders",
        "partition": 3,
        "offset": 42,
    },
    "release": {
        "v": 1,
        "type": "release",
        "ts": 1_700_000_002_000,
        "group": "billing",
        "client": "host-a",
        "instance": "5f1c",
        "topic": "orders",
        "partition": 3,
        "offset": 43,
    },
    "claim_messages": {
        "v": 1,
        "type": "claim_messages",
        "ts": 1_700_000_003_000,
        "group": "billing",
        "client": "host-a",
        "instance": "5f1c",
        "topic": "orders",
        "partition": 3,
        "offset": 100,
    },
    "release_group": {
        "v": 1,
        "type": "release_group",
        "ts": 1_700_000_004_000,
        "group": "billing",
        "client": "operator",
        "instance": "77aa",
        "expires": 1_700_000_060_000,
    },
}

FUZZ = settings(max_examples=examples(500), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson cannot write ints beyond 64 bits; the stdlib can
        return json.dumps(value).encode()


def without(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != name}


def expect_decode_error(value: bytes | None) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        codec.decode(value)
    return info.value


# ----------------------------------------------------------------- round trip


def _record(type_name: str) -> codec.Record:
    fields = without(VALID[type_name], "type")
    return CLASS_BY_TYPE[type_name](**fields)


@pytest.mark.parametrize("type_name", list(VALID))
def test_round_trip_of_each_record_type(type_name: str) -> None:
    record = _record(type_name)
    decoded = codec.decode(codec.encode(record))
    assert type(decoded) is type(record)
    assert decoded == record


@pytest.mark.parametrize("type_name", list(VALID))
def test_encode_writes_exactly_the_wire_fields_of_design_section_2(type_name: str) -> None:
    assert orjson.loads(codec.encode(_record(type_name))) == VALID[type_name]


@pytest.mark.parametrize("type_name", list(VALID))
def test_decode_reads_what_another_implementation_writes(type_name: str) -> None:
    wire = VALID[type_name]
    assert codec.decode(dumps(wire)) == _record(type_name)
    # JSON objects are unordered: the "type" tag may come last.
    reordered = dict(reversed(list(wire.items())))
    assert codec.decode(dumps(reordered)) == _record(type_name)


names = st.text(min_size=1, max_size=1024)
ints = st.integers(min_value=0, max_value=MAX_INT64)
_common = {"v": st.just(1), "ts": ints, "group": names, "client": names, "instance": names}
_partition = {**_common, "topic": names, "partition": ints}
records = st.one_of(
    st.builds(Claim, **_partition),
    st.builds(Heartbeat, **_partition, offset=ints),
    st.builds(Release, **_partition, offset=ints),
    st.builds(ClaimMessages, **_partition, offset=ints),
    st.builds(ReleaseGroup, **_common, expires=ints),
)


@FUZZ
@given(records)
def test_round_trip_property(record: codec.Record) -> None:
    decoded = codec.decode(codec.encode(record))
    assert type(decoded) is type(record)
    assert decoded == record


def test_names_of_1024_characters_are_valid_even_when_not_ascii() -> None:
    long_name = "\U0001f600" * 1024  # 1024 characters, 4096 UTF-8 bytes
    record = Claim(v=1, ts=0, group=long_name, client="c", instance="i", topic=long_name, partition=0)
    assert codec.decode(codec.encode(record)) == record


# --------------------------------------------------------- strict validation


@pytest.mark.parametrize(
    ("type_name", "field"),
    [(t, f) for t, fields in FIELDS_BY_TYPE.items() for f in fields],
)
def test_missing_field_is_rejected(type_name: str, field: str) -> None:
    expect_decode_error(dumps(without(VALID[type_name], field)))


@pytest.mark.parametrize(
    ("type_name", "field", "value"),
    [
        # bool where an int is expected (bool is an int subclass in Python, not in JSON)
        *[("heartbeat", f, True) for f in ("ts", "partition", "offset")],
        ("heartbeat", "partition", False),
        ("release_group", "expires", True),
        ("claim", "v", True),
        # floats, even integral ones
        ("claim", "ts", 1_700_000_000_000.0),
        ("claim", "ts", 1_700_000_000_000.5),
        ("heartbeat", "offset", 42.0),
        ("release_group", "expires", 1.5),
        # strings where an int is expected
        ("claim", "partition", "3"),
        ("heartbeat", "offset", "42"),
        ("claim", "ts", "1700000000000"),
        # non-strings where a name is expected
        ("claim", "group", 7),
        ("claim", "topic", ["orders"]),
        ("heartbeat", "client", None),
        ("release_group", "instance", {"id": "x"}),
        # null, lists and objects where an int is expected
        ("claim", "partition", None),
        ("heartbeat", "offset", [42]),
        ("release", "offset", {"value": 43}),
    ],
)
def test_wrong_type_is_rejected(type_name: str, field: str, value: Any) -> None:
    expect_decode_error(dumps({**VALID[type_name], field: value}))


@pytest.mark.parametrize(
    ("type_name", "field"),
    [
        ("claim", "partition"),
        ("heartbeat", "partition"),
        ("heartbeat", "offset"),
        ("release", "offset"),
        ("claim_messages", "offset"),
        ("claim", "ts"),
        ("release_group", "expires"),
    ],
)
@pytest.mark.parametrize("value", [-1, -(2**63), MAX_INT64 + 1, 10**30])
def test_int_outside_zero_to_int64_is_rejected(type_name: str, field: str, value: int) -> None:
    expect_decode_error(dumps({**VALID[type_name], field: value}))


@pytest.mark.parametrize("version", [0, 2, -1, "1", 1.0, None, True])
def test_version_other_than_1_is_rejected(version: Any) -> None:
    expect_decode_error(dumps({**VALID["heartbeat"], "v": version}))


@pytest.mark.parametrize("type_name", ["bogus", "Claim", "CLAIM", "claim ", "", "release-group", None, 1, ["claim"]])
def test_unknown_type_is_rejected(type_name: Any) -> None:
    expect_decode_error(dumps({**VALID["claim"], "type": type_name}))


@pytest.mark.parametrize(
    "value",
    [b"", b"not json", b"{", b'{"v":1,', b"{'v': 1}", b"\x00", b'{"v":1}garbage', b"NaN"],
)
def test_not_json_is_rejected(value: bytes) -> None:
    expect_decode_error(value)


@pytest.mark.parametrize(
    "value",
    [b"[]", b"1", b"0", b'"claim"', b"null", b"true", b"1.5", dumps([VALID["claim"]])],
)
def test_json_that_is_not_an_object_is_rejected(value: bytes) -> None:
    expect_decode_error(value)


def test_tombstone_is_rejected() -> None:
    expect_decode_error(None)


@pytest.mark.parametrize(
    "value",
    [
        b"\xff\xfe\xfd",
        dumps(VALID["claim"]).replace(b'"billing"', b'"bill\xffing"'),
        dumps(VALID["claim"]).replace(b'"orders"', b'"ord\xc3"'),  # truncated 2-byte sequence
        dumps(VALID["claim"]).replace(b'"host-a"', b'"\xed\xa0\x80"'),  # UTF-8 encoded surrogate
    ],
)
def test_invalid_utf8_is_rejected(value: bytes) -> None:
    expect_decode_error(value)


@pytest.mark.parametrize(
    ("type_name", "field"),
    [(t, f) for t, fields in FIELDS_BY_TYPE.items() for f in fields if f in NAME_FIELDS],
)
def test_empty_name_is_rejected(type_name: str, field: str) -> None:
    expect_decode_error(dumps({**VALID[type_name], field: ""}))


@pytest.mark.parametrize("field", NAME_FIELDS)
def test_name_longer_than_1024_characters_is_rejected(field: str) -> None:
    assert codec.decode(dumps({**VALID["claim"], field: "x" * 1024})) is not None
    expect_decode_error(dumps({**VALID["claim"], field: "x" * 1025}))


def test_deeply_nested_json_is_rejected_without_crashing() -> None:
    expect_decode_error(b'{"v":' * 100_000)
    expect_decode_error(b"[" * 100_000 + b"]" * 100_000)


# ---------------------------------------------------- forward compatibility


@pytest.mark.parametrize("type_name", list(VALID))
def test_unknown_extra_fields_are_ignored(type_name: str) -> None:
    extended = {
        **VALID[type_name],
        "priority": 7,
        "trace": {"id": "abc", "spans": [1, 2, None]},
        "note": None,
        "v2_field": ["x", 1.5, True],
    }
    assert codec.decode(dumps(extended)) == _record(type_name)


def test_release_group_ignores_partition_fields_it_does_not_have() -> None:
    extended = {**VALID["release_group"], "topic": "orders", "partition": -5, "offset": "junk"}
    assert codec.decode(dumps(extended)) == _record("release_group")


# ----------------------------------------------------------------------- fuzz


def _assert_decodes_or_rejects(value: bytes) -> codec.Record | None:
    """decode either returns a record or raises DecodeError; anything else fails the test."""
    try:
        record = codec.decode(value)
    except DecodeError:
        return None
    except BaseException as exc:  # noqa: BLE001 - every other exception is the bug we look for
        pytest.fail(f"decode raised {type(exc).__name__}: {exc!r} for input {value[:200]!r}")
    assert isinstance(record, codec.RECORD_TYPES)
    return record


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    positions = st.integers(min_value=0, max_value=len(data))
    return st.one_of(
        st.tuples(positions, st.integers(0, 255)).map(lambda t: data[: t[0]] + bytes([t[1]]) + data[t[0] + 1 :]),
        st.tuples(positions, st.binary(min_size=1, max_size=4)).map(lambda t: data[: t[0]] + t[1] + data[t[0] :]),
        st.tuples(positions, st.integers(1, 8)).map(lambda t: data[: t[0]] + data[t[0] + t[1] :]),
    )


random_bytes = st.one_of(
    st.binary(max_size=512),
    st.sampled_from([dumps(v) for v in VALID.values()]).flatmap(_mutations),
)


@FUZZ
@given(random_bytes)
def test_fuzz_random_bytes_only_raise_decode_error(value: bytes) -> None:
    _assert_decodes_or_rejects(value)


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=MAX_INT64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


@FUZZ
@given(json_values)
def test_fuzz_random_json_values_only_raise_decode_error(value: Any) -> None:
    _assert_decodes_or_rejects(dumps(value))


_short_names = st.text(min_size=1, max_size=12)
_valid_field_values: dict[str, st.SearchStrategy[Any]] = {
    "v": st.just(1),
    "type": st.sampled_from(list(FIELDS_BY_TYPE)),
    **{name: _short_names for name in NAME_FIELDS},
    **{name: st.integers(min_value=0, max_value=MAX_INT64) for name in INT_FIELDS},
}
_junk = st.one_of(
    json_values,
    st.integers(min_value=-(2**63), max_value=-1),
    st.just(""),
    st.text(min_size=1025, max_size=1030),
    st.sampled_from([True, False, 1.0, 0.5, "1", "claim", None, [], {}]),
)
_ALL_FIELDS = tuple(_valid_field_values)


@st.composite
def mixed_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid records of a random type, with some fields junk or missing, plus unknown extra fields."""
    obj: dict[str, Any] = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    type_name = draw(st.sampled_from(list(FIELDS_BY_TYPE)))
    for name in _ALL_FIELDS:
        if name in FIELDS_BY_TYPE[type_name]:
            choice = draw(st.sampled_from(["valid"] * 10 + ["junk", "missing"]))
        else:  # a field this type does not have: usually absent
            choice = draw(st.sampled_from(["missing", "missing", "valid", "junk"]))
        if choice == "missing":
            obj.pop(name, None)
        elif name == "type" and choice == "valid":
            obj[name] = type_name
        else:
            obj[name] = draw(_valid_field_values[name] if choice == "valid" else _junk)
    return obj


def _is_valid_v1(obj: dict[str, Any]) -> bool:
    """An independent reading of docs/protocol.md, "Records on the wire": is this JSON object a valid version-1 record?"""
    type_name = obj.get("type")
    if not isinstance(type_name, str) or type_name not in FIELDS_BY_TYPE:
        return False
    for name in FIELDS_BY_TYPE[type_name]:
        if name not in obj:
            return False
        value = obj[name]
        if name == "v" and not (type(value) is int and value == 1):
            return False
        if name in INT_FIELDS and not (type(value) is int and value >= 0):
            return False
        if name in NAME_FIELDS and not (type(value) is str and 1 <= len(value) <= 1024):
            return False
    return True


@FUZZ
@given(mixed_dicts())
def test_fuzz_mixed_valid_and_junk_fields(obj: dict[str, Any]) -> None:
    record = _assert_decodes_or_rejects(dumps(obj))
    assert (record is not None) == _is_valid_v1(obj), f"decode {'accepted' if record else 'rejected'} {obj!r}"
    if record is not None:
        # An accepted record carries exactly the values that were on the wire.
        assert type(record) is CLASS_BY_TYPE[obj["type"]]
        for name in FIELDS_BY_TYPE[obj["type"]]:
            if name != "type":
                assert getattr(record, name) == obj[name]


# ------------------------------------------------------- key and routing


def test_record_key_of_partition_records() -> None:
    for type_name in ("claim", "heartbeat", "release", "claim_messages"):
        assert codec.record_key(_record(type_name)) == b"billing/orders/3"


def test_record_key_of_release_group_is_the_group() -> None:
    assert codec.record_key(_record("release_group")) == b"billing"


def test_record_key_is_utf8() -> None:
    record = Claim(v=1, ts=0, group="grüppe", client="c", instance="i", topic="bestellungen-ä", partition=12)
    assert codec.record_key(record) == "grüppe/bestellungen-ä/12".encode()


def _expected_partition(topic: str, count: int) -> int:
    """The Go Marshal rule, computed independently of the code under test."""
    digest = hashlib.md5(topic.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % count


KNOWN_TOPICS = ["orders", "payments", "billing.invoices", "__consumer_offsets", "ünïcödé-主题", "x" * 1024]


@pytest.mark.parametrize("topic", KNOWN_TOPICS)
@pytest.mark.parametrize("count", [1, 2, 3, 8, 12, 50, 1000, 2**31 - 1])
def test_coordination_partition_is_md5_little_endian_mod_n(topic: str, count: int) -> None:
    assert codec.coordination_partition(topic, count) == _expected_partition(topic, count)


def test_coordination_partition_known_vectors() -> None:
    # The first 8 bytes of md5, little-endian, assembled byte by byte rather than with int.from_bytes.
    digest = hashlib.md5(b"orders").digest()
    as_int = sum(byte << (8 * i) for i, byte in enumerate(digest[:8]))  # little-endian by hand
    for count in (1, 7, 8, 64):
        assert codec.coordination_partition("orders", count) == as_int % count


def test_coordination_partition_differs_between_topics() -> None:
    # With enough partitions, distinct topics are spread out (the rule is not a constant).
    results = {codec.coordination_partition(f"topic-{i}", 64) for i in range(200)}
    assert len(results) > 32


@FUZZ
@given(st.text(min_size=1, max_size=300), st.integers(min_value=1, max_value=2**40))
def test_coordination_partition_is_in_range(topic: str, count: int) -> None:
    result = codec.coordination_partition(topic, count)
    assert 0 <= result < count
    assert result == _expected_partition(topic, count)


@pytest.mark.parametrize("count", [0, -1, -100])
def test_coordination_partition_rejects_partition_count_below_1(count: int) -> None:
    with pytest.raises(ValueError):
        codec.coordination_partition("orders", count)


def test_a_record_readers_would_skip_is_never_encoded() -> None:
    too_late = ReleaseGroup(v=1, ts=1, group="g", client="c", instance="i", expires=2**63)
    with pytest.raises(ValueError, match="readers would skip it"):
        codec.encode(too_late)
    with pytest.raises(ValueError):
        codec.encode(Claim(v=1, ts=1, group="", client="c", instance="i", topic="t", partition=0))


def test_heartbeat_extras_are_written_only_when_set() -> None:
    common = {"v": 1, "ts": 1, "group": "g", "client": "c", "instance": "i", "topic": "t", "partition": 0}
    plain = orjson.loads(codec.encode(Heartbeat(**common, offset=5)))
    assert set(plain) == {"v", "type", "ts", "group", "client", "instance", "topic", "partition", "offset"}
    extras = codec.decode(codec.encode(Heartbeat(**common, offset=5, lag=7, rate=12.5)))
    assert (extras.lag, extras.rate) == (7, 12.5)


def test_done_sets_are_written_only_when_set_and_read_back_as_written() -> None:
    common = {"v": 1, "ts": 1, "group": "g", "client": "c", "instance": "i", "topic": "t", "partition": 0}
    for kind in (Heartbeat, Release):
        plain = orjson.loads(codec.encode(kind(**common, offset=5)))
        assert "done" not in plain
        assert codec.decode(codec.encode(kind(**common, offset=5, done=[3, 1, 2]))).done == [3, 1, 2]
    # Typed loosely like lag and rate: a malformed done set does not make the record garbage.
    junk = orjson.dumps({**VALID["release"], "done": {"not": "runs"}})
    assert codec.decode(junk).done == {"not": "runs"}


# ------------------------------------------------------------ heartbeats (0.2.0)

HEARTBEATS = {
    "v": 1,
    "type": "heartbeats",
    "ts": 1_700_000_001_000,
    "group": "billing",
    "client": "host-a",
    "instance": "5f1c",
    "topic": "orders",
    "beats": [{"partition": 3, "offset": 42}, {"partition": 7, "offset": 9, "lag": 5, "done": [2, 1, 1]}],
}


def test_a_heartbeats_record_decodes_and_stands_for_one_heartbeat_per_entry() -> None:
    record = codec.decode(orjson.dumps(HEARTBEATS))
    assert isinstance(record, codec.Heartbeats)
    assert orjson.loads(codec.encode(record)) == HEARTBEATS
    assert codec.record_key(record) == b"billing/orders"
    singles = codec.expand(record)
    assert [(h.topic, h.partition, h.offset, h.lag, h.done) for h in singles] == [  # type: ignore[union-attr]
        ("orders", 3, 42, None, None),
        ("orders", 7, 9, 5, [2, 1, 1]),
    ]
    assert all(isinstance(h, Heartbeat) and h.ts == record.ts and h.instance == "5f1c" for h in singles)


@pytest.mark.parametrize(
    "beats",
    [
        [],  # says nothing: not a heartbeat
        [{"partition": -1, "offset": 1}],
        [{"partition": 0}],
        [{"offset": 3}],
        [{"partition": 0, "offset": "3"}],
        "all",
        [[0, 3]],
        None,
    ],
)
def test_a_malformed_heartbeats_record_is_garbage(beats: Any) -> None:
    expect_decode_error(orjson.dumps(HEARTBEATS | {"beats": beats}))


def test_a_heartbeats_record_with_more_entries_than_any_member_writes_is_garbage() -> None:
    beats = [{"partition": p, "offset": 0} for p in range(codec.MAX_BEATS + 1)]
    expect_decode_error(orjson.dumps(HEARTBEATS | {"beats": beats}))
    assert codec.expand(codec.decode(orjson.dumps(HEARTBEATS | {"beats": beats[:-1]}))).__len__() == codec.MAX_BEATS


# ------------------------------------------------------- message_claims (0.3.0)

MESSAGE_CLAIMS = {
    "v": 1,
    "type": "message_claims",
    "ts": 1_700_000_003_500,
    "group": "billing",
    "client": "host-b",
    "instance": "90e2",
    "topic": "payments",
    "claims": [{"partition": 0, "offset": 1100}, {"partition": 2, "offset": 7}],
}


def test_a_message_claims_record_decodes_and_stands_for_one_claim_messages_per_entry() -> None:
    record = codec.decode(orjson.dumps(MESSAGE_CLAIMS))
    assert isinstance(record, codec.MessageClaims)
    assert orjson.loads(codec.encode(record)) == MESSAGE_CLAIMS
    assert codec.record_key(record) == b"billing/payments"
    singles = codec.expand(record)
    assert [(type(c), c.topic, c.partition, c.offset, c.ts, c.instance) for c in singles] == [  # type: ignore[union-attr]
        (ClaimMessages, "payments", 0, 1100, record.ts, "90e2"),
        (ClaimMessages, "payments", 2, 7, record.ts, "90e2"),
    ]


@pytest.mark.parametrize(
    "claims",
    [
        [],
        [{"partition": 0}],
        [{"offset": 3}],
        [{"partition": 0, "offset": -1}],
        [{"partition": 0, "offset": "3"}],
        [[0, 3]],
        {"partition": 0, "offset": 3},
        None,
    ],
)
def test_a_malformed_message_claims_record_is_garbage(claims: Any) -> None:
    expect_decode_error(orjson.dumps(MESSAGE_CLAIMS | {"claims": claims}))


def test_a_message_claims_record_with_more_entries_than_any_member_writes_is_garbage() -> None:
    claims = [{"partition": p, "offset": 0} for p in range(codec.MAX_BEATS + 1)]
    expect_decode_error(orjson.dumps(MESSAGE_CLAIMS | {"claims": claims}))


def test_expand_leaves_every_other_record_as_it_is() -> None:
    record = _record("claim")
    assert codec.expand(record) == [record]
