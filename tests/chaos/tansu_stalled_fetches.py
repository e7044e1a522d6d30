"""Reproduces the embedded broker's stalled fetches on a long partition, and shows the project's reader past them.

Tansu 0.6.0 (memory storage) stores every produced batch as an object of its own and, on every fetch, lists
all of a partition's batch objects, oldest first, within the fetch's wait (``fetch.wait.max.ms``); once the
listing takes longer than that, the answer is empty, with the high watermark far ahead, and stays so:

    python tests/chaos/tansu_stalled_fetches.py                       # one producer, a plain reader at 5 ms
    python tests/chaos/tansu_stalled_fetches.py --fetch-wait-ms 100   # the plain reader keeps up far longer
    python tests/chaos/tansu_stalled_fetches.py --guarded             # the project's reader (guarded_consumer.py)

One or more producers write 200-byte records, one per batch, to a 1-partition topic while a reader tails it
from the start.  Prints, every 2 s, the highest acknowledged offset and where the reader is; a plain reader
is STUCK (exit 1) when it has not moved for 5 s while writes go on.  Not collected by pytest: it is a
finding about the broker (docs/brokers.md); tests/integration/test_stalled_fetches.py is the regression test.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.kafka.guarded_consumer import GuardedConsumer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--fetch-wait-ms", type=int, default=5, help="the reader's fetch.wait.max.ms (where it starts)")
    parser.add_argument("--guarded", action="store_true", help="read with the project's GuardedConsumer")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    with EmbeddedBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("log", num_partitions=1, replication_factor=1)])["log"].result(10)
        stop = threading.Event()
        top = [0]
        read = [-1, time.monotonic()]

        def produce() -> None:
            producer = Producer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 0,
                    "batch.num.messages": 1,
                }
            )

            def delivered(error: KafkaError | None, message: Message) -> None:
                if error is None:
                    top[0] = max(top[0], message.offset())

            while not stop.is_set():
                try:
                    producer.produce("log", b"x" * 200, on_delivery=delivered)
                except BufferError:  # one record a batch: the queue fills faster than batches go out
                    producer.poll(0.01)
                producer.poll(0)
            producer.flush(10)

        def tail() -> None:
            config = {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "tail",
                "fetch.wait.max.ms": args.fetch_wait_ms,
                "fetch.queue.backoff.ms": 5,
            }
            consumer = GuardedConsumer(config, "the guarded reader", 1.0) if args.guarded else Consumer(config)
            consumer.assign([TopicPartition("log", 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                for message in consumer.consume(1000, 0.1):
                    if message.error() is None and message.offset() > read[0]:
                        read[0], read[1] = message.offset(), time.monotonic()
            consumer.close()

        threads = [threading.Thread(target=produce) for _ in range(args.producers)] + [threading.Thread(target=tail)]
        for thread in threads:
            thread.start()
        began, stuck = time.monotonic(), False
        while time.monotonic() - began < args.seconds and not stuck:
            time.sleep(2)
            idle = time.monotonic() - read[1]
            print(
                f"{time.monotonic() - began:4.0f}s  acknowledged up to {top[0]}  read up to {read[0]}  "
                f"(no progress for {idle:.1f}s)",
                flush=True,
            )
            stuck = idle > 5 and top[0] > read[0]
        stop.set()
        for thread in threads:
            thread.join(15)
        print("STUCK: the reader stopped short of acknowledged records" if stuck else "the reader kept up")
        return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
