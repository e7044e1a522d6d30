"""A supervisor's start-up does not pay for other groups, and a stop signal ends it at once (issue 25).

A new group on a coordination topic that another group has filled: the other group's 300,000 old records sit on
the coordination partition of the new group's topic.  Before any checkpoint says which groups wrote there, the new
group's supervisor must read them all: it says how far it got while it reads, and a SIGTERM or SIGINT meanwhile
stops it at once, exit 0.  Once a supervisor of the other group has read them and written its checkpoints (with
their directory of groups), the new group's supervisor starts at them: it reads a few records,
claims its partitions, and ``status`` answers for it, and for a group nobody knows, after reading a few records
too.  A supervisor that waits for a broker that does not answer stops at once too.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import HB, Fleet
from polling import poll_until
from processes import cmdline, group_command, process_group, run_command

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.reader_start import find_starts
from marshal_workers.protocol import codec

pytestmark = pytest.mark.broker

HISTORY = 300_000  # the other group's records on the new group's coordination partition: 30 times the bound below
STATUS_READS_AT_MOST = 10_000  # what a reader starting at a checkpoint reads (the records since), far below HISTORY


def write_history(brokers: str, coordination_topic: str, partition: int, group: str, topic: str, count: int) -> None:
    """Another group's past on one coordination partition: an old owner's claims of ``topic``'s 2 partitions and
    ``count`` heartbeats, from a week ago (raw records, batched: fast)."""
    producer = Producer(
        {
            "bootstrap.servers": brokers,
            "linger.ms": 50,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    long_ago = int(time.time() * 1000) - 7 * 86_400_000
    common = {"v": 1, "group": group, "client": "old-host", "instance": "old-1"}
    values = [codec.encode(codec.Claim(**common, ts=long_ago, topic=topic, partition=p)) for p in range(2)]
    beats = [
        codec.encode(codec.Heartbeat(**common, ts=long_ago + 1, topic=topic, partition=p, offset=0)) for p in range(2)
    ]
    values += [beats[n % 2] for n in range(count - 2)]
    for value in values:
        while True:
            try:
                producer.produce(coordination_topic, value, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def topic_routed_to(partition: int, count: int, prefix: str) -> str:
    """A topic name whose records go to coordination partition ``partition`` (md5 routing)."""
    return next(
        f"{prefix}-{n}" for n in range(10_000) if codec.coordination_partition(f"{prefix}-{n}", count) == partition
    )


def records_read_at_start(log: str) -> int:
    found = re.findall(r"ready on \S+ \(\d+ partitions; read (\d+) records", log)
    assert found, log
    return int(found[-1])


def status(brokers: str, coordination_topic: str, group: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``marshal-workers status`` at debug level: its log says how many coordination records it read."""
    where = {"brokers": brokers, "group": group, "coordination_topic": coordination_topic}
    command = group_command("status", *args, **where)
    return run_command([*command, "--heartbeat-interval", HB, "--log-level", "debug"], timeout=120)


def records_status_read(result: subprocess.CompletedProcess[str]) -> int:
    found = re.findall(r"read (\d+) records of \S+,", result.stderr)
    assert found, result.stderr
    return int(found[-1])


def test_a_new_groups_start_up_beside_another_groups_long_history(
    kafka_brokers: str, unique: str, tmp_path: Path
) -> None:
    coordination_topic = f"__marshal-{unique}"
    with Coordinator(
        Settings(brokers=kafka_brokers, group=f"setup-{unique}", coordination_topic=coordination_topic)
    ) as c:
        count = c.partition_count  # creates the coordination topic (8 partitions)
    new = Fleet(
        brokers=kafka_brokers,
        group=f"new-{unique}",
        topic=f"new-{unique}",
        coordination_topic=coordination_topic,
        sink=tmp_path / "new.txt",
        partitions=4,
    )
    home = codec.coordination_partition(new.topic, count)
    busy = Fleet(
        brokers=kafka_brokers,
        group=f"busy-{unique}",
        topic=topic_routed_to(home, count, f"busy-{unique}"),
        coordination_topic=coordination_topic,
        sink=tmp_path / "busy.txt",
        partitions=2,
        env={"MARSHAL_WORKERS_CHECKPOINT_INTERVAL": "1s"},
    )
    admin = AdminClient({"bootstrap.servers": kafka_brokers})
    for fleet in (new, busy):
        admin.create_topics([NewTopic(fleet.topic, num_partitions=fleet.partitions, replication_factor=1)])[
            fleet.topic
        ].result(10)
    try:
        began = time.monotonic()
        write_history(kafka_brokers, coordination_topic, home, busy.group, busy.topic, HISTORY)
        print(f"{HISTORY} records of {busy.group} written in {time.monotonic() - began:.1f}s")

        # 1. No checkpoint says who wrote there: the new group's supervisor reads it all, saying how far it got,
        #    and a SIGTERM (Ctrl-C: SIGINT) meanwhile stops it at once.
        for name, signum in (("a", signal.SIGTERM), ("a2", signal.SIGINT)):
            first = new.start(name)
            poll_until(
                lambda: re.search(r"looking further back|records of \S+ so far", new.log_of(name)),  # noqa: B023
                timeout=120,
                what=f"{name}'s first progress line",
            )
            signalled = time.monotonic()
            first.send_signal(signum)
            assert first.wait(timeout=30) == ExitCode.OK
            print(f"{name}: exited {time.monotonic() - signalled:.2f}s after {signum.name} during its start-up")
            log = new.log_of(name)
            assert f"{signum.name} during start-up: stopped before claiming anything" in log, log
            assert "Traceback" not in log and "ready on" not in log, log

        # 2. A supervisor of the busy group reads the history once and writes its checkpoints, with a directory.
        other = busy.start("busy-1")
        settings = Settings(brokers=kafka_brokers, group=new.group)
        poll_until(
            lambda: find_starts(settings, coordination_topic, count, new.group)[home].kind == "directory",
            timeout=240,
            what="a checkpoint of the busy group that does not name the new one",
        )
        assert records_read_at_start(busy.log_of("busy-1")) >= HISTORY
        other.send_signal(signal.SIGTERM)
        assert other.wait(timeout=60) == ExitCode.OK

        # 3. The new group's supervisor starts at it: it reads a few records, not the history, and claims.
        second = new.start("b")
        poll_until(
            lambda: len(new.status_rows()) == 4 and {r["client"] for r in new.status_rows().values()} == {"b"},
            timeout=120,
            what="b owning the new group's 4 partitions",
        )
        log = new.log_of("b")
        assert records_read_at_start(log) < STATUS_READS_AT_MOST, log
        assert "another group's checkpoint" in log, log
        result = status(kafka_brokers, coordination_topic, new.group, "--topic", new.topic)
        assert result.returncode == ExitCode.OK, result.stderr
        assert records_status_read(result) < STATUS_READS_AT_MOST
        # A group nobody knows: "unknown group" after reading as few.
        result = status(kafka_brokers, coordination_topic, f"nobody-{unique}")
        assert result.returncode == ExitCode.UNKNOWN_GROUP, result.stderr
        assert records_status_read(result) < STATUS_READS_AT_MOST
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == ExitCode.OK
    finally:
        new.stop_all()
        busy.stop_all()


# 0 s: as it begins to ask Kafka for the coordination topic; 1 s: well into its wait.  Either way: stopped, exit 0.
@pytest.mark.parametrize("after_s", [0.0, 1.0])
def test_a_supervisor_waiting_for_a_broker_that_does_not_answer_stops_at_once_on_sigterm(
    tmp_path: Path, after_s: float
) -> None:
    fleet = Fleet(
        brokers="127.0.0.1:1",
        group="g",
        topic="orders",
        coordination_topic="__marshal",
        sink=tmp_path / "sink.txt",
        partitions=1,
    )
    try:
        supervisor = fleet.start("lonely", "--connect-timeout", "120s")  # it would give up (exit 4) after 2 minutes
        # Its fork server comes after its signal handlers, right before it asks Kafka for the coordination topic;
        # then it waits in that call, saying nothing.
        poll_until(
            lambda: "marshal-workers: fork server" in [cmdline(pid) for pid in process_group(supervisor.pid)],
            timeout=60,
            what="the supervisor's fork server",
        )
        time.sleep(after_s)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == ExitCode.OK
        log = fleet.log_of("lonely")
        assert "SIGTERM during start-up: stopped before claiming anything" in log, log
        assert "Traceback" not in log, log
    finally:
        fleet.stop_all()
