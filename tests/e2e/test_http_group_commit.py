"""The HTTP service's group commit and its reads answered from the lease (docs/http-service.md, "Group commit" and
"Reads without a wait"), end to end with real servers, a real broker and, for the faults, a proxy in front of the
broker that slows or loses the servers' writes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fleet import Fleet, new_fleet
from kafka_proxy import PRODUCE, KafkaProxy
from polling import poll_until
from test_http_service import all_done, call, ids, log_records, read_all, start_server, state_of

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.embedded_broker import EmbeddedBroker, free_port
from marshal_workers.protocol import codec

PARTITIONS = 2
pytestmark = [
    pytest.mark.broker,
    pytest.mark.fleet(name="httpgc", partitions=PARTITIONS, env={"MW_TEST_SHARED": "1"}),
]


def test_sixty_four_concurrent_clients_each_message_handed_to_one_and_acked_once_in_shared_writes(fleet: Fleet) -> None:
    """64 keep-alive clients read one message and ack it, as fast as they can, through one server: each message goes
    to exactly one client (never to two while pending), the log accepts exactly one ack per message, and the writes
    are shared (records that carry the hand-outs or acks of several requests)."""
    total = 1200
    server, url = start_server(fleet, "srv", "--pending-timeout", "30s")
    fleet.produce(range(total))

    async def clients() -> tuple[list[str], list[int]]:
        got: list[str] = []
        statuses: list[int] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

            async def one() -> None:
                idle_since = time.monotonic()
                while time.monotonic() - idle_since < 5:
                    async with session.post(f"{url}/read?timeout=1s&max=1") as response:
                        if response.status != 200:
                            continue
                        messages = (await response.json())["messages"]
                    idle_since = time.monotonic()
                    got.extend(m["value"] for m in messages)
                    async with session.post(f"{url}/ack", json=ids(messages)) as response:
                        statuses.append(response.status)
                        assert await response.json() == {"acked": 1, "already": 0}

            await asyncio.gather(*(one() for _ in range(64)))
        return got, statuses

    got, statuses = asyncio.run(clients())
    assert sorted(got, key=int) == [str(n) for n in range(total)], "each message handed to exactly one client"
    assert statuses == [200] * total
    poll_until(lambda: all_done(fleet, total), timeout=60, what="every range settled")
    state = state_of(fleet)
    assert sum(state.shared_partition(fleet.topic, p).acked for p in range(PARTITIONS)) == total  # type: ignore[union-attr]
    records = [r for r in log_records(fleet) if isinstance(r, codec.MESSAGE_RECORD_TYPES)]
    acks = collections.Counter(
        (e.partition, e.offset) for r in records if isinstance(r, codec.AckMessages) for e in r.messages
    )
    assert len(acks) == total and set(acks.values()) == {1}, "one ack entry per message: none written twice"
    shared = [r for r in records if len(r.messages) > 1]
    assert shared, "concurrent requests shared writes (group commit)"
    assert len(records) < 2 * total, f"{len(records)} message records for {total} reads and {total} acks"
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK


@contextlib.contextmanager
def served_behind_a_proxy(unique: str, tmp_path: Path) -> Iterator[tuple[Fleet, KafkaProxy]]:
    """A fleet on a broker of its own whose every Kafka request goes through a KafkaProxy (Produce slowed by
    ``proxy.delay_s``, or dropped between drop() and resume()); every process stopped at the end."""
    proxy_port = free_port()
    with EmbeddedBroker(advertised=f"127.0.0.1:{proxy_port}") as broker:
        assert broker.port is not None
        proxy = KafkaProxy(proxy_port, broker.port, delay=frozenset({PRODUCE})).start()
        fleet: Fleet | None = None
        try:
            fleet = new_fleet(f"127.0.0.1:{proxy_port}", unique, tmp_path, name="httpfault", partitions=PARTITIONS)
            yield fleet, proxy
        finally:
            if fleet is not None:
                fleet.stop_all()
            proxy.close()


def delivered(fleet: Fleet) -> set[tuple[int, int]]:
    """(partition, offset) of every hand-out in the log."""
    return {
        (e.partition, e.offset) for r in log_records(fleet) if isinstance(r, codec.DeliverMessages) for e in r.messages
    }


def test_kill_9_with_reads_answered_and_their_hand_outs_never_written_delivers_them_again(
    unique: str, tmp_path: Path
) -> None:
    """A server answers reads from its lease before their hand-outs are in the log; here its writes are lost on the
    way (the proxy drops them) and it is killed with -9 before any reaches the broker.  At least once: when its
    lease lapses, another server hands those messages out again, and nothing is lost."""
    total = 20
    with served_behind_a_proxy(unique, tmp_path) as (fleet, proxy):
        fleet.produce(range(total))
        # A lease long enough that the reads below come well inside it, whatever the renewals (lost with the rest).
        first, first_url = start_server(fleet, "srv1", "--pending-timeout", "15s")
        warm: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        # Reads (acked) until the server holds leases with a few messages read from Kafka and not handed out.
        while call(first_url, "/healthz")[1]["buffered"] < 4 and time.monotonic() < deadline:
            batch = read_all(first_url, most=1, wait="1s")
            assert not batch or call(first_url, "/ack", ids(batch))[0] == 200
            warm += batch
        assert call(first_url, "/healthz")[1]["buffered"] >= 4, "the server holds messages to hand out"
        proxy.drop()  # from now on no write of the server reaches the broker
        answered: list[dict[str, Any]] = []
        while len(answered) < 4:
            batch = read_all(first_url, most=4 - len(answered), wait="2s")
            assert batch, "reads of messages the lease holds are answered without their write"
            answered += batch
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        proxy.resume()
        assert not {(m["partition"], m["offset"]) for m in answered} & delivered(fleet), (
            "the hand-outs answered never reached the log"
        )

        second, second_url = start_server(fleet, "srv2", "--pending-timeout", "15s")
        rest: list[dict[str, Any]] = []
        deadline = time.monotonic() + 90  # the first server's leases lapse within the pending timeout (15 s)
        while len(rest) < total - len(warm) and time.monotonic() < deadline:
            batch = read_all(second_url, most=20, wait="1s")
            if batch:
                assert call(second_url, "/ack", ids(batch))[0] == 200
                rest += batch
        values = sorted([m["value"] for m in warm + rest], key=int)
        assert values == [str(n) for n in range(total)], "nothing lost, nothing acked twice"
        assert {m["value"] for m in answered} <= {m["value"] for m in rest}, (
            "what the killed server answered came again"
        )
        poll_until(lambda: all_done(fleet, total), timeout=30, what="every offset done")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == ExitCode.OK


def test_an_ack_through_a_second_server_before_the_hand_out_is_in_the_log_is_accepted_and_never_delivered_again(
    unique: str, tmp_path: Path
) -> None:
    """Each write takes 0.3 s on its way to the broker: a read answered from the first server's lease reaches the
    second server's ack before its hand-out is in the log.  The second server waits for its view of the log, writes
    the ack after the hand-out, and answers 200; the message is done and never handed out again."""
    with served_behind_a_proxy(unique, tmp_path) as (fleet, proxy):
        fleet.produce(range(4))
        first, first_url = start_server(fleet, "srv1")
        second, second_url = start_server(fleet, "srv2")
        warm = poll_until(lambda: read_all(first_url, most=1), timeout=30, what="a first message")
        assert call(first_url, "/ack", ids(warm))[0] == 200
        proxy.delay_s = 0.3
        [message] = poll_until(lambda: read_all(first_url, most=1), timeout=30, what="a message")
        answered_at = time.monotonic()
        status, body = call(second_url, "/ack", ids([message]))
        assert (status, body) == (200, {"acked": 1, "already": 0})
        assert time.monotonic() - answered_at > 0.3, "the ack waited for the hand-out's slow write"
        proxy.delay_s = 0.0
        for url in (first_url, second_url, first_url):
            again = read_all(url, most=10, wait="1s")
            assert message["value"] not in [m["value"] for m in again], "an acked message is never delivered again"
            if again:
                assert call(url, "/ack", ids(again))[0] == 200
        time.sleep(3.5)  # past the pending timeout (3 s): the acked message stays done
        for url in (first_url, second_url):
            again = read_all(url, most=10, wait="1s")
            assert message["value"] not in [m["value"] for m in again]
            if again:
                assert call(url, "/ack", ids(again))[0] == 200
        poll_until(lambda: all_done(fleet, 4), timeout=30, what="every offset done")
        for server in (first, second):
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == ExitCode.OK
