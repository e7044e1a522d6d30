"""app.send outside a worker (a web endpoint, a script): the process's own producer, from the app's settings and
the environment; app.flush() waits for Kafka, and what is left is delivered at exit (docs/handlers.md)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from polling import poll_until

from marshal_workers import App

pytestmark = pytest.mark.broker


class Invoice(msgspec.Struct):
    order_id: str
    total: float


def created(brokers: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": brokers})  # kept while its future runs: a client gone fails it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    return topic


def read_all(brokers: str, topic: str, count: int) -> list[tuple[bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "send-anywhere-reader"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[tuple[bytes | None, bytes | None]] = []
    try:
        while len(found) < count:
            message = poll_until(lambda: consumer.poll(0.5), timeout=30, what=f"message {len(found) + 1} of {topic}")
            if message.error() is None:
                found.append((message.key(), message.value()))
    finally:
        consumer.close()
    return found


def test_a_web_endpoints_threads_send_on_one_producer_and_flush_waits_for_kafka(
    kafka_brokers: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARSHAL_WORKERS_BROKERS", kafka_brokers)  # as a deployed process gets its settings
    topic = created(kafka_brokers, f"invoices-{unique}")
    app = App(group=f"web-{unique}")
    app.sends(topic, Invoice, serializer="msgpack")

    def endpoint(n: int) -> None:  # what a request handler of a web server does, on the server's threads
        app.send(topic, Invoice(f"o-{n}", n * 1.5), key=f"o-{n}")

    threads = [threading.Thread(target=endpoint, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    app.flush()
    sent = read_all(kafka_brokers, topic, 20)
    app.close()
    decoded = {key.decode(): msgspec.msgpack.decode(value, type=Invoice) for key, value in sent if key and value}
    assert decoded == {f"o-{n}": Invoice(f"o-{n}", n * 1.5) for n in range(20)}, "encoded by the declared serializer"


def test_a_script_that_exits_without_flushing_still_delivers(kafka_brokers: str, unique: str, tmp_path: Path) -> None:
    topic = created(kafka_brokers, f"audit-{unique}")
    script = tmp_path / "send_once.py"
    script.write_text(
        f"from marshal_workers import App\nApp(brokers={kafka_brokers!r}).send({topic!r}, {{'who': 'ops'}}, key='k')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert read_all(kafka_brokers, topic, 1) == [(b"k", b'{"who":"ops"}')]
