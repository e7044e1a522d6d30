"""examples/http_client.sh, the bash + curl + jq client of ``marshal-workers serve``, run for real: a broker (the
marshal_broker fixture of the installed pytest plugin), a server process, and the script in its own process.

Without curl or jq the test is skipped, except in CI (the CI variable set), where it fails: CI installs them.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from marshal_workers.config import Settings
from marshal_workers.coordination_log import read_group_state

SCRIPT = Path(__file__).with_name("http_client.sh")
BINARY = b"\xff\x00\x10binary"


def needs(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is missing: .ci/run installs it")
        pytest.skip(f"apt-get install {tool} to run the shell client example")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_the_shell_client_handles_and_acks_every_message_once(marshal_broker: str, tmp_path: Path) -> None:
    needs("curl")
    needs("jq")
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": marshal_broker})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(10)
    producer = Producer({"bootstrap.servers": marshal_broker})
    for n in range(30):
        producer.produce(name, value=str(n).encode(), partition=n % 2)
    producer.produce(name, value=BINARY, partition=0)
    assert producer.flush(30) == 0

    port = free_port()
    group = f"group-{name}"
    settings = Settings(brokers=marshal_broker, group=group, coordination_topic=f"__marshal-{name}")
    server = subprocess.Popen(
        [sys.executable, "-m", "marshal_workers", "serve", "--brokers", marshal_broker, "--group", group,
         "--coordination-topic", settings.coordination_topic, "--topic", name, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "wb"), start_new_session=True,
    )  # fmt: skip
    output = tmp_path / "handled.txt"
    client = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the server answers once it is up
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
        client = subprocess.Popen(["bash", str(SCRIPT), f"http://127.0.0.1:{port}", str(output), "31"],
                                  stderr=open(tmp_path / "client.log", "wb"), start_new_session=True)  # fmt: skip
        assert client.wait(timeout=60) == 0, (tmp_path / "client.log").read_text()

        lines = [line.split() for line in output.read_text().splitlines()]
        values = sorted(value for _, _, value in lines)
        assert values == sorted([str(n) for n in range(30)] + [BINARY.hex()]), "each message handled once"
        state = read_group_state(settings, group)
        assert [state.shared_partition(name, p).low for p in (0, 1)] == [16, 15], "every offset acked"  # type: ignore[union-attr]
    finally:
        if client is not None:
            stop(client)
        stop(server)
    assert server.returncode == 0
