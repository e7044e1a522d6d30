"""The HTTP service's group commit (http/group_commit.py): requests that arrive while a write is in flight share the
next write, one record per kind, and each learns exactly its own entries' verdicts."""

from __future__ import annotations

import threading
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


class FakeLog:
    """A coordinator's write that records what it was given; the first write may be held in flight."""

    def __init__(self, hold_first: bool = False, fail: bool = False) -> None:
        self.writes: list[list[codec.Record]] = []
        self.in_flight = threading.Event()
        self.release = threading.Event()
        self.hold_first = hold_first
        self.fail = fail

    def write(self, records: list[codec.Record]) -> list[Any]:
        self.writes.append(records)
        if self.hold_first and len(self.writes) == 1:
            self.in_flight.set()
            assert self.release.wait(10)
        if self.fail:
            raise CoordinationWriteError("not confirmed (a test)")
        return [
            Verdicts(tuple(accepted(kind_of(r), e) for e in r.messages))  # type: ignore[attr-defined]
            for r in records
        ]


def entries(*offsets: int) -> list[codec.MessageEntry]:
    return [codec.MessageEntry(0, offset) for offset in offsets]


def test_requests_that_arrive_while_a_write_is_in_flight_share_the_next_write_and_get_their_own_verdicts() -> None:
    log = FakeLog(hold_first=True)
    commit = GroupCommit(log.write, lambda: FIELDS, "t", 30_000).start()
    try:
        first = commit.submit(Kind.DELIVER, entries(0))
        assert log.in_flight.wait(10)
        waiting = [commit.submit(kind, entries(*range(10 * n, 10 * n + 3)))
                   for n, kind in enumerate([Kind.CANCEL, Kind.ACK, Kind.DELIVER, Kind.ACK] * 5, start=1)]  # fmt: skip
        log.release.set()
        assert first.result(10) == [accepted(Kind.DELIVER, codec.MessageEntry(0, 0))]
        for n, (kind, future) in enumerate(zip([Kind.CANCEL, Kind.ACK, Kind.DELIVER, Kind.ACK] * 5, waiting), start=1):
            assert future.result(10) == [accepted(kind, e) for e in entries(*range(10 * n, 10 * n + 3))]
    finally:
        commit.close()
    assert len(log.writes) == 2, "the twenty requests queued behind the first write went in one write"
    second = log.writes[1]
    assert [type(r) for r in second] == [codec.DeliverMessages, codec.AckMessages, codec.CancelMessages], \
        "hand-outs first: an ack queued behind its hand-out is folded after it"  # fmt: skip
    assert sum(len(r.messages) for r in second) == 60  # type: ignore[attr-defined]
    assert all(isinstance(r, codec.DeliverMessages) and r.pending_ms == 30_000 for r in second[:1])


def test_a_write_not_confirmed_fails_every_request_it_carried() -> None:
    log = FakeLog(fail=True)
    commit = GroupCommit(log.write, lambda: FIELDS, "t", 30_000).start()
    try:
        futures = [commit.submit(Kind.ACK, entries(n)) for n in range(5)]
        for future in futures:
            with pytest.raises(CoordinationWriteError):
                future.result(10)
        assert commit.snapshot().failed >= 1
    finally:
        commit.close()


def test_close_writes_what_is_queued_then_refuses_more() -> None:
    log = FakeLog(hold_first=True)
    commit = GroupCommit(log.write, lambda: FIELDS, "t", 30_000).start()
    first = commit.submit(Kind.ACK, entries(1))
    assert log.in_flight.wait(10)
    queued = commit.submit(Kind.ACK, entries(2))
    closer = threading.Thread(target=commit.close)
    closer.start()
    log.release.set()
    closer.join(10)
    assert first.result(0) == [True] and queued.result(0) == [accepted(Kind.ACK, codec.MessageEntry(0, 2))]
    with pytest.raises(RuntimeError, match="closed"):
        commit.submit(Kind.ACK, entries(3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.lists(st.integers(0, 10**6), min_size=1, max_size=50)),
                min_size=1, max_size=30))  # fmt: skip
def test_one_batch_maps_every_request_to_exactly_its_entries_verdicts(requests: list[tuple[Kind, list[int]]]) -> None:
    log = FakeLog()
    commit = GroupCommit(log.write, lambda: FIELDS, "t", 1000)  # not started: one batch written here
    futures = [commit.submit(kind, entries(*offsets)) for kind, offsets in requests]
    commit.write_queued()
    for (kind, offsets), future in zip(requests, futures):
        assert future.result(0) == [accepted(kind, e) for e in entries(*offsets)]
    [records] = log.writes
    kinds = [kind_of(r) for r in records]
    assert kinds == sorted(kinds, key=lambda k: k.value), "deliver, ack, cancel"
    assert sum(len(r.messages) for r in records) == sum(len(o) for _, o in requests)  # type: ignore[attr-defined]


def test_a_huge_batch_is_split_into_records_of_bounded_size() -> None:
    log = FakeLog()
    commit = GroupCommit(log.write, lambda: FIELDS, "t", 1000)
    future = commit.submit(Kind.ACK, entries(*range(MAX_ENTRIES_PER_RECORD * 2 + 5)))
    commit.write_queued()
    assert [len(r.messages) for r in log.writes[0]] == [MAX_ENTRIES_PER_RECORD, MAX_ENTRIES_PER_RECORD, 5]  # type: ignore[attr-defined]
    assert future.result(0) == [accepted(Kind.ACK, e) for e in entries(*range(MAX_ENTRIES_PER_RECORD * 2 + 5))]
