"""Reproduces a fault of the embedded broker (Tansu 0.6.0, memory storage) that the nemesis ran into.

Several idempotent producers write small batches to one partition while
readers tail it.  After some tens of thousands of records (sooner under the
nemesis's load: about 9,000 to 16,000 coordination records of an AMO fleet),
the readers stop short of the end for good while every write is still
acknowledged: a record written after that is never read by anyone.  For the
group that means claims and heartbeats that are never confirmed, and new
supervisors and ``status`` that never finish reading the log.

    python tests/chaos/tansu_concurrent_writes.py --producers 3 --seconds 80

Prints, every 2 s, the highest acknowledged offset and where the readers are;
exits 1 and says STUCK when no reader has moved for 5 s while writes go on.
Not collected by pytest: it is a finding about the broker, not our code.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.embedded_broker import EmbeddedBroker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=5, help="max.in.flight.requests.per.connection")
    parser.add_argument("--seconds", type=float, default=80.0)
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("log", num_partitions=1, replication_factor=1)])["log"].result(10)
        stop = threading.Event()
        top = [0]
        read = [0, time.monotonic()]

        def produce() -> None:
            producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True,
                                 "linger.ms": 1, "max.in.flight.requests.per.connection": args.in_flight})  # fmt: skip

            def delivered(error: KafkaError | None, message: Message) -> None:
                if error is None:
                    top[0] = max(top[0], message.offset())

            while not stop.is_set():
                producer.produce("log", b"x" * 200, on_delivery=delivered)
                producer.poll(0.002)
            producer.flush(10)

        def tail() -> None:
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "tail", "fetch.wait.max.ms": 5,
                                 "fetch.queue.backoff.ms": 5})  # fmt: skip
            consumer.assign([TopicPartition("log", 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                message = consumer.poll(0.1)
                if message is not None and message.error() is None and message.offset() > read[0]:
                    read[0], read[1] = message.offset(), time.monotonic()
            consumer.close()

        threads = [threading.Thread(target=produce) for _ in range(args.producers)]
        threads += [threading.Thread(target=tail) for _ in range(3)]
        for thread in threads:
            thread.start()
        began, stuck = time.monotonic(), False
        while time.monotonic() - began < args.seconds and not stuck:
            time.sleep(2)
            idle = time.monotonic() - read[1]
            print(f"{time.monotonic() - began:4.0f}s  acknowledged up to {top[0]}  read up to {read[0]}  "
                  f"(no progress for {idle:.1f}s)", flush=True)  # fmt: skip
            stuck = idle > 5 and top[0] > read[0]
        stop.set()
        for thread in threads:
            thread.join(15)
        print("STUCK: readers stopped short of acknowledged records" if stuck else "readers kept up")
        return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
