"""app.send: handlers that produce, run by real supervisors on a real broker.

The application (tests/apps/send_app.py) writes a line per handled input to the sink, then sends the input's
value to an output topic.  At least once promises that no output is lost, even under kill -9, and that an
output is repeated only when its input was handled again.
"""

from __future__ import annotations

import collections
import os
import signal
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import Fleet
from polling import poll_until
from processes import pid_gone, process_group

from marshal_workers.core.exit_codes import ExitCode

pytestmark = pytest.mark.broker

PARTITIONS = 8


@pytest.fixture
def output(fleet: Fleet, unique: str) -> Iterator[str]:
    """The output topic, and the fleet set to run the sending app into it."""
    topic = f"out-{unique}"
    admin = AdminClient({"bootstrap.servers": fleet.brokers})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(10)
    fleet.app = "send_app:app"
    fleet.env["MW_TEST_OUTPUT"] = topic
    yield topic


def read_outputs(brokers: str, topic: str) -> list[tuple[str, dict[str, bytes]]]:
    """Every message of ``topic`` (value, headers), read to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "output-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found: list[tuple[str, dict[str, bytes]]] = []
    at_end: set[int] = set()
    try:
        while len(at_end) < PARTITIONS:
            message = poll_until(lambda: consumer.poll(0.5), timeout=30, what="the output topic to be read")
            error = message.error()
            if error is None:
                at_end.discard(message.partition())
                found.append((message.value().decode(), dict(message.headers() or [])))
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
    finally:
        consumer.close()
    return found


def stop(fleet: Fleet, client_id: str) -> None:
    """SIGTERM: every worker finishes, flushes what it sent, and releases its partition."""
    process = fleet.processes[client_id]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == ExitCode.OK


def test_no_output_is_lost_when_the_supervisor_and_its_workers_are_killed(fleet: Fleet, output: str) -> None:
    total = 2000
    # Outputs linger 200 ms in the producer: without the flush before progress, heartbeats would carry inputs
    # whose outputs were still in a killed worker's memory.
    fleet.env |= {"MW_TEST_DELAY": "0.002", "MARSHAL_WORKERS_KAFKA_PRODUCER_LINGER_MS": "200"}
    doomed = fleet.start("doomed")
    poll_until(lambda: len(fleet.worker_pids("doomed")) == PARTITIONS, what="8 workers")
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) > total // 4, what="handling to be under way")

    members = process_group(doomed.pid)
    os.killpg(doomed.pid, signal.SIGKILL)  # the supervisor, its fork server and its workers at once
    doomed.wait(timeout=10)
    poll_until(lambda: all(pid_gone(pid) for pid in members), timeout=10, what="the whole process group to die")
    assert len(fleet.counts()) < total, "the kill landed before everything was handled"

    fleet.start("next")
    poll_until(lambda: len(fleet.counts()) == total, timeout=60, what="every input (at least once)")
    stop(fleet, "next")

    handled = fleet.counts()
    sent = collections.Counter(value for value, _ in read_outputs(fleet.brokers, output))
    assert sorted(handled, key=int) == [str(n) for n in range(total)]
    assert sorted(set(handled) - set(sent), key=int) == [], "no output lost"
    assert {v: n for v, n in sent.items() if n > handled[v]} == {}, "an output repeated only with its input"
    assert set(sent) <= set(handled)


@pytest.mark.parametrize("kind", ["def", "async"])
def test_handlers_on_lanes_send_their_output(fleet: Fleet, output: str, kind: str) -> None:
    total = 400
    fleet.env |= {"MW_TEST_CONCURRENCY": "8", "MW_TEST_DELAY": "0.005", "MW_TEST_ASYNC": str(int(kind == "async"))}
    fleet.start("lanes")
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) == total, timeout=60, what="every input")
    stop(fleet, "lanes")

    outputs = read_outputs(fleet.brokers, output)
    assert sorted(value for value, _ in outputs) == sorted(str(n) for n in range(total)), "each output once"
    by_value = {line.value: f"{line.partition}:{line.offset}".encode() for line in fleet.lines()}
    assert all(headers["from"] == by_value[value] for value, headers in outputs), "headers kept"


RUNNERS = {
    "alo-batch": ({"MW_TEST_BATCH": "1", "MW_TEST_BATCH_SIZE": "20"}, ()),
    "amo": ({"MW_TEST_MODE": "amo", "MW_TEST_BATCH_SIZE": "20"}, ()),
    "shared": ({"MW_TEST_SHARED": "1", "MW_TEST_RANGE_SIZE": "25"}, ("--processes", "2")),
}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_sends_each_output_once_on_a_clean_run(fleet: Fleet, output: str, runner: str) -> None:
    total = 400
    env, args = RUNNERS[runner]
    fleet.env |= env
    fleet.start("only", *args)
    fleet.produce(range(total))
    poll_until(lambda: len(fleet.counts()) == total, timeout=60, what="every input")
    stop(fleet, "only")

    assert sorted(value for value, _ in read_outputs(fleet.brokers, output)) == sorted(str(n) for n in range(total))


def test_a_send_kafka_does_not_confirm_crashes_the_worker_before_its_progress(fleet: Fleet, unique: str) -> None:
    fleet.app = "send_app:app"
    # A topic name no broker accepts: every delivery fails ("Broker: Invalid topic").  (A missing topic would not
    # do: the embedded broker creates it on first use, sometimes fast enough for the send to succeed.)
    fleet.env |= {"MW_TEST_OUTPUT": f"no such topic {unique}!"}
    fleet.start("only")
    fleet.produce(range(1))  # one input, on partition 0
    poll_until(lambda: fleet.counts()["0"] >= 2, timeout=30, what="the input to be handled again after the crash")
    log = fleet.log_of("only")
    assert "was not confirmed" in log and "exited with code 8" in log
    assert fleet.status_rows()[0]["offset"] in (None, 0), "no progress past the input whose output failed"
