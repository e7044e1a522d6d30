"""``marshal-workers dlq list`` and ``dlq redrive`` on a real dead-letter topic, per group (issue 25)."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import Fleet
from polling import poll_until
from processes import run_cli
from test_observability import scrape, total

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.embedded_broker import free_port
from marshal_workers.protocol.dead_letter_groups import CLIENT_ID_HEADER, GROUP_HEADER, REDRIVEN_FOR_HEADER

pytestmark = pytest.mark.broker


def dlq(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("dlq", *args, "--brokers", fleet.brokers, "--topic", fleet.topic)


def test_dead_letters_are_listed_by_error_type_and_redriven_once_to_their_topic(fleet: Fleet) -> None:
    fleet.env["MW_TEST_FAIL_VALUE"] = "13"
    failing = fleet.start("failing")
    fleet.produce(range(40), headers=[("traceparent", b"00-aa")])
    poll_until(lambda: len(fleet.counts()) == 39, what="every other message")
    fleet.dead_letters(1)
    failing.send_signal(signal.SIGTERM)
    assert failing.wait(timeout=30) == ExitCode.OK

    listed = dlq(fleet, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = orjson.loads(listed.stdout)["error_types"]
    assert (row["error_type"], row["count"], row["from_topics"]) == ("ValueError", 1, [fleet.topic])

    refused = dlq(fleet, "redrive", "--to", "no-such-topic-anywhere")
    assert refused.returncode == ExitCode.UNKNOWN_TOPIC and "nothing sent" in refused.stderr
    dry = dlq(fleet, "redrive", "--to", "no-such-topic-anywhere", "--dry-run")
    assert dry.returncode == ExitCode.UNKNOWN_TOPIC, "a dry run checks what the real run checks"
    assert "no-such-topic-anywhere does not exist" in dry.stderr and "would send" not in dry.stdout
    assert dlq(fleet, "redrive", "--error-type", "KeyError").stdout.startswith("nothing to send")
    sent = dlq(fleet, "redrive", "--error-type", "ValueError")
    assert sent.returncode == 0 and f"sent 1 dead letters of {fleet.topic}.dlq to {fleet.topic}" in sent.stdout

    del fleet.env["MW_TEST_FAIL_VALUE"]  # the handler is fixed: it handles the redriven message, once
    fleet.start("fixed")
    poll_until(lambda: "13" in fleet.counts(), what="the redriven message")
    assert fleet.counts()["13"] == 1 and len(fleet.counts()) == 40
    assert max(fleet.counts().values()) == 1, "nothing else was sent again"


def progress(fleet: Fleet) -> dict[int, int | None]:
    """Where the group stands on each partition, as ``status`` says: the resume offset of a partition, the
    low-water mark of a shared one."""
    document = fleet.status_document()
    found = {row["partition"]: row["offset"] for row in document["partitions"]}
    return found | {row["partition"]: row["low_water_mark"] for row in document.get("shared", [])}


def progress_if_at(fleet: Fleet, total_messages: int) -> dict[int, int | None] | None:
    """The group's progress once it adds up to ``total_messages`` (then it is at the end of every partition)."""
    found = progress(fleet)
    return found if sum(offset or 0 for offset in found.values()) == total_messages else None


def counted(port: int, name: str) -> float:
    """The messages counted as passed by for another group on a metrics endpoint (0 while it does not answer)."""
    try:
        return total(scrape(port), name, outcome="other_group")
    except OSError:
        return 0


def test_two_groups_on_one_topic_each_get_back_only_their_own_dead_letters(fleet: Fleet, tmp_path: Path) -> None:
    """Groups A and B read one topic and dead-letter their own failures (13 fails in both) to the one
    ``<topic>.dlq``; each letter names its group and client; ``--group A`` lists and redrives A's alone, and only A
    handles them again: B passes them by (counted) and its progress still reaches the end of every partition."""
    a = fleet
    b = replace(
        fleet,
        group=f"{fleet.group}-b",
        coordination_topic=f"{fleet.coordination_topic}-b",
        sink=tmp_path / "sink-b.txt",
        env={},
        processes={},
        logs={},
    )
    try:
        a.start("a-1", MW_TEST_FAIL_VALUES="3,13")
        b.start("b-1", MW_TEST_FAIL_VALUES="13,21")
        fleet.produce(range(40))
        poll_until(lambda: len(a.counts()) == 38 and len(b.counts()) == 38, what="every other message, in each group")
        written = sorted(
            (d.value().decode(), dict(d.headers())[GROUP_HEADER].decode(), dict(d.headers())[CLIENT_ID_HEADER].decode())
            for d in fleet.dead_letters(4)
        )
        assert written == sorted(
            [("3", a.group, "a-1"), ("13", a.group, "a-1"), ("13", b.group, "b-1"), ("21", b.group, "b-1")]
        )

        for group in (a.group, b.group):
            listed = dlq(fleet, "list", "--json", "--group", group)
            assert listed.returncode == 0, listed.stderr
            document = orjson.loads(listed.stdout)
            assert [(r["error_type"], r["count"]) for r in document["error_types"]] == [("ValueError", 2)]
            assert sorted((g["group"], g["count"]) for g in document["groups"]) == [(a.group, 2), (b.group, 2)]
        shown = dlq(fleet, "list", "--group", a.group).stdout
        assert f"{fleet.topic}.dlq: 2 dead letters of group {a.group}" in shown and "ValueError: 2" in shown

        # Both handlers fixed.  Only A's letters go back: A handles them once; B passes them by.
        for member, name in ((a, "a-1"), (b, "b-1")):
            member.processes[name].send_signal(signal.SIGTERM)
            assert member.processes[name].wait(timeout=30) == ExitCode.OK
        port = free_port()
        a.start("a-2")
        b.start("b-2", "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
        assert dlq(fleet, "redrive", "--group", a.group, "--dry-run").stdout.startswith("would send 2 of 4")
        sent = dlq(fleet, "redrive", "--group", a.group)
        assert sent.returncode == 0, sent.stderr
        assert f"sent 2 dead letters of {fleet.topic}.dlq to {fleet.topic} for group {a.group}" in sent.stdout
        poll_until(lambda: a.counts()["3"] == 1 and a.counts()["13"] == 1, what="group A handling its letters again")
        poll_until(lambda: counted(port, "marshal_workers_handler_outcomes_total") == 2, what="B passing them by")
        # Every partition's end: where A's progress stands once it has handled all 42 messages (40, 2 redriven).
        end = poll_until(lambda: progress_if_at(a, 42), what="A at the end")
        poll_until(lambda: progress(b) == end, timeout=60, what="group B's progress past them, to every end")

        assert len(a.counts()) == 40 and max(a.counts().values()) == 1, "A: every message once, its letters included"
        assert sorted(b.counts(), key=int) == [str(n) for n in range(40) if n not in (13, 21)], "B: A's not again"
        assert max(b.counts().values()) == 1
        assert sum(g["count"] for g in orjson.loads(dlq(fleet, "list", "--json").stdout)["groups"]) == 4
    finally:
        b.stop_all()


RUNNERS = {
    "plain": {},
    "batch": {"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "50"},
    "amo": {"MW_TEST_MODE": "amo", "MW_TEST_BATCH_SIZE": "10"},
    "lanes": {"MW_TEST_CONCURRENCY": "4"},
    "amo-lanes": {"MW_TEST_MODE": "amo", "MW_TEST_CONCURRENCY": "4", "MW_TEST_BATCH_SIZE": "10"},
    "shared": {"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "20"},
    "serve": {},
}


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_every_runner_passes_by_messages_redriven_for_another_group(fleet: Fleet, runner: str) -> None:
    """Messages redriven for another group are never handled, are counted, and never hold progress back, even
    last in a partition; messages redriven for this group, or for none, are handled once."""
    if runner == "serve":
        # Two partitions, as the HTTP service's own tests: with eight, a server whose readers keep waiting may hold
        # max_leases ranges at the ends of partitions it read whole and claim no other (its claim policy, not
        # this test's concern).
        fleet.topic, fleet.partitions = f"{fleet.topic}-serve", 2
        admin = AdminClient({"bootstrap.servers": fleet.brokers})
        admin.create_topics([NewTopic(fleet.topic, num_partitions=2, replication_factor=1)])[fleet.topic].result(10)
    fleet.env |= RUNNERS[runner]
    other, ours = [(REDRIVEN_FOR_HEADER, b"another-group")], [(REDRIVEN_FOR_HEADER, fleet.group.encode())]
    fleet.produce(range(40))
    fleet.produce(range(40, 80), headers=other)
    fleet.produce(range(80, 120), headers=ours)
    fleet.produce(range(120, 160), headers=other)  # last in every partition
    if runner == "serve":
        _, url = fleet.serve("server", "--range-size", "20")
        fleet.http_client("client", url)
        port, metric = int(url.rsplit(":", 1)[1]), "marshal_workers_shared_messages_total"
    else:
        port, metric = free_port(), "marshal_workers_handler_outcomes_total"
        fleet.start("only", "--processes", "2", "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")

    every_end = {p: 160 // fleet.partitions for p in range(fleet.partitions)}
    poll_until(lambda: progress(fleet) == every_end, timeout=60, what="progress to the end of every partition")
    poll_until(lambda: counted(port, metric) == 80, what="80 messages passed by, counted")
    assert sorted(fleet.counts(), key=int) == [str(n) for n in [*range(40), *range(80, 120)]]
    assert max(fleet.counts().values()) == 1
