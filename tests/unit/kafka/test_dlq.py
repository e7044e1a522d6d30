"""The pure parts of the dead-letter commands (marshal_workers.ops.dlq): which letters, what they carry back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.kafka.dead_letter_reader import DeadLetter, Tally, summary
from marshal_workers.ops.dlq import choose


def letter(offset: int, error_type: str, at: int, topic: str = "orders") -> DeadLetter:
    headers = [
        ("traceparent", b"00-aa"),
        ("error", b"boom"),
        ("error_type", error_type.encode()),
        ("original_topic", topic.encode()),
        ("original_offset", str(offset).encode()),
    ]
    return DeadLetter(0, offset, at, b"k", b"v", headers)


def test_a_redriven_letter_carries_its_original_headers_without_ours() -> None:
    assert letter(1, "ValueError", 0).original_headers == [("traceparent", b"00-aa")]


def test_letters_are_chosen_by_error_type_and_time() -> None:
    letters = [letter(1, "ValueError", 100), letter(2, "WorkerLost", 200), letter(3, "ValueError", 300)]
    assert [x.offset for x in choose(letters, "ValueError", None)] == [1, 3]
    assert [x.offset for x in choose(letters, None, 200)] == [2, 3]
    assert choose(letters, "KeyError", None) == []


def test_the_summary_counts_by_error_type_most_first() -> None:
    letters = [letter(1, "ValueError", 100), letter(2, "WorkerLost", 200, "refunds"), letter(3, "ValueError", 300)]
    assert summary(letters) == [
        {
            "error_type": "ValueError",
            "count": 2,
            "oldest_ms": 100,
            "newest_ms": 300,
            "written_oldest_ms": None,
            "written_newest_ms": None,
            "from_topics": ["orders"],
        },  # letters that do not say when they were written
        {
            "error_type": "WorkerLost",
            "count": 1,
            "oldest_ms": 200,
            "newest_ms": 200,
            "written_oldest_ms": None,
            "written_newest_ms": None,
            "from_topics": ["refunds"],
        },
    ]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["ValueError", "KeyError", "WorkerLost"]),
            st.one_of(st.none(), st.integers(0, 10**6)),
            st.sampled_from(["orders", "payments"]),
        ),
        max_size=40,
    ),
    st.integers(0, 40),
)
def test_a_tally_read_in_two_goes_equals_one_read_whole_and_knows_where_to_go_on(
    found: list[tuple[int, str, int | None, str]], cut: int
) -> None:
    """The dashboard reads only new dead letters each time: its tally must come out as ``dlq list``'s summary."""
    offsets: dict[int, int] = {}
    letters = []
    for partition, error_type, timestamp, topic in found:
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        headers = [("error_type", error_type.encode()), ("original_topic", topic.encode())]
        letters.append(DeadLetter(partition, offset, timestamp, None, b"v", headers))
    tally = Tally()
    for letter in letters[:cut]:
        tally.add(letter)
    for letter in letters[cut:]:
        tally.add(letter)
    assert tally.rows() == summary(letters)
    assert tally.positions == {p: last + 1 for p, last in offsets.items()}
