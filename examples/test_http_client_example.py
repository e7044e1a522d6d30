"""examples/http_client.sh, the bash + curl + jq client of ``marshal-workers serve``, run for real: a broker (the
marshal_broker fixture of the installed pytest plugin), a server process with a token, and the script in processes of
its own: refused without the token, then stopped after a count, then by SIGTERM.

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

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import read_group_state

SCRIPT = Path(__file__).with_name("http_client.sh")
TOKEN = "example-token"
BINARY = b"\xff\x00\x10binary\x80"  # not UTF-8: handed out base64-encoded
TEXT = 'na\u00efve "quoted" back\\slash\ttab'.encode()  # UTF-8, with what a shell or TSV would mangle
VALUES = [str(n).encode() for n in range(30)] + [BINARY, TEXT]  # 16 per partition


def needs(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is missing: .ci/run installs it")
        pytest.skip(f"apt-get install {tool} to run the shell client example")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL past a timeout; then SIGKILL to whatever is left in its session (a curl of the script)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the group id is its pid
    except ProcessLookupError:
        pass


def wait_for(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def handled(output: Path) -> list[tuple[int, int, bytes]]:
    """The script's output: one ``partition offset value`` line per message handled, the value's exact bytes (a line
    being written is left for the next look)."""
    if not output.exists():
        return []
    lines = output.read_bytes().split(b"\n")
    return [(int(p), int(o), value) for p, o, value in (line.split(b" ", 2) for line in lines[:-1])]


def test_the_shell_client_handles_and_acks_every_message_once(marshal_broker: str, tmp_path: Path) -> None:
    needs("curl")
    needs("jq")
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": marshal_broker})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(10)
    producer = Producer({"bootstrap.servers": marshal_broker})
    for n, value in enumerate(VALUES):
        producer.produce(name, value=value, partition=n % 2)
    assert producer.flush(30) == 0

    env = {k: v for k, v in os.environ.items() if not k.startswith("MARSHAL_WORKERS_")}
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    group = f"group-{name}"
    settings = Settings(
        brokers=marshal_broker, group=group, coordination_topic=f"__marshal-{name}", heartbeat_interval=1.0
    )
    output = tmp_path / "handled.txt"
    started: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], log: str, **more_env: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / log, "ab") as sink:  # its own session: our signals reach it alone
            process = subprocess.Popen(command, env=env | more_env, stdout=sink, stderr=sink, start_new_session=True)
        started.append(process)
        return process

    def client(*args: str, **more_env: str) -> subprocess.Popen[bytes]:
        return start(["bash", str(SCRIPT), url, str(output), *args], "client.log", **more_env)

    def client_log() -> str:
        return (tmp_path / "client.log").read_text(errors="replace")

    def up() -> bool:
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        try:
            return urllib.request.urlopen(url + "/healthz", timeout=5).status == 200
        except OSError:
            return False

    server = start(
        [
            sys.executable,
            "-m",
            "marshal_workers",
            "serve",
            "--brokers",
            marshal_broker,
            "--group",
            group,
            "--coordination-topic",
            settings.coordination_topic,
            "--topic",
            name,
            "--port",
            str(port),
            "--token-file",
            str(tmp_path / "token"),
        ],
        "server.log",
    )
    try:
        wait_for(up, 60, "the server to answer")

        # No token: the script says what the server said and exits 1, having handled nothing.
        assert client("5").wait(timeout=30) == 1, client_log()
        assert '"error":"unauthorized"' in client_log() and handled(output) == []

        # With it: 20 messages in batches of at most 7, then it stops by itself.
        assert client("20", MARSHAL_WORKERS_SERVE_TOKEN=TOKEN, BATCH="7").wait(timeout=60) == 0, client_log()
        assert len(handled(output)) == 20

        # With no count it runs until SIGTERM, which it answers by exiting 0 once the batch in hand is acked.
        forever = client(MARSHAL_WORKERS_SERVE_TOKEN=TOKEN)
        wait_for(lambda: len(handled(output)) >= len(VALUES), 60, "every message handled")
        forever.send_signal(signal.SIGTERM)
        assert forever.wait(timeout=30) == 0, client_log()

        lines = handled(output)
        assert output.read_bytes().endswith(b"\n"), "no line half written"
        assert sorted(value for _, _, value in lines) == sorted(VALUES), "each message handled once, decoded"
        assert len({(p, o) for p, o, _ in lines}) == len(VALUES) == 32
        assert {(p, value) for p, _, value in lines} >= {(0, BINARY), (1, TEXT)}

        def every_offset_done() -> bool:
            state = read_group_state(settings, group)
            marks = [state.shared_partition(name, p) for p in (0, 1)]
            return all(m is not None and m.low == 16 and m.acked == 16 and m.lost == 0 for m in marks)

        wait_for(every_offset_done, 30, "every offset done in the coordination log")
        assert "ack:" not in client_log(), "no ack was refused or retried"
    finally:
        for process in reversed(started):
            stop(process)
    assert server.returncode == 0, (tmp_path / "server.log").read_text()
    assert all(process.poll() is not None for process in started)
