"""The HTTP service's requests and answers (http_messages.py), and its security checks: pure, no broker."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.core.config import Settings
from marshal_workers.errors import ConfigError
from marshal_workers.http.http_messages import (
    BadRequest,
    MessageId,
    ReadRequest,
    message_ids,
    message_json,
    read_request,
)
from marshal_workers.http.http_service import check_bind, tls_context


def test_a_read_defaults_to_one_message_within_five_seconds_and_takes_durations() -> None:
    assert read_request({}) == ReadRequest(5.0, 1)
    assert read_request({"timeout": "250ms", "max": "100"}) == ReadRequest(0.25, 100)
    assert read_request({"timeout": "0"}) == ReadRequest(0.0, 1)
    assert read_request({"timeout": "0.0s", "max": "007"}) == ReadRequest(0.0, 7)


@given(st.dictionaries(st.sampled_from(["timeout", "max", "wait"]), st.text(max_size=8), max_size=3))
@settings(max_examples=examples(300))
def test_any_read_query_is_either_a_read_or_a_bad_request(query: dict[str, str]) -> None:
    try:
        asked = read_request(query)
    except BadRequest as refused:
        assert refused.status == 400
    else:
        assert 0 <= asked.wait_s <= 60 and 1 <= asked.most <= 1000


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"timeout": "soon"}, "bad_timeout"),
        ({"timeout": "2m"}, "bad_timeout"),
        ({"max": "0"}, "bad_max"),
        ({"max": "1001"}, "bad_max"),
        ({"max": "-1"}, "bad_max"),
        ({"max": "1.5"}, "bad_max"),
        ({"wait": "1s"}, "bad_parameter"),
        # Other scripts' digits: "²" passed str.isdigit() and int() then failed: a 500, not a 400.
        ({"max": "\u00b2"}, "bad_max"),
        ({"max": "\u0663"}, "bad_max"),
        ({"timeout": "\u0663s"}, "bad_timeout"),
        ({"timeout": "5s\n"}, "bad_timeout"),
        ({"timeout": " 5s"}, "bad_timeout"),
        ({"timeout": "0.0001s"}, "bad_timeout"),
    ],
)
def test_a_bad_read_query_is_a_400_that_says_what_to_send(query: dict[str, str], error: str) -> None:
    with pytest.raises(BadRequest) as raised:
        read_request(query)
    assert raised.value.status == 400 and raised.value.error == error
    assert orjson.loads(raised.value.body())["message"]


def test_ack_bodies_are_lists_of_topic_partition_offset_with_duplicates_dropped() -> None:
    body = (
        b'[{"topic": "t", "partition": 1, "offset": 5}, {"topic": "t", "partition": 0, "offset": 7},'
        b' {"topic": "t", "partition": 1, "offset": 5}]'
    )
    assert message_ids(body) == [MessageId("t", 1, 5), MessageId("t", 0, 7)]
    assert message_ids(b'{"topic": "t", "partition": 0, "offset": 0}') == [MessageId("t", 0, 0)]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[",
        b"null",
        b"[]",
        b"{}",
        b"[1]",
        b'[{"topic": "", "partition": 0, "offset": 0}]',
        b'[{"topic": "t", "partition": true, "offset": 0}]',
        b'[{"topic": "t", "partition": 0, "offset": -1}]',
        b'[{"topic": "t", "partition": 0, "offset": 9223372036854775808}]',
        b'[{"topic": "t", "partition": 0}]',
        b'[{"topic": "t", "partition": 0, "offset": 1.0}]',
    ],
)
def test_malformed_ack_bodies_are_400s(body: bytes) -> None:
    with pytest.raises(BadRequest) as raised:
        message_ids(body)
    assert raised.value.status == 400


def test_too_many_messages_in_one_request_is_a_413() -> None:
    body = orjson.dumps([{"topic": "t", "partition": 0, "offset": n} for n in range(10_001)])
    with pytest.raises(BadRequest) as raised:
        message_ids(body)
    assert raised.value.status == 413


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["topic", "partition", "offset", "x"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.binary(max_size=200), JSON.map(lambda value: orjson.dumps(value))))
def test_any_body_is_either_message_ids_or_a_bad_request(body: bytes) -> None:
    """Untrusted input: whatever the bytes, the parser answers ids or a 4xx, never anything else."""
    try:
        found = message_ids(body)
    except BadRequest as exc:
        assert 400 <= exc.status < 500
        return
    assert found and all(isinstance(m.offset, int) and m.offset >= 0 and m.topic for m in found)


def test_a_message_is_text_when_all_of_it_is_utf8_and_base64_otherwise() -> None:
    text = message_json("t", 0, 5, b"k", b'{"a": 1}', [("trace", b"abc")], 1000, 2000, 1)
    assert text["encoding"] == "utf-8" and text["value"] == '{"a": 1}' and text["headers"] == [["trace", "abc"]]
    binary = message_json("t", 0, 6, b"k", b"\xff\x00", [("trace", b"abc")], None, 2000, 2)
    assert binary["encoding"] == "base64"
    assert base64.b64decode(binary["value"]) == b"\xff\x00" and base64.b64decode(binary["key"]) == b"k"
    assert base64.b64decode(binary["headers"][0][1]) == b"abc"
    empty = message_json("t", 0, 7, None, None, [], None, 2000, 1)
    assert (empty["key"], empty["value"], empty["encoding"]) == (None, None, "utf-8")
    assert orjson.loads(orjson.dumps(binary)) == binary


def test_without_a_token_the_service_stays_on_this_host_unless_told() -> None:
    check_bind("127.0.0.1", None, False)
    check_bind("localhost", None, False)
    check_bind("::1", None, False)
    check_bind("0.0.0.0", "secret", False)
    check_bind("0.0.0.0", None, True)
    with pytest.raises(ConfigError, match="--token-file"):
        check_bind("0.0.0.0", None, False)


def test_the_token_comes_from_the_setting_or_its_file_and_is_never_shown(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert Settings(serve_token_file=str(token_file)).serve_token_value() == "from-file"
    shown = Settings(serve_token="hush-hush")
    assert shown.serve_token_value() == "hush-hush" and "hush-hush" not in repr(shown)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings(serve_token_file=str(tmp_path / "missing")).serve_token_value()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        Settings(serve_token_file=str(tmp_path / "empty")).serve_token_value()


def test_tls_needs_both_files_that_load(tmp_path: Path) -> None:
    assert tls_context(None, None) is None
    with pytest.raises(ConfigError, match="both"):
        tls_context(str(tmp_path / "cert.pem"), None)
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="cannot load"):
        tls_context(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
