"""The pure parts of the dead-letter commands (marshal_workers.dlq): which letters, what they carry back."""

from __future__ import annotations

from marshal_workers.dlq import DeadLetter, choose, summary


def letter(offset: int, error_type: str, at: int, topic: str = "orders") -> DeadLetter:
    headers = [("traceparent", b"00-aa"), ("error", b"boom"), ("error_type", error_type.encode()),
               ("original_topic", topic.encode()), ("original_offset", str(offset).encode())]  # fmt: skip
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
        {"error_type": "ValueError", "count": 2, "oldest_ms": 100, "newest_ms": 300, "from_topics": ["orders"]},
        {"error_type": "WorkerLost", "count": 1, "oldest_ms": 200, "newest_ms": 200, "from_topics": ["refunds"]},
    ]
