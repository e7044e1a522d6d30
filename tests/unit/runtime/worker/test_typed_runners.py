"""A typed handler's bad payloads under each partition worker loop (one call at a time, batches at least once, at
most once, lanes of messages and of batches), on the fake link and clock in one process: every good message is
handled once, every bad one dead-lettered once as a PayloadError, never retried, and progress moves past all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from fake_record import FakeRecord
from worker_fakes import PARTITION, TOPIC, DeadLetters, FakeClock, FakeLink, run_partition_loop

from marshal_workers import App, Message
from marshal_workers.core.exit_codes import WorkerExit


class Order(msgspec.Struct):
    id: int
    item: str


VALUES = [
    b'{"id": 1, "item": "tea"}',
    b'{"id": "two", "item": "tea"}',  # wrong type
    b'{"id": 3, "item": "milk"}',
    b'{"item": "no id"}',  # missing field
    b"not json at all",
    b'{"id": 6, "item": "jam"}',
]
GOOD, BAD = {1, 3, 6}, {2, 4, 5}


class KeptDeadLetters(DeadLetters):
    """DeadLetters that keeps each one's headers too."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: dict[int, dict[str, bytes]] = {}

    def write(self, topic: str, records: Sequence[Any], headers: Any) -> None:
        super().write(topic, records, headers)
        for record, pairs in zip(records, headers):
            self.headers[record.offset()] = dict(pairs)


def _link(clock: FakeClock) -> FakeLink:
    arrivals = [(clock(), FakeRecord(TOPIC, PARTITION, i + 1, key=b"k%d" % i, value=v)) for i, v in enumerate(VALUES)]
    return FakeLink(clock, arrivals, start_offset=1, stop_when=lambda link: link.next_offset > len(VALUES))


def _run(kind: str) -> tuple[WorkerExit, FakeLink, KeptDeadLetters, list[tuple[int, int]]]:
    """Run the loop ``kind`` over VALUES; what the handler got: (offset, attempt) per good message."""
    clock, app, calls = FakeClock(), App("billing"), []
    batch = kind in ("batch", "amo batch", "lanes batch")
    options: dict[str, Any] = {"retries": 3, "retry_backoff": 0.01, "retry_jitter": False, "batch": batch}
    options.update(
        {
            "amo": {"mode": "amo", "batch_size": 4},
            "amo batch": {"mode": "amo", "batch_size": 4},
            "batch": {"batch_size": 4},
            "lanes": {"concurrency": 3},
            "lanes batch": {"concurrency": 2, "batch_size": 2},
        }.get(kind, {})
    )
    if batch:

        def handle_batch(msgs: list[Message[Order]]) -> None:
            calls.extend((m.offset, m.attempt) for m in msgs if isinstance(m.body, Order))

        app.handler(TOPIC, **options)(handle_batch)
    else:

        def handle(msg: Message[Order]) -> None:
            assert isinstance(msg.body, Order) and msg.body.id == msg.offset
            calls.append((msg.offset, msg.attempt))

        app.handler(TOPIC, **options)(handle)
    link, dead = _link(clock), KeptDeadLetters()
    code = run_partition_loop(kind, link, dead, app.handler_in_worker(TOPIC))
    return code, link, dead, sorted(calls)


@pytest.mark.parametrize("kind", ["one call", "batch", "amo", "amo batch", "lanes", "lanes batch"])
def test_bad_payloads_are_dead_lettered_once_without_retry_and_good_ones_handled_once(kind: str) -> None:
    code, link, dead, calls = _run(kind)

    assert code is WorkerExit.STOPPED
    assert calls == [(o, 1) for o in sorted(GOOD)], "each good message handled once, at its first try"
    assert sorted(dead.offsets) == sorted(BAD), "each bad message dead-lettered once"
    assert {o: h["error_type"] for o, h in dead.headers.items()} == dict.fromkeys(BAD, b"PayloadError")
    assert b"$.id" in dead.headers[2]["error"] and b"`id`" in dead.headers[4]["error"]
    assert b"malformed" in dead.headers[5]["error"]
    assert link.next_offset == len(VALUES) + 1, "progress moves past them all"
    counts = link.outcomes.take() or {}
    assert counts["rejected"] == len(BAD) and counts["retries"] == 0
