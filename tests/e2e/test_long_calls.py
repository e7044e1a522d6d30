"""A long handler call is not a stall (issue 25): a handler taking several heartbeats per message keeps its
partition, and ``status``, ``/state`` and the metrics show the call in flight with its age."""

from __future__ import annotations

import pytest
from fleet import Fleet
from polling import poll_until
from test_observability import probe, scrape, total

from marshal_workers.kafka.embedded_broker import free_port

HB_S = 1.0
CALL_S = 3.5  # three and a half heartbeats per message: before, "stalled (lag 3): handing it over" at each one
MESSAGES = 3
pytestmark = [
    pytest.mark.broker,
    # A fresh 1-partition topic whose handler takes CALL_S per message, run by supervisors with a 1 s HB.
    pytest.mark.fleet(name="slow", partitions=1, env={"MW_TEST_DELAY": str(CALL_S)}, heartbeat=f"{HB_S:g}s"),
]


@pytest.mark.parametrize("runner", ["plain", "batch", "lanes"])
def test_a_handler_taking_several_heartbeats_per_message_keeps_its_partition(fleet: Fleet, runner: str) -> None:
    """Two members, the default settings (release_if_behind on): every message handled once, by one worker of one
    member, and no member ever hands the partition over; meanwhile every view shows the call in flight."""
    fleet.env |= {
        "plain": {},  # one call at a time: the worker publishes the message in hand, the supervisor dates it
        "batch": {"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "1"},  # a timed call: the worker publishes its start
        "lanes": {"MW_TEST_CONCURRENCY": "2"},  # calls on lanes: the oldest one's start
    }[runner]
    ports = {"a": free_port(), "b": free_port()}
    for client, port in ports.items():
        fleet.start(client, "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
    fleet.produce(range(MESSAGES))

    # While a call runs, longer than an HB: status (the owner's heartbeat), /state and the metrics show it.
    row = poll_until(lambda: _long_call(fleet.status_rows()[0]), timeout=60, what="status showing a long call")
    owner = row["client"]
    assert row["in_flight"] >= 1 and row["state"] == "fresh"
    state = poll_until(lambda: _long_call(_state_row(ports[owner])), timeout=30, what="/state showing a long call")
    assert state["in_flight"] >= 1, "a call in flight is one, not 0"
    samples = scrape(ports[owner])
    assert total(samples, "marshal_workers_partition_call_age_seconds", topic=fleet.topic) >= HB_S
    assert total(samples, "marshal_workers_partition_in_flight", topic=fleet.topic) >= 1

    poll_until(lambda: len(fleet.lines()) >= MESSAGES, timeout=MESSAGES * CALL_S + 60, what="every message")
    lines = fleet.lines()
    assert sorted(line.value for line in lines) == [str(n) for n in range(MESSAGES)], "each message exactly once"
    assert {(line.client, line.pid) for line in lines} == {(owner, lines[0].pid)}, "one worker of one member did all"
    final = poll_until(
        lambda: (r := fleet.status_rows()[0])["offset"] == MESSAGES and r, what="the heartbeat after the last message"
    )
    assert (final["client"], final["state"]) == (owner, "fresh"), "the partition never changed hands"
    for client in ports:
        log = fleet.log_of(client)
        assert "handing it over" not in log and "released" not in log, f"{client} gave the partition up:\n{log}"


def _long_call(row: dict | None) -> dict | None:
    """The row if it shows a call in flight for more than an HB."""
    if row is None or not row.get("in_flight") or (row.get("call_age_s") or 0) < HB_S:
        return None
    return row


def _state_row(port: int) -> dict | None:
    """The partition's entry in a supervisor's /state, if it holds it."""
    answer = probe(port, "/state")
    partitions = [] if answer is None else answer[1]["partitions"]
    return partitions[0] if partitions else None
