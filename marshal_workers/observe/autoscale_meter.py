"""The I/O shell of the autoscaling signal: one meter per server, fed by the dashboard's step.

Each server that answers ``GET /autoscale`` (a supervisor's metrics port, the ``dashboard`` command) and
``status --autoscale`` hold an :class:`AutoscaleMeter`.  It takes the group's dashboard document from the step
the dashboard uses (positions from the coordination log, ends as that place knows them), keeps the positions it
saw in a RateWindow and answers with autoscale.answer: the computation is there, pure; this module only samples
and encodes.  The servers call it from their threads: one lock guards the window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from marshal_workers.core.config import Settings
from marshal_workers.observe.autoscale import BadQuery, RateWindow, answer, drain_target_of, positions
from marshal_workers.observe.dashboard import GroupWatcher
from marshal_workers.observe.dashboard_model import Dashboard

_MARGIN_S = 0.1  # beyond the heartbeat interval: the two samples' times are whole milliseconds


class AutoscaleMeter:
    """Samples the group at each request (and once at start, so the first request already measures a rate)."""

    def __init__(self, step: Callable[[Dashboard], Dashboard], settings: Settings) -> None:
        self._step = step
        self._target_s = settings.drain_target
        self._processes_per_member = settings.shared_processes
        # Whole partitions' positions move at heartbeats (every HB/2): a shorter span measures their phase.
        self._window = RateWindow(min_span_ms=settings.heartbeat_ms)
        self._lock = threading.Lock()

    def start(self) -> AutoscaleMeter:
        self.sample()
        return self

    def sample(self) -> tuple[Mapping[str, Any], RateWindow]:
        """The group's document now, and the window with its positions added."""
        document = self._step(Dashboard()).document
        assert document is not None  # a step always builds one
        with self._lock:
            self._window = self._window.observe(document["now_ms"], positions(document))
            return document, self._window

    def answer(self, query: str) -> tuple[int, bytes]:
        """(HTTP status, JSON body) for ``GET /autoscale?<query>``: 200 and the answer, or 400 and what is wrong."""
        try:
            target_s = drain_target_of(query, self._target_s)
        except BadQuery as exc:
            return 400, orjson.dumps({"error": str(exc)})
        document, window = self.sample()
        return 200, orjson.dumps(answer(document, window, target_s, self._processes_per_member))


def measure_once(settings: Settings, group: str) -> dict[str, Any]:
    """``status --autoscale``: the group watched for a heartbeat interval (a rate needs two looks at the
    positions, and whole partitions' move at heartbeats), with the ends polled once at least."""
    watcher = GroupWatcher(settings, group, dead_letters=False).start()
    try:
        meter = AutoscaleMeter(watcher.step, settings).start()
        time.sleep(settings.heartbeat_interval + _MARGIN_S)
        watcher.polled.wait(settings.connect_timeout)
        document, window = meter.sample()
        return answer(document, window, settings.drain_target, settings.shared_processes)
    finally:
        watcher.close()
