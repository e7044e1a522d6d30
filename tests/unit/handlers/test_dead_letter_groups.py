"""Dead letters per group (issue 25): who wrote a letter, and which group alone handles it once redriven."""

from __future__ import annotations

import time

from confluent_kafka import Message as KafkaMessage
from fake_record import FakeRecord
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers import App
from marshal_workers.handlers.handler_outcomes import OutcomeCounts
from marshal_workers.kafka.dead_letter_reader import DeadLetter, Tally, summary
from marshal_workers.kafka.dead_letter_writer import error_headers
from marshal_workers.kafka.kafka_clients import RECORD_HEADERS
from marshal_workers.observe.metrics import Counters
from marshal_workers.ops.dlq import choose
from marshal_workers.protocol.dead_letter_groups import (
    CLIENT_ID_HEADER,
    GROUP_HEADER,
    REDRIVEN_FOR_HEADER,
    OtherGroups,
    for_another_group,
    origin_headers,
)
from marshal_workers.testing import make_message, run_handler

GROUPS = ["billing", "audit", "search", "bïlling"]
# Header names a message may carry, ours among them (anyone may write any header), and values of every kind.
names = st.sampled_from(["traceparent", "group", REDRIVEN_FOR_HEADER, GROUP_HEADER, CLIENT_ID_HEADER, "error"])
values = st.one_of(st.none(), st.binary(max_size=8), st.sampled_from([g.encode() for g in GROUPS]))
header_lists = st.lists(st.tuples(names, values), max_size=6)


def written_by(group: str, client_id: str, original: list, offset: int = 0, at: int | None = 100) -> DeadLetter:
    """A dead letter as a worker of ``group`` writes one: the original headers, the error's, then who wrote it;
    dead-lettered a second after its message's time ``at``."""
    record = FakeRecord(topic="orders", partition=2, offset=offset, headers=original)
    written = [
        (k, str((at or 0) + 1000).encode()) if k == "dead_lettered_at" else (k, v)
        for k, v in error_headers("app.handle", record, ValueError("boom"))
    ]
    headers = original + written + origin_headers(group, client_id)
    return DeadLetter(0, offset, at, b"k", b"v", headers)


def test_a_dead_letter_says_which_group_and_client_wrote_it() -> None:
    assert origin_headers("billing", "host-a") == [(GROUP_HEADER, b"billing"), (CLIENT_ID_HEADER, b"host-a")]
    letter = written_by("billing", "host-a", [("traceparent", b"00-aa")])
    assert (letter.group, letter.client_id, letter.error_type) == ("billing", "host-a", "ValueError")
    legacy = DeadLetter(0, 1, None, None, b"v", [("error_type", b"KeyError"), (GROUP_HEADER, b"")])
    assert legacy.group is None, "an empty value names no group"


def test_only_the_group_a_message_was_redriven_for_handles_it() -> None:
    billing = b"billing"
    assert not for_another_group(None, billing) and not for_another_group([("traceparent", b"x")], billing)
    assert not for_another_group([(REDRIVEN_FOR_HEADER, b"billing")], billing)
    assert for_another_group([(REDRIVEN_FOR_HEADER, b"audit")], billing)
    assert for_another_group([(REDRIVEN_FOR_HEADER, b"\xff\xfe")], billing), "compared as bytes, never decoded"
    # Untrusted values: the last header of the name decides; none, empty or not bytes addresses no group.
    assert not for_another_group([(REDRIVEN_FOR_HEADER, b"audit"), (REDRIVEN_FOR_HEADER, b"billing")], billing)
    assert not for_another_group([(REDRIVEN_FOR_HEADER, b"audit"), (REDRIVEN_FOR_HEADER, None)], billing)
    assert not for_another_group([(REDRIVEN_FOR_HEADER, b"")], billing)
    assert not for_another_group([(REDRIVEN_FOR_HEADER, "audit")], billing)  # type: ignore[list-item]


@given(header_lists, st.sampled_from(GROUPS), st.sampled_from(GROUPS), st.sampled_from(GROUPS))
def test_a_letter_redriven_goes_to_the_group_that_wrote_it_whatever_the_message_carried(
    original: list, writer: str, reader: str, lister: str
) -> None:
    """Whatever headers the message had (an earlier redrive's address, our header names, garbage), its letter names
    its writer, a redrive of it is for its writer alone, and ``--group`` selects it for its writer alone."""
    letter = written_by(writer, "host-a", original)
    assert letter.group == writer
    redriven = letter.redrive_headers("orders.dlq")
    assert for_another_group(redriven, reader.encode()) == (reader != writer)
    assert [name for name, _ in redriven].count(REDRIVEN_FOR_HEADER) == 1, "the old address is dropped"
    assert redriven[-2][0] == "redriven_from" and redriven[:-2] == letter.original_headers
    assert not {GROUP_HEADER, CLIENT_ID_HEADER, "error_type"} & {name for name, _ in redriven}
    assert choose([letter], None, None, lister) == ([letter] if lister == writer else [])


def test_a_letter_that_names_no_group_goes_back_to_every_group() -> None:
    legacy = DeadLetter(
        1, 7, 100, None, b"v", [("traceparent", b"00-aa"), ("error_type", b"ValueError"), ("original_topic", b"orders")]
    )
    redriven = legacy.redrive_headers("orders.dlq")
    assert redriven == [("traceparent", b"00-aa"), ("redriven_from", b"orders.dlq/1/7")]
    assert not any(for_another_group(redriven, g.encode()) for g in GROUPS)
    assert choose([legacy], None, None, "billing") == [] and choose([legacy], None, None) == [legacy]


def test_a_header_without_a_value_does_not_break_reading_a_letter() -> None:
    letter = DeadLetter(0, 0, None, None, None, [("error_type", None), ("original_topic", None), (GROUP_HEADER, None)])
    assert (letter.error_type, letter.group, letter.header("original_topic")) == ("unknown", None, None)


def test_a_fetch_is_searched_for_other_groups_messages_only_if_it_has_headers() -> None:
    other_groups = OtherGroups("billing")
    assert other_groups.offsets([FakeRecord(offset=o) for o in range(5)]) == frozenset()
    fetch = [
        FakeRecord(offset=10, headers=[("traceparent", b"00-aa")]),
        FakeRecord(offset=11, headers=[(REDRIVEN_FOR_HEADER, b"audit")]),
        FakeRecord(offset=12, headers=[(REDRIVEN_FOR_HEADER, b"billing")]),
        FakeRecord(offset=13),
        FakeRecord(offset=14, headers=[("traceparent", b"00-bb"), (REDRIVEN_FOR_HEADER, b"search")]),
    ]
    assert other_groups.offsets(fetch) == {11, 14}
    assert other_groups.keys(fetch) == {(3, 11), (3, 14)}


def test_a_workers_search_reads_kafka_records_headers_with_their_own_method() -> None:
    """A worker passes RECORD_HEADERS (the Kafka record's method, called from C): the same answer on real
    records, those with no headers at all included."""
    fetch = [
        KafkaMessage(topic="t", partition=3, offset=10),
        KafkaMessage(topic="t", partition=3, offset=11, headers=[(REDRIVEN_FOR_HEADER, b"audit")]),
        KafkaMessage(topic="t", partition=3, offset=12, headers=[(REDRIVEN_FOR_HEADER, b"billing")]),
        KafkaMessage(topic="t", partition=3, offset=13, headers=[("traceparent", b"00-aa")]),
    ]
    other_groups = OtherGroups("billing", RECORD_HEADERS)
    assert other_groups.offsets(fetch) == {11}
    assert other_groups.keys(fetch) == {(3, 11)}
    assert other_groups.offsets([fetch[0], fetch[3]]) == frozenset()


def test_the_list_counts_by_group_and_the_group_option_keeps_its_own() -> None:
    letters = [
        written_by("billing", "a", [], offset=1, at=100),
        written_by("billing", "b", [], offset=2, at=300),
        written_by("audit", "c", [], offset=3, at=200),
        DeadLetter(0, 4, 50, None, b"v", [("error_type", b"KeyError"), ("original_topic", b"orders")]),
    ]
    tally = Tally()
    for letter in letters:
        tally.add(letter)
    assert tally.groups() == [
        {"group": "billing", "count": 2},
        {"group": "audit", "count": 1},
        {"group": None, "count": 1},
    ]
    assert tally.rows({"billing"}) == [
        {
            "error_type": "ValueError",
            "count": 2,
            "oldest_ms": 100,
            "newest_ms": 300,
            "written_oldest_ms": 1100,
            "written_newest_ms": 1300,
            "from_topics": ["orders"],
        },
    ]
    assert tally.rows({"audit", None}) == [
        {
            "error_type": "KeyError",
            "count": 1,
            "oldest_ms": 50,
            "newest_ms": 50,
            "written_oldest_ms": None,
            "written_newest_ms": None,
            "from_topics": ["orders"],
        },  # written before letters said when
        {
            "error_type": "ValueError",
            "count": 1,
            "oldest_ms": 200,
            "newest_ms": 200,
            "written_oldest_ms": 1200,
            "written_newest_ms": 1200,
            "from_topics": ["orders"],
        },
    ]
    assert tally.rows() == summary(letters) and tally.rows()[0]["count"] == 3, "without a group: every letter"
    assert tally.rows({"search"}) == []


@given(
    st.lists(
        st.tuples(
            st.sampled_from([*GROUPS, None]),
            st.sampled_from(["ValueError", "KeyError"]),
            st.one_of(st.none(), st.integers(0, 1000)),
        ),
        max_size=30,
    )
)
def test_every_groups_rows_add_up_to_the_whole_list(found: list[tuple[str | None, str, int | None]]) -> None:
    tally = Tally()
    for offset, (group, error_type, at) in enumerate(found):
        tally.add(
            DeadLetter(
                0,
                offset,
                at,
                None,
                b"v",
                [("error_type", error_type.encode()), ("original_topic", b"t")] + origin_headers(group, "c"),
            )
        )
    whole = {row["error_type"]: row for row in tally.rows()}
    for error_type, row in whole.items():
        parts = [r for g in [*GROUPS, None] for r in tally.rows({g}) if r["error_type"] == error_type]
        assert sum(p["count"] for p in parts) == row["count"]
        stamps = [s for p in parts for s in (p["oldest_ms"], p["newest_ms"]) if s is not None]
        assert (min(stamps, default=None), max(stamps, default=None)) == (row["oldest_ms"], row["newest_ms"])
    assert sum(g["count"] for g in tally.groups()) == len(found)


def test_messages_passed_by_for_another_group_are_counted_in_the_outcomes() -> None:
    counts = OutcomeCounts()
    counts.other_group += 4
    report = counts.take()
    assert report is not None and report["other_group"] == 4 and counts.take() is None
    counters = Counters()
    counters.add_outcomes("orders", report)
    assert counters.handler_outcomes[("orders", "other_group")] == 4


def test_the_testing_harness_shows_the_headers_a_dead_letter_would_carry() -> None:
    app = App(group="billing", client_id="host-a")

    @app.handler("orders", retries=0)
    def handle(msg: object) -> None:
        raise ValueError("no")

    [result] = run_handler(app, "orders", [make_message(b"x", topic="orders")])
    headers = dict(result.dead_letter_headers or [])
    assert (headers[GROUP_HEADER], headers[CLIENT_ID_HEADER], headers["error_type"]) == (
        b"billing",
        b"host-a",
        b"ValueError",
    )


def test_the_testing_harness_passes_by_a_message_redriven_for_another_group_as_a_worker_does() -> None:
    app, called = App(group="billing"), []

    @app.handler("orders")
    def handle(msg: object) -> None:
        called.append(msg)

    messages = [
        make_message(b"mine", topic="orders", headers={REDRIVEN_FOR_HEADER: "billing"}),
        make_message(b"theirs", topic="orders", offset=1, headers={REDRIVEN_FOR_HEADER: "audit"}),
        make_message(b"anyone's", topic="orders", offset=2),
    ]
    assert [r.outcome for r in run_handler(app, "orders", messages)] == ["done", "other_group", "done"]
    assert [m.value for m in called] == [b"mine", b"anyone's"]  # type: ignore[attr-defined]


def test_since_goes_by_when_a_letter_was_dead_lettered_not_by_its_messages_time() -> None:
    """A message produced an hour before an incident and dead-lettered during it is chosen by --since the incident
    (a letter keeps its message's timestamp; --since read that and missed it); a letter from before letters said
    when they were written goes by its message's time, the best known."""
    hour_ms, incident_ms = 3_600_000, 1_800_000_000_000
    headers = error_headers("tasks.h", FakeRecord(topic="orders"), ValueError("boom"))
    [written_ms] = [int(v) for k, v in headers if k == "dead_lettered_at"]
    old_message = DeadLetter(
        0,
        0,
        incident_ms - hour_ms,
        b"k",
        b"v",
        [(k, str(incident_ms + 5).encode()) if k == "dead_lettered_at" else (k, v) for k, v in headers],
    )
    assert old_message.written_ms == incident_ms + 5 and abs(written_ms - time.time() * 1000) < 60_000
    legacy = DeadLetter(0, 1, incident_ms + 9, b"k", b"v", [("error_type", b"ValueError")])
    before = DeadLetter(
        0,
        2,
        incident_ms - hour_ms,
        b"k",
        b"v",
        [("error_type", b"ValueError"), ("dead_lettered_at", str(incident_ms - 1).encode())],
    )
    assert choose([old_message, legacy, before], None, incident_ms) == [old_message, legacy]
    assert "dead_lettered_at" not in dict(old_message.original_headers), "not sent back on a redrive"
    [row] = summary([old_message, before])
    assert (row["written_oldest_ms"], row["written_newest_ms"]) == (incident_ms - 1, incident_ms + 5)
    assert (row["oldest_ms"], row["newest_ms"]) == (incident_ms - hour_ms, incident_ms - hour_ms)
