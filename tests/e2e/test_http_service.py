"""The Read / Ack / Cancel service (``marshal-workers serve``, docs/http-service.md), end to end: HTTP clients in
their own processes share a topic with Python workers under the same range leases, with every message accounted
for on a clean run, under kill -9, SIGSTOP past the pending timeout and SIGTERM of a server."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from fleet import Fleet
from polling import poll_until

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_reader import read_group_state
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import WorldState

PARTITIONS = 2
PENDING = "3s"
pytestmark = [
    pytest.mark.broker,
    # A fresh 2-partition topic served over HTTP beside shared Python workers.
    pytest.mark.fleet(
        name="http",
        partitions=PARTITIONS,
        env={"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20", "MW_TEST_PENDING_TIMEOUT": PENDING},
    ),
]


def call(url: str, path: str, body: Any = None, token: str | None = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, method="POST" if path != "/healthz" else "GET")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
            return response.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as error:
        payload = error.read()
        return error.code, json.loads(payload) if payload else None


def start_server(fleet: Fleet, name: str, *args: str) -> tuple[Any, str]:
    process, url = fleet.serve(name, "--range-size", "20", "--pending-timeout", PENDING, *args)

    def up() -> bool:
        try:
            return call(url, "/healthz")[0] == 200
        except OSError:
            return False

    poll_until(up, timeout=60, what=f"server {name} answering")
    return process, url


def ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"topic": m["topic"], "partition": m["partition"], "offset": m["offset"]} for m in messages]


def read_all(url: str, most: int = 100, wait: str = "2s") -> list[dict[str, Any]]:
    status, body = call(url, f"/read?timeout={wait}&max={most}")
    assert status in (200, 204), body
    return body["messages"] if status == 200 else []


def state_of(fleet: Fleet) -> WorldState:
    settings = Settings(
        brokers=fleet.brokers, group=fleet.group, coordination_topic=fleet.coordination_topic, heartbeat_interval=1.0
    )
    return read_group_state(settings, fleet.group)


def all_done(fleet: Fleet, total: int) -> bool:
    state = state_of(fleet)
    marks = [state.shared_partition(fleet.topic, p) for p in range(PARTITIONS)]
    return all(m is not None and m.low == total // PARTITIONS for m in marks)


def acked_twice(fleet: Fleet) -> list[str]:
    counts = collections.Counter(value for _, _, value, _ in fleet.acked_lines())
    return sorted(value for value, n in counts.items() if n > 1)


def handled_after_its_ack(fleet: Fleet) -> list[str]:
    """Values handled again after an ack of them was answered 200: an acked message delivered again."""
    acked_at: dict[str, float] = {}
    for _, _, value, at in fleet.acked_lines():
        acked_at.setdefault(value, at)
    return sorted({line.value for line in fleet.lines() if line.value in acked_at and line.at > acked_at[line.value]})


def test_four_http_clients_and_a_python_worker_share_two_partitions_and_each_message_is_acked_once(
    fleet: Fleet,
) -> None:
    total = 600
    fleet.env["MW_TEST_DELAY"] = "0.01"
    supervisor = fleet.start("py", "--processes", "1")
    fleet.produce(range(total))
    poll_until(lambda: fleet.lines(), timeout=60, what="the Python worker under way")
    server, url = start_server(fleet, "srv")
    clients = [fleet.http_client(f"client{n}", url, MW_CLIENT_DELAY="0.01", MW_CLIENT_MAX="5") for n in range(4)]
    poll_until(lambda: all_done(fleet, total), timeout=120, what="every message done in the log")

    for process in [*clients, supervisor, server]:
        process.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK
    assert supervisor.wait(timeout=60) == ExitCode.OK
    for process in clients:
        assert process.wait(timeout=30) == 0

    counts = fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)], "nothing lost"
    assert [value for value, n in counts.items() if n > 1] == [], "a clean run handles each message once"
    by_client = collections.Counter(line.client for line in fleet.lines())
    assert set(by_client) == {"client0", "client1", "client2", "client3", "py"}, by_client
    http_handled = sum(n for name, n in by_client.items() if name != "py")
    assert len(fleet.acked_lines()) == http_handled and acked_twice(fleet) == []
    state = state_of(fleet)
    for partition in range(PARTITIONS):
        shared = state.shared_partition(fleet.topic, partition)
        assert shared is not None and shared.acked == total // PARTITIONS and shared.lost == 0


def test_a_message_never_acked_comes_back_after_the_pending_timeout_a_cancel_at_once_then_it_is_dead_lettered(
    fleet: Fleet,
) -> None:
    server, url = start_server(fleet, "srv", "--max-deliveries", "3")
    fleet.produce(range(2))
    # A read answers with what is there: the two partitions' first ranges may be leased one read apart.
    first: list[dict[str, Any]] = []
    poll_until(
        lambda: first.extend(read_all(url, most=2 - len(first))) or len(first) >= 2, timeout=30, what="the messages"
    )
    assert sorted(m["value"] for m in first) == ["0", "1"] and {m["deliveries"] for m in first} == {1}
    assert all(m["deadline"] > time.time() * 1000 for m in first)
    assert read_all(url, wait="0") == [], "pending: nobody else gets them"

    keep, give_up = (m for m in sorted(first, key=lambda m: m["value"]))
    status, body = call(url, "/cancel", ids([give_up]))
    assert (status, body) == (200, {"cancelled": 1, "already": 0})
    status, body = call(url, "/cancel", ids([give_up]))
    assert (status, body["error"]) == (409, "not_pending"), "cancelled already: not pending"
    [problem] = body["messages"]
    assert problem["state"] == "cancelled" and "cancelled" in problem["why"], "it was cancelled, not expired"
    again = read_all(url, wait="2s")
    assert [(m["value"], m["deliveries"]) for m in again] == [("1", 2)], "a cancel makes it available at once"

    status, body = call(url, "/ack", ids([keep]))
    assert (status, body) == (200, {"acked": 1, "already": 0})
    status, body = call(url, "/ack", ids([keep]))
    assert (status, body) == (200, {"acked": 0, "already": 1}), "an ack is idempotent"

    # Never acked: after the pending timeout it is handed out again; after its third delivery, dead-lettered.
    third = poll_until(lambda: read_all(url, wait="1s"), timeout=30, what="the message again after its timeout")
    assert [(m["value"], m["deliveries"]) for m in third] == [("1", 3)]
    assert read_all(url, wait="0") == []
    poll_until(lambda: all_done(fleet, 2), timeout=30, what="both offsets done in the log")
    [dead] = fleet.dead_letters(1)  # written before its range was settled
    assert dead.value() == b"1" and dict(dead.headers())["error_type"] == b"MaxDeliveriesExceeded"
    state = state_of(fleet)
    assert sum(state.shared_partition(fleet.topic, p).dead_letters for p in range(PARTITIONS)) == 1  # type: ignore[union-attr]
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK


def log_records(fleet: Fleet) -> list[codec.Record]:
    """Every record of the coordination log (read from the beginning up to its end)."""
    return fleet.coordination_records()


def test_bad_requests_get_a_4xx_with_a_json_error_and_change_nothing_in_the_log(fleet: Fleet, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    server, url = start_server(fleet, "srv", "--token-file", str(token_file))
    fleet.produce(range(2))
    assert call(url, "/read?timeout=1s")[0] == 401, "no token"
    assert call(url, "/read?timeout=1s", token="wrong")[0] == 401
    [message] = poll_until(lambda: read_all_with(url, "s3cret-token"), timeout=30, what="a message")
    topic, partition, offset = message["topic"], message["partition"], message["offset"]
    before = len(log_records(fleet))
    bad: list[tuple[bytes | None, Any, int, str]] = [
        (b"{not json", None, 400, "bad_json"),
        (None, [], 400, "bad_body"),
        (None, [{"topic": topic, "partition": "0", "offset": 0}], 400, "bad_body"),
        (None, [{"topic": topic, "partition": 0, "offset": -1}], 400, "bad_body"),
        (None, [{"topic": "other", "partition": 0, "offset": 0}], 404, "unknown_topic"),
        (None, [{"topic": topic, "partition": 9, "offset": 0}], 404, "unknown_partition"),
        (
            None,
            [{"topic": topic, "partition": partition, "offset": offset + 500}],
            409,
            "not_pending",
        ),  # never delivered
        # One good message with one bad: nothing is acked.
        (
            None,
            [
                {"topic": topic, "partition": partition, "offset": offset},
                {"topic": topic, "partition": 1 - partition, "offset": 999},
            ],
            409,
            "not_pending",
        ),
    ]
    for raw, body, status, error in bad:
        for path in ("/ack", "/cancel"):
            got, answer = call(url, path, body, token="s3cret-token", raw=raw)
            assert (got, answer["error"]) == (status, error), (path, body, answer)
            assert answer["message"]
    for query in ("timeout=soon", "max=0", "max=5000", "timeout=5m", "wait=1s"):
        got, answer = call(url, f"/read?{query}", token="s3cret-token")
        assert got == 400 and answer["error"].startswith("bad_"), (query, answer)
    written = log_records(fleet)[before:]
    # The server renews and settles its ranges meanwhile; nothing about a message is written.
    assert not [r for r in written if isinstance(r, codec.MESSAGE_RECORD_TYPES)], "a bad request wrote to the log"
    time.sleep(max(0.0, message["deadline"] / 1000 - time.time()) + 0.2)  # its pending deadline passes
    status, answer = call(url, "/ack", ids([message]), token="s3cret-token")
    assert (status, answer["error"]) == (409, "not_pending"), "an ack after the deadline"
    assert "s3cret-token" not in fleet.log_of("srv"), "the token is never logged"
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK


def read_all_with(url: str, token: str, wait: str = "1s") -> list[dict[str, Any]]:
    status, body = call(url, f"/read?timeout={wait}&max=1", token=token)
    assert status in (200, 204), body
    return body["messages"] if status == 200 else []


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_server_killed_or_frozen_past_the_pending_timeout_loses_nothing_and_no_acked_message_comes_back(
    fleet: Fleet, fault: str
) -> None:
    """Two servers; clients fail over from the first to the second.  kill -9 (or SIGSTOP past the pending timeout,
    then SIGCONT) of the first mid-run: its leases lapse, the second serves what was pending, and no message a
    client had an ack answered 200 for is delivered again; no message is acked twice."""
    total = 400
    first, first_url = start_server(fleet, "srv1")
    second, second_url = start_server(fleet, "srv2")
    clients = [fleet.http_client(f"client{n}", first_url, second_url, MW_CLIENT_DELAY="0.01") for n in range(3)]
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.acked_lines()) > total // 4, timeout=60, what="a quarter acked")
    if fault == "kill":
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    else:
        first.send_signal(signal.SIGSTOP)
    poll_until(lambda: all_done(fleet, total), timeout=120, what="every message done, served by the second server")
    if fault == "stop":
        first.send_signal(signal.SIGCONT)
        time.sleep(1.0)  # it wakes with lapsed leases: it must hand nothing of them out
    for process in clients:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    counts = fleet.counts()
    assert sorted(counts, key=int) == [str(n) for n in range(total)], "nothing lost"
    assert handled_after_its_ack(fleet) == [], "an acked message is never delivered again"
    assert acked_twice(fleet) == [], "the fold accepts one ack per message"
    for process in (first, second) if fault == "stop" else (second,):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == ExitCode.OK


def test_sigterm_gives_back_at_once_what_no_client_holds_and_takes_acks_while_it_drains(fleet: Fleet) -> None:
    first, first_url = start_server(fleet, "srv1", "--pending-timeout", "20s")
    fleet.produce(range(40))
    held = poll_until(lambda: read_all(first_url, most=3), timeout=30, what="messages")
    first.send_signal(signal.SIGTERM)
    # Still draining (a client holds messages): its acks are taken, nothing more is handed out.
    status, body = call(first_url, "/read?timeout=1s")
    assert (status, body["error"]) == (503, "stopping"), "a read tells a stopping server from an empty topic"
    status, body = call(first_url, "/ack", ids(held))
    assert (status, body) == (200, {"acked": len(held), "already": 0})
    assert first.wait(timeout=30) == ExitCode.OK
    # What it never handed out was given back at once: another server gets it well before the 20 s timeout.
    started = time.monotonic()
    second, second_url = start_server(fleet, "srv2", "--pending-timeout", "20s")
    rest: list[dict[str, Any]] = []
    while len(rest) < 40 - len(held) and time.monotonic() - started < 15:
        batch = read_all(second_url, most=100, wait="1s")
        rest += batch
        if batch:
            assert call(second_url, "/ack", ids(batch))[0] == 200
    assert sorted(int(m["value"]) for m in rest + held) == list(range(40))
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == ExitCode.OK


def test_https_with_a_token_serves_messages_and_the_metrics_of_what_it_did(fleet: Fleet, tmp_path: Path) -> None:
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    issued.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    (tmp_path / "cert.pem").write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    client_tls = ssl.create_default_context()
    authority.configure_trust(client_tls)
    (tmp_path / "token").write_text("tls-token\n")
    server, url = fleet.serve(
        "srv",
        "--tls-cert",
        str(tmp_path / "cert.pem"),
        "--tls-key",
        str(tmp_path / "key.pem"),
        "--token-file",
        str(tmp_path / "token"),
    )
    url = url.replace("http://", "https://")

    def https(method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data if method == "POST" else None, method=method)
        request.add_header("Authorization", "Bearer tls-token")
        try:
            with urllib.request.urlopen(request, timeout=30, context=client_tls) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def up() -> bool:
        try:
            return https("GET", "/healthz")[0] == 200
        except OSError:
            return False

    poll_until(up, timeout=60, what="the HTTPS server answering")
    fleet.produce(range(3))

    def read() -> list[dict[str, Any]]:
        status, body = https("POST", "/read?max=5&timeout=1s")
        return json.loads(body)["messages"] if status == 200 else []

    messages = poll_until(read, timeout=30, what="messages over HTTPS")
    status, body = https("POST", "/ack", ids(messages))
    assert (status, json.loads(body)) == (200, {"acked": len(messages), "already": 0})
    with pytest.raises(OSError):  # plain HTTP to the TLS port
        urllib.request.urlopen(url.replace("https://", "http://") + "/healthz", timeout=5)
    status, metrics = https("GET", "/metrics")
    text = metrics.decode()
    assert status == 200
    assert (
        f'marshal_workers_shared_messages_total{{group="{fleet.group}",outcome="handled",topic="{fleet.topic}"}} '
        f"{float(len(messages))}" in text
    )
    assert 'route="/ack",status="200"' in text and "marshal_workers_serve_pending_messages" in text
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK


def test_an_ack_or_a_cancel_may_reach_any_server_of_the_group(fleet: Fleet) -> None:
    first, first_url = start_server(fleet, "srv1", "--pending-timeout", "20s")
    second, second_url = start_server(fleet, "srv2", "--pending-timeout", "20s")
    fleet.produce(range(4))
    held: list[dict[str, Any]] = []
    poll_until(
        lambda: held.extend(read_all(first_url, most=4, wait="1s")) or len(held) == 4,
        timeout=30,
        what="every message from the first server",
    )
    assert sorted(m["value"] for m in held) == ["0", "1", "2", "3"]
    keep, give_back = held[:3], held[3]
    # A cancel sent to the second server: the first hands the message out again at once (not after 20 s).
    assert call(second_url, "/cancel", ids([give_back]))[0] == 200
    again = poll_until(lambda: read_all(first_url, wait="1s"), timeout=10, what="the cancelled message again")
    assert [(m["offset"], m["deliveries"]) for m in again] == [(give_back["offset"], 2)]
    # Acks sent to the second server settle the first server's ranges: every offset done in the log.
    status, body = call(second_url, "/ack", ids(keep + again))
    assert (status, body) == (200, {"acked": 4, "already": 0})
    poll_until(lambda: all_done(fleet, 4), timeout=30, what="the first server's ranges settled")
    assert call(first_url, "/ack", ids(keep))[1] == {"acked": 0, "already": 3}
    for server in (first, second):
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == ExitCode.OK


def test_a_hundred_concurrent_long_polls_share_fifty_messages_each_handed_out_once(fleet: Fleet) -> None:
    server, url = start_server(fleet, "srv", "--pending-timeout", "30s")

    async def poll_all() -> list[tuple[int, list[dict[str, Any]]]]:
        async with aiohttp.ClientSession() as session:  # keep-alive connections, as a client library would

            async def one() -> tuple[int, list[dict[str, Any]]]:
                async with session.post(f"{url}/read?timeout=4s&max=1") as response:
                    body = await response.json() if response.status == 200 else {"messages": []}
                    return response.status, body["messages"]

            polls = [asyncio.ensure_future(one()) for _ in range(100)]
            await asyncio.sleep(1.0)  # every poll is waiting before a message exists
            await asyncio.get_running_loop().run_in_executor(None, fleet.produce, range(50))
            return await asyncio.gather(*polls)

    answers = asyncio.run(poll_all())
    got = [message["value"] for status, messages in answers if status == 200 for message in messages]
    assert sorted(got, key=int) == [str(n) for n in range(50)], "each message to exactly one poll"
    assert sorted(status for status, _ in answers) == [200] * 50 + [204] * 50
    assert call(url, "/ack", ids([m for _, messages in answers for m in messages]))[1] == {"acked": 50, "already": 0}
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK


def test_a_server_obeys_admin_drain_and_shutdown_like_a_supervisor(fleet: Fleet) -> None:
    total = 300
    first, first_url = start_server(fleet, "srv1")
    fleet.http_client("client1", first_url, MW_CLIENT_DELAY="0.01")
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.acked_lines()) > 30, timeout=60, what="messages acked through the first server")
    drained = fleet.run("admin", "drain", "--client", "srv1")
    assert drained.returncode == 0, drained.stdout + drained.stderr  # it follows the log until srv1 holds nothing
    done_before = len(fleet.acked_lines())
    time.sleep(1.0)
    assert len(fleet.acked_lines()) == done_before, "a drained server hands nothing more out"
    second, second_url = start_server(fleet, "srv2")
    fleet.http_client("client2", second_url, MW_CLIENT_DELAY="0.01")
    poll_until(lambda: all_done(fleet, total), timeout=60, what="the rest served by the second server")
    assert sorted(fleet.counts(), key=int) == [str(n) for n in range(total)]
    assert handled_after_its_ack(fleet) == [] and acked_twice(fleet) == []
    ordered = fleet.run("admin", "shutdown", "--client", "srv1")
    assert ordered.returncode == 0, ordered.stdout + ordered.stderr
    assert first.wait(timeout=30) == ExitCode.OK, "an admin shutdown ends a server as SIGTERM does"
    assert "an operator ordered a shutdown" in fleet.log_of("srv1")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == ExitCode.OK


def test_a_partition_gone_with_its_topic_deleted_and_created_again_is_unknown_not_pending(fleet: Fleet) -> None:
    """The served topic's partitions are followed as the cluster has them: an ack of a partition the topic no
    longer has answers 404 unknown_partition (the server took its partition count at start-up only, and answered
    409 not_pending, state unknown, as for a message never handed out)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    server, url = start_server(fleet, "srv")
    gone = [{"topic": fleet.topic, "partition": 1, "offset": 0}]
    assert call(url, "/ack", gone)[1]["error"] == "not_pending", "partition 1 exists: its offset 0 is not pending"
    admin = AdminClient({"bootstrap.servers": fleet.brokers})
    admin.delete_topics([fleet.topic])[fleet.topic].result(timeout=30)
    poll_until(lambda: fleet.topic not in admin.list_topics(timeout=10).topics, what="the topic deleted")
    admin.create_topics([NewTopic(fleet.topic, 1, 1)])[fleet.topic].result(timeout=30)

    def partition_unknown() -> bool:
        status, answer = call(url, "/ack", gone)
        return status == 404 and answer["error"] == "unknown_partition"

    poll_until(partition_unknown, timeout=60, what="an ack of partition 1 answered 404 unknown_partition")
    assert f"{fleet.topic} now has 1 partitions (was 2): it was deleted and created again" in fleet.log_of("srv")
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == ExitCode.OK
