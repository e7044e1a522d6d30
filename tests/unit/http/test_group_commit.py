"""The HTTP service's group commit (http/group_commit.py), on a real event loop: requests that arrive while a write
is in flight share the next write, one record per kind, and each learns exactly its own entries' verdicts."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marshal_workers.errors import CoordinationWriteError
from marshal_workers.http.group_commit import MAX_ENTRIES_PER_RECORD, GroupCommit, Kind
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import Verdicts

FIELDS = {"v": codec.VERSION, "ts": 1, "group": "g", "client": "c", "instance": "i"}


def accepted(kind: Kind, entry: codec.MessageEntry) -> bool:
    """The fake fold's verdict: a function of the entry, so a mixed-up answer shows."""
    return (entry.offset + kind.value) % 3 != 0


def kind_of(record: codec.Record) -> Kind:
    return {codec.DeliverMessages: Kind.DELIVER, codec.AckMessages: Kind.ACK, codec.CancelMessages: Kind.CANCEL}[
        type(record)
    ]


class FakeCoordinator:
    """The coordinator's side of a write (group_commit.Writes): produces in order, records what it was given, and
    judges a write once the test confirms it (waking the loop through the own-folds socket, as the delivery
    reports' thread does)."""

    def __init__(self, confirm_at_once: bool = True, fail: bool = False, timeout_s: float = 10.0) -> None:
        self.writes: list[list[codec.Record]] = []
        self.confirmed: set[int] = set()
        self.confirm_at_once = confirm_at_once
        self.fail = fail
        self.timeout_s = timeout_s
        self._read_end, self._write_end = socket.socketpair()
        self._read_end.setblocking(False)

    def own_folds(self) -> socket.socket:
        return self._read_end

    def submit(self, records: Sequence[codec.Record]) -> tuple[int, float]:
        self.writes.append(list(records))
        index = len(self.writes) - 1
        if self.confirm_at_once:
            self.confirm(index)
        return index, time.monotonic() + self.timeout_s

    def confirm(self, index: int) -> None:
        self.confirmed.add(index)
        self._write_end.send(b"!")

    def collect(self, pending: tuple[int, float]) -> list[Any] | None:
        index, deadline = pending
        if index not in self.confirmed:
            if time.monotonic() > deadline:
                raise CoordinationWriteError("not confirmed in time (a test)")
            return None
        if self.fail:
            raise CoordinationWriteError("not confirmed (a test)")
        return [Verdicts(tuple(accepted(kind_of(r), e) for e in r.messages)) for r in self.writes[index]]  # type: ignore[attr-defined]

    def close(self) -> None:
        self._read_end.close()
        self._write_end.close()


def entries(*offsets: int) -> list[codec.MessageEntry]:
    return [codec.MessageEntry(0, offset) for offset in offsets]


def run(test: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(test(asyncio.get_running_loop()), 30)

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``condition`` holds (a generous deadline)."""
    give_up = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def commit_on(loop: asyncio.AbstractEventLoop, log: FakeCoordinator, **options: Any) -> GroupCommit:
    return GroupCommit(loop, log, lambda: FIELDS, "t", 30_000, write_timeout_s=log.timeout_s, **options).start()


def test_requests_that_arrive_while_a_write_is_in_flight_share_the_next_write_and_get_their_own_verdicts() -> None:
    kinds = [Kind.CANCEL, Kind.ACK, Kind.DELIVER, Kind.ACK] * 5

    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator(confirm_at_once=False)
        commit = commit_on(loop, log)
        first = commit.submit(Kind.DELIVER, entries(0))
        await until(lambda: len(log.writes) == 1, "the first write")
        waiting = [commit.submit(kind, entries(*range(10 * n, 10 * n + 3))) for n, kind in enumerate(kinds, start=1)]
        await asyncio.sleep(0.02)
        assert len(log.writes) == 1, "one write in flight: the others wait for it"
        log.confirm(0)
        assert await first == [accepted(Kind.DELIVER, codec.MessageEntry(0, 0))]
        await until(lambda: len(log.writes) == 2, "the second write")
        log.confirm(1)
        for n, (kind, future) in enumerate(zip(kinds, waiting), start=1):
            assert await future == [accepted(kind, e) for e in entries(*range(10 * n, 10 * n + 3))]
        assert len(log.writes) == 2, "the twenty requests queued behind the first write went in one write"
        second = log.writes[1]
        assert [type(r) for r in second] == [codec.DeliverMessages, codec.AckMessages, codec.CancelMessages], \
            "hand-outs first: an ack queued behind its hand-out is folded after it"  # fmt: skip
        assert sum(len(r.messages) for r in second) == 60  # type: ignore[attr-defined]
        assert isinstance(second[0], codec.DeliverMessages) and second[0].pending_ms == 30_000
        assert commit.snapshot().writes == 2 and commit.snapshot().entries == 61
        assert await commit.close(5)
        log.close()

    run(test)


def test_requests_of_one_pass_of_the_loop_go_in_one_write() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator()
        commit = commit_on(loop, log)
        futures = [commit.submit(Kind.ACK, entries(n)) for n in range(10)]
        assert [await f for f in futures] == [[accepted(Kind.ACK, e)] for e in entries(*range(10))]
        assert len(log.writes) == 1
        await commit.close(5)
        log.close()

    run(test)


def test_a_write_not_confirmed_fails_every_request_it_carried() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator(fail=True)
        commit = commit_on(loop, log)
        futures = [commit.submit(Kind.ACK, entries(n)) for n in range(5)]
        for future in futures:
            with pytest.raises(CoordinationWriteError):
                await future
        assert commit.snapshot().failed == 1
        await commit.close(5)
        log.close()

    run(test)


def test_a_write_never_judged_fails_at_its_timeout_without_any_wake_up() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator(confirm_at_once=False, timeout_s=0.2)
        commit = commit_on(loop, log)
        first = commit.submit(Kind.ACK, entries(1))
        await until(lambda: len(log.writes) == 1, "the write")
        queued = commit.submit(Kind.ACK, entries(2))
        with pytest.raises(CoordinationWriteError):
            await first
        await until(lambda: len(log.writes) == 2, "the next write, once the first failed")
        log.confirm(1)
        assert await queued == [accepted(Kind.ACK, codec.MessageEntry(0, 2))]
        await commit.close(5)
        log.close()

    run(test)


def test_close_writes_what_is_queued_then_refuses_more() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator(confirm_at_once=False)
        commit = commit_on(loop, log)
        first = commit.submit(Kind.ACK, entries(1))
        await until(lambda: len(log.writes) == 1, "the first write")
        lingering = commit.submit(Kind.DELIVER, entries(2), linger=True)  # answered already: must still be written
        closing = asyncio.ensure_future(commit.close(5))
        log.confirm(0)
        await until(lambda: len(log.writes) == 2, "the queued hand-out's write")
        log.confirm(1)
        assert await closing
        assert await first == [True] and await lingering == [accepted(Kind.DELIVER, codec.MessageEntry(0, 2))]
        with pytest.raises(RuntimeError, match="closed"):
            commit.submit(Kind.ACK, entries(3))
        log.close()

    run(test)


def test_hand_outs_answered_already_linger_for_a_write_somebody_waits_on() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator()
        commit = commit_on(loop, log, linger_s=0.5)
        handed = commit.submit(Kind.DELIVER, entries(1), linger=True)
        await asyncio.sleep(0.05)
        assert log.writes == [], "a hand-out alone waits for company"
        acked = commit.submit(Kind.ACK, entries(1))
        await acked
        assert await handed == [accepted(Kind.DELIVER, codec.MessageEntry(0, 1))]
        assert [[kind_of(r) for r in w] for w in log.writes] == [[Kind.DELIVER, Kind.ACK]], "one write, both"
        alone = commit.submit(Kind.DELIVER, entries(5), linger=True)
        assert await alone == [accepted(Kind.DELIVER, codec.MessageEntry(0, 5))], "written when the linger is over"
        assert len(log.writes) == 2
        await commit.close(5)
        log.close()

    run(test)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.lists(st.integers(0, 10**6), min_size=1, max_size=50)),
                min_size=1, max_size=30))  # fmt: skip
def test_one_batch_maps_every_request_to_exactly_its_entries_verdicts(requests: list[tuple[Kind, list[int]]]) -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator()
        commit = commit_on(loop, log)
        futures = [commit.submit(kind, entries(*offsets)) for kind, offsets in requests]
        for (kind, offsets), future in zip(requests, futures):
            assert await future == [accepted(kind, e) for e in entries(*offsets)]
        [records] = log.writes
        kinds = [kind_of(r) for r in records]
        assert kinds == sorted(kinds, key=lambda k: k.value), "deliver, ack, cancel"
        assert sum(len(r.messages) for r in records) == sum(len(o) for _, o in requests)  # type: ignore[attr-defined]
        await commit.close(5)
        log.close()

    run(test)


def test_a_huge_batch_is_split_into_records_of_bounded_size() -> None:
    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator()
        commit = commit_on(loop, log)
        many = entries(*range(MAX_ENTRIES_PER_RECORD * 2 + 5))
        assert await commit.submit(Kind.ACK, many) == [accepted(Kind.ACK, e) for e in many]
        assert [len(r.messages) for r in log.writes[0]] == [MAX_ENTRIES_PER_RECORD, MAX_ENTRIES_PER_RECORD, 5]  # type: ignore[attr-defined]
        await commit.close(5)
        log.close()

    run(test)


def test_with_two_writes_in_flight_a_request_does_not_wait_for_the_write_before_and_order_is_kept() -> None:
    """The second write is produced while the first is unconfirmed (a request waits for one write, not two), in
    the order the entries were queued (a hand-out before the ack of it); a third request waits for a write to
    land and then shares a write with those queued meanwhile."""

    async def test(loop: asyncio.AbstractEventLoop) -> None:
        log = FakeCoordinator(confirm_at_once=False)
        commit = commit_on(loop, log, in_flight=2)
        handed = commit.submit(Kind.DELIVER, entries(1))
        await until(lambda: len(log.writes) == 1, "the first write")
        acked = commit.submit(Kind.ACK, entries(1))
        await until(lambda: len(log.writes) == 2, "the second write, the first unconfirmed")
        later = [commit.submit(Kind.ACK, entries(n)) for n in (2, 3, 4)]
        log.confirm(1)
        assert await acked == [accepted(Kind.ACK, codec.MessageEntry(0, 1))]
        assert not handed.done()  # each request hears of its own write only
        await until(lambda: len(log.writes) == 3, "the third write")
        log.confirm(0)
        log.confirm(2)
        assert await handed == [accepted(Kind.DELIVER, codec.MessageEntry(0, 1))]
        assert [await f for f in later] == [[accepted(Kind.ACK, codec.MessageEntry(0, n))] for n in (2, 3, 4)]
        assert [[kind_of(r) for r in w] for w in log.writes] == [[Kind.DELIVER], [Kind.ACK], [Kind.ACK]]
        assert [e.offset for e in log.writes[2][0].messages] == [2, 3, 4]  # type: ignore[attr-defined]
        await commit.close(5)
        log.close()

    run(test)
