"""Benchmark: reading a group's state (what start-up and ``status`` do) against the coordination log's length.

    /work/venv/bin/python tests/benchmarks/bench_startup.py [--records 100000,1000000,3000000]

Starts its own embedded broker.  For each length N: a fresh coordination
topic (1 partition) gets N records of a group's past (claims and heartbeats
of 64 partitions), then

  a. the time to read the group's state from the beginning (what every reader did before checkpoints),
  b. a checkpoint is written, then 1,000 more records, and the time to read the state again: from the
     latest checkpoint, as ``status`` and a starting supervisor do now;
  c. the time a NEW group takes to read its (empty) state from the same log, with records read: before the
     checkpoint (c0: the whole log, as every new group did before release 0.7.0) and after it (c1: from the
     other group's checkpoint, whose directory does not name it);

and checks that a and b give the same positions.  Target: b and c1 flat in N and under 2 s.
A benchmark, not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import replace

import checkout  # noqa: F401 - puts the checkout on sys.path
from bench_run import machine_info, verdict
from confluent_kafka import Producer

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.protocol import codec


def history(settings: Settings, count: int, start_ts: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": settings.brokers,
            "linger.ms": 50,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    common = {"v": 1, "group": settings.group, "client": "old-host", "instance": "old-1"}
    send = producer.produce
    for p in range(64):
        send(settings.coordination_topic, codec.encode(codec.Claim(**common, ts=start_ts, topic="orders", partition=p)))
    for n in range(count):
        value = codec.encode(
            codec.Heartbeat(**common, ts=start_ts + n // 1000, topic="orders", partition=n % 64, offset=n)
        )
        try:
            send(settings.coordination_topic, value, partition=0)
        except BufferError:
            producer.poll(0.1)
            send(settings.coordination_topic, value, partition=0)
    if producer.flush(300):
        raise RuntimeError("history not delivered")


def read_time(settings: Settings, from_beginning: bool) -> tuple[float, int, dict, int]:
    """Seconds to read the group's state, records of the group folded, its partitions, records read in all."""
    started = time.perf_counter()
    reader = CoordinationLog(settings, settings.group or "", 1, from_beginning=from_beginning).start()
    try:
        reader.wait_caught_up(stall_timeout=60)
        state = reader.snapshot()
        read = reader.records_read()
    finally:
        reader.close()
    return time.perf_counter() - started, state.stats.applied, state.partitions, read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="100000,1000000,3000000")
    args = parser.parse_args()
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    print("reading a group's state against the coordination log's length")
    for line in machine_info():
        print("  " + line)
    print(
        f"\n  {'records':>10} {'a: whole log (s)':>16} {'folded':>10} {'b: from checkpoint (s)':>22} {'folded':>8}"
        f" {'c0: new group (s)':>17} {'read':>10} {'c1: new group (s)':>17} {'read':>6}"
    )
    worst = 0.0
    with EmbeddedBroker() as broker:
        for count in (int(n) for n in args.records.split(",")):
            name = uuid.uuid4().hex[:8]
            settings = Settings(
                brokers=broker.bootstrap,
                group=f"g-{name}",
                client_id="bench",
                heartbeat_interval=3600.0,
                coordination_topic=f"__marshal-{name}",
                coordination_partitions=1,
                connect_timeout=60.0,
                write_timeout=60.0,
            )
            with Coordinator(replace(settings, checkpoint_interval=0)) as writer:
                history(settings, count, writer.now_ms() - 3_600_000)
            whole, whole_folded, expected, _ = read_time(settings, from_beginning=True)
            newcomer = replace(settings, group=f"new-{name}")
            new_before, _, _, read_before = read_time(newcomer, from_beginning=False)
            with Coordinator(settings) as writer:
                writer.write(writer.checkpoint_records(0), partitions=[0])
                history(settings, 1_000, writer.now_ms())
            _, _, expected, _ = read_time(settings, from_beginning=True)
            seconds, folded, partitions, _ = read_time(settings, from_beginning=False)
            new_after, _, _, read_after = read_time(newcomer, from_beginning=False)
            worst = max(worst, seconds, new_after)
            same = "same state" if partitions == expected else "STATES DIFFER"
            print(
                f"  {count:>10,} {whole:>16.2f} {whole_folded:>10,} {seconds:>22.2f} {folded:>8,} {new_before:>17.2f}"
                f" {read_before:>10,} {new_after:>17.2f} {read_after:>6,}   {same}",
                flush=True,
            )
    print(f"\n  slowest start from a checkpoint (b, c1): {worst:.2f}s (target < 2 s) {verdict(worst < 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
