"""A held range's pick (http/served_lease.py ServedLease.pick) looks from where the last one stopped instead of stepping
over every pending message again; whatever happens meanwhile, it picks exactly what a scan of every message would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from property_runs import examples

from marshal_workers.http.served_lease import ServedLease

MAX_DELIVERIES = 3
PENDING_MS = 50

# What a server does to a range between picks (served_topic.py): hand out what was picked (or have it refused:
# free again), ack, cancel (free again), dead-letter, read more messages, let time pass.
Step = st.one_of(
    st.tuples(st.just("pick"), st.integers(1, 8)),
    st.tuples(st.just("ack"), st.integers(0, 39)),
    st.tuples(st.just("cancel"), st.integers(0, 39)),
    st.tuples(st.just("dead"), st.integers(0, 39)),
    st.tuples(st.just("fetch"), st.integers(1, 10)),
    st.tuples(st.just("wait"), st.integers(1, 80)),
    st.tuples(st.just("refuse"), st.just(0)),
)


def every_message_scan(held: ServedLease, most: int, now: int) -> list[int]:
    """The pick without a cursor: every message in offset order."""
    return [
        offset
        for offset in held.messages
        if held.eligible(offset, now) and held.tries + held.handed.get(offset, 0) < MAX_DELIVERIES
    ][:most]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(Step, min_size=1, max_size=60), st.integers(0, 2))
def test_the_pick_with_a_cursor_picks_what_a_scan_of_every_message_picks(
    steps: list[tuple[str, int]], tries: int
) -> None:
    held = ServedLease(partition=0, start=0, end=40, tries=tries, deadline_ms=10**9, fetched_to=0)
    now = 1000
    reserved: list[int] = []  # picked, not yet answered
    for kind, arg in steps:
        if kind == "pick":
            expected = every_message_scan(held, arg, now)
            assert held.pick(arg, now, MAX_DELIVERIES) == expected
            reserved += expected
            for offset in reserved[: len(reserved) // 2]:  # some answered now, the rest after the next steps
                held.handed_until(offset, now + PENDING_MS)
                held.handed[offset] = held.handed.get(offset, 0) + 1
            reserved = reserved[len(reserved) // 2 :]
        elif kind == "refuse" and reserved:  # a hand-out the log refused: free again
            offset = reserved.pop()
            held.reserved.discard(offset)
            held.free_again(offset)
        elif kind == "ack" and arg in held.messages and arg not in held.reserved:
            held.acked.add(arg)
            held.messages.pop(arg)
        elif kind == "cancel" and held.pending_until.get(arg, 0) > now:
            held.pending_until[arg] = 0
            held.free_again(arg)
        elif kind == "dead" and arg in held.messages and arg not in held.reserved:
            held.dead.add(arg)
            held.messages.pop(arg)
        elif kind == "fetch":
            for offset in range(held.fetched_to, min(held.end, held.fetched_to + arg)):
                if offset % 7 != 3:  # some offsets have no message (a transaction marker, another group's)
                    held.messages[offset] = f"message {offset}"
            held.fetched_to = min(held.end, held.fetched_to + arg)
        elif kind == "wait":
            now += arg
    expected = every_message_scan(held, 40, now)
    assert held.pick(40, now, MAX_DELIVERIES) == expected


def test_a_read_steps_over_pending_messages_once_not_at_every_pick() -> None:
    held = ServedLease(
        partition=0,
        start=0,
        end=1000,
        tries=0,
        deadline_ms=10**9,
        fetched_to=1000,
        messages={offset: offset for offset in range(1000)},
    )
    for offset in range(1000):
        [picked] = held.pick(1, 0, MAX_DELIVERIES)
        assert picked == offset
        held.handed_until(picked, 30_000)
        assert held.scan_from == offset + 1, "the next pick starts after the message just handed out"
    assert held.pick(1, 29_999, MAX_DELIVERIES) == []
    assert held.pick(1, 30_000, MAX_DELIVERIES) == [0], "once the deadlines pass, the pick looks from the start"


def test_a_message_still_pending_when_the_pick_looked_again_from_the_start_is_picked_when_its_deadline_passes() -> None:
    held = ServedLease(
        partition=0, start=0, end=3, tries=0, deadline_ms=10**9, fetched_to=3, messages={0: "a", 1: "b", 2: "c"}
    )
    assert held.pick(2, 0, MAX_DELIVERIES) == [0, 1]
    held.handed_until(0, 50)
    held.handed_until(1, 70)
    assert held.pick(1, 50, MAX_DELIVERIES) == [0], "0's deadline passed: looked from the start"
    held.handed_until(0, 1050)
    assert held.pick(1, 60, MAX_DELIVERIES) == [2]
    held.handed_until(2, 1060)
    assert held.pick(1, 70, MAX_DELIVERIES) == [1], "1 was pending when the pick passed it; its deadline is now"
