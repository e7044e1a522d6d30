"""A supervisor's first steps, begun before the rest of the supervisor is imported.

A start-up spends CPU on imports and waits on the broker while it reads the coordination log; done one after
the other, a loaded machine makes it pay both in full (docs/operations.md, "How long status and a start-up take").
So ``marshal-workers run``, as soon as it has the application and the settings, forks the fork server (before any
Kafka client exists: librdkafka is not fork-safe; fork_server.py) and starts the coordinator reading the log on a
thread of its own; then it imports and builds the supervisor, which takes the coordinator when it needs it.  The
reading waits without the GIL, so the imports go on meanwhile.

Until the supervisor installs its signal handlers, SIGTERM, SIGINT and SIGHUP are recorded here, and stop the
reading as the supervisor's would (StopRequested when the supervisor takes the coordinator); the supervisor takes
them over with :meth:`take_signals`.  Imports only what the reading needs: this module is imported before the
supervisor's own.
"""

from __future__ import annotations

import signal
import threading
import time
from multiprocessing.context import BaseContext
from types import FrameType

from marshal_workers.core.config import Settings
from marshal_workers.core.process_age import process_age
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.runtime.supervisor.fork_server import start_fork_server

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Starting:
    """The fork server and the coordinator of one supervisor, started early (see the module's docstring)."""

    def __init__(self, app_path: str, settings: Settings, record_signals: bool = True) -> None:
        """``record_signals``: install handlers that record the stop signals until the supervisor's take over."""
        self.imports_s = process_age()  # the interpreter, the imports and the application so far
        self.began = time.monotonic()
        self.received: list[int] = []  # stop signals that came before the supervisor's handlers
        self._stop = threading.Event()
        if record_signals:
            for signum in STOP_SIGNALS:
                signal.signal(signum, self._record_signal)
        self.context: BaseContext = start_fork_server(app_path)  # before any Kafka client, with a single thread
        self._coordinator = Coordinator(settings)
        self._outcome: Coordinator | BaseException | None = None
        self.reading_s = 0.0
        self._thread = threading.Thread(target=self._read, name="coordination-start", daemon=True)
        self._thread.start()

    def _record_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)  # nothing else here: no logging, no I/O
        self._stop.set()

    def _read(self) -> None:
        began = time.monotonic()
        try:
            self._outcome = self._coordinator.start(self._stop.is_set, member=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the supervisor, which raises it on its thread
            self._outcome = exc
        self.reading_s = time.monotonic() - began

    def ask_stop(self) -> None:
        """A stop signal came (to the supervisor's handler): the reading gives up (StopRequested)."""
        self._stop.set()

    def take_signals(self) -> list[int]:
        """The stop signals recorded so far; from now on the caller's handlers receive them."""
        received, self.received = self.received, []
        return received

    def coordinator(self) -> Coordinator:
        """The coordinator, once it has read the log to its end; what its start raised, raised here."""
        self._thread.join()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None  # the thread has ended: it set one or the other
        return outcome

    def close(self) -> None:
        """For a supervisor that never took the coordinator: stop the reading, and close what it opened."""
        self._stop.set()
        self._thread.join()
        if isinstance(self._outcome, Coordinator):
            self._outcome.close()
