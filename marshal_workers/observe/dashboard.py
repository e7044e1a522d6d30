"""The live dashboard's I/O shell: what feeds the pure model (dashboard_model) and hands its documents out.

:class:`Publisher` is shared by both places the dashboard is served: it calls a ``step`` (the model's
``advance`` over a world state) about once a second in a thread of its own and keeps the latest document,
encoded, for any number of readers (``/api/state``, server-sent events).  :class:`GroupWatcher` is the
standalone command's source: it tails the coordination log into a WorldState (the same CoordinationLog a
supervisor and ``status`` use), polls the high watermarks every ~2 s and the dead-letter topics every ~10 s.
The supervisor feeds a Publisher from its own WorldState instead (``run --dashboard``).  The web servers
(dashboard_server.py for the command, metrics.py in the supervisor) only move bytes.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from marshal_workers.core.config import Settings
from marshal_workers.errors import KafkaUnavailable, MarshalWorkersError
from marshal_workers.kafka.coordination_reader import CoordinationLog
from marshal_workers.kafka.dead_letter_reader import Tally, read_dead_letters
from marshal_workers.kafka.kafka_clients import admin_client, topic_partition_count
from marshal_workers.kafka.partition_positions import partition_bounds, position_consumer
from marshal_workers.observe.dashboard_model import Dashboard, Key, advance

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0
HIGH_WATERMARK_INTERVAL_S = 2.0
DEAD_LETTER_INTERVAL_S = 10.0  # a summary reads each dead-letter topic whole: not every second
KEEPALIVE_S = 15.0  # an SSE comment when nothing changed, so proxies do not close an idle stream


def page() -> bytes:
    """The dashboard page: one static HTML file (package data), with relative URLs so it works under any prefix."""
    return importlib.resources.files(__package__).joinpath("dashboard.html").read_bytes()


def asyncapi_answer(document: Callable[[], bytes] | None) -> Callable[[], tuple[int, bytes]]:
    """What ``/asyncapi.json`` answers, as (status, JSON body), on the dashboard and on a supervisor's metrics port:
    the app's AsyncAPI document (handlers/asyncapi.py), made when asked; 404 where no app is known."""

    def answer() -> tuple[int, bytes]:
        if document is None:
            return 404, orjson.dumps(
                {
                    "error": "no application here: start the dashboard with --app MODULE:APP to "
                    "serve its AsyncAPI document"
                }
            )
        try:
            return 200, document()
        except MarshalWorkersError as exc:  # e.g. two models of one name: the page says so, the server goes on
            return 500, orjson.dumps({"error": str(exc)})

    return answer


def sse_event(body: bytes) -> bytes:
    """One server-sent event carrying a JSON document (orjson writes no newline, so one ``data:`` line)."""
    return b"data: " + body + b"\n\n"


class Publisher:
    """Runs ``step`` every ``interval`` seconds in a thread; readers get the latest document, encoded.

    ``step`` takes the previous Dashboard and returns the next (rates and hand-overs need the previous one).
    A step that fails is logged and skipped: the page keeps the last document rather than going blank.
    """

    def __init__(self, step: Callable[[Dashboard], Dashboard], interval: float = PUBLISH_INTERVAL_S) -> None:
        self._step = step
        self._interval = interval
        self._dashboard = Dashboard()
        self._latest: tuple[int, bytes] = (0, orjson.dumps(None))
        self._changed = threading.Condition()
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard", daemon=True)

    def start(self) -> Publisher:
        self._publish_once()  # a document before the first reader comes
        self._thread.start()
        return self

    def close(self) -> None:
        self.closing.set()
        with self._changed:
            self._changed.notify_all()  # streams waiting for the next document end now
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def latest(self) -> tuple[int, bytes]:
        """(version, JSON document); version 0 until the first document."""
        with self._changed:
            return self._latest

    def wait_newer(self, version: int, timeout: float) -> tuple[int, bytes] | None:
        """The latest document once it is newer than ``version``; None on timeout or when closing."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._latest[0] <= version and not self.closing.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)
            return None if self.closing.is_set() else self._latest

    def _run(self) -> None:
        while not self.closing.wait(self._interval):
            self._publish_once()

    def _publish_once(self) -> None:
        try:
            self._dashboard = self._step(self._dashboard)
        except Exception:  # the dashboard must outlive a bad update
            log.exception("the dashboard could not be updated")
            return
        body = orjson.dumps(self._dashboard.document)
        with self._changed:
            self._latest = (self._latest[0] + 1, body)
            self._changed.notify_all()


class GroupWatcher:
    """The ``dashboard`` command's view of a group: the coordination log tailed, Kafka polled.

    Read-only: it writes nothing to the coordination topic (not even a claim) and commits no offset.
    """

    def __init__(
        self, settings: Settings, group: str, clock: Callable[[], float] = time.time, dead_letters: bool = True
    ) -> None:
        self.settings = settings
        self.group = group
        self._clock = clock
        self._read_dead_letters = dead_letters  # status --autoscale needs only positions and ends
        self.polled = threading.Event()  # set once the ends were polled (status --autoscale waits for them)
        self._admin = admin_client(settings)
        self._log: CoordinationLog | None = None
        self._lock = threading.Lock()  # guards what the poll thread hands to step()
        self._highs: dict[Key, int] = {}
        self._counts: dict[str, int] = {}
        self._dead_letters: dict[str, list[dict[str, Any]]] = {}
        self._tallies: dict[str, Tally] = {}  # per dead-letter topic: what has been read of it, by error type
        self._dead_letters_at: int | None = None
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="dashboard-poll", daemon=True)

    def start(self) -> GroupWatcher:
        """Read the log up to its end (so the first document is whole), then keep tailing and polling."""
        self._open_log()
        self._poller.start()
        return self

    def _open_log(self) -> None:
        """Tail the coordination log if it exists; until it does the group is shown empty (it is never created
        here: the poll thread looks again, so a dashboard started before the group's first supervisor works)."""
        count = topic_partition_count(self._admin, self.settings, self.settings.coordination_topic)
        if count is not None:
            reader = CoordinationLog(self.settings, self.group, count).start()
            reader.wait_caught_up(stall_timeout=self.settings.connect_timeout)
            self._log = reader  # only once caught up: step() never shows a half-read log

    def close(self) -> None:
        self._stopping.set()
        if self._poller.is_alive():
            self._poller.join(timeout=self.settings.connect_timeout + 5)
        if self._log is not None:
            self._log.close()

    def step(self, dashboard: Dashboard) -> Dashboard:
        """The model's next dashboard, computed under the log's lock (no copy of the state)."""
        now_ms = int(self._clock() * 1000)
        with self._lock:
            highs, counts = dict(self._highs), dict(self._counts)
            letters, letters_at = dict(self._dead_letters), self._dead_letters_at
        if self._log is None:
            from marshal_workers.protocol.world_state import WorldState

            empty = WorldState(self.group, self.settings.heartbeat_ms)
            return advance(dashboard, empty, now_ms, highs, counts, letters, letters_at)
        return self._log.read(lambda state: advance(dashboard, state, now_ms, highs, counts, letters, letters_at))

    def _topics(self) -> set[str]:
        if self._log is None:
            return set()
        return self._log.read(lambda state: {topic for topic, _ in state.partitions} | {t for t, _ in state.shared})

    def _poll(self) -> None:
        consumer = position_consumer(self.settings)
        next_letters = 0.0
        try:
            while not self._stopping.is_set():
                try:
                    if self._log is None:
                        self._open_log()
                    topics = sorted(self._topics())
                    self._poll_highs(consumer, topics)
                    if self._read_dead_letters and time.monotonic() >= next_letters:
                        self._poll_dead_letters(topics)
                        next_letters = time.monotonic() + DEAD_LETTER_INTERVAL_S
                except Exception:  # the broker away or a surprise: show the last data, try again
                    log.exception("dashboard: polling Kafka failed; trying again")
                self._stopping.wait(HIGH_WATERMARK_INTERVAL_S)
        finally:
            consumer.close()

    def _poll_highs(self, consumer: Any, topics: Sequence[str]) -> None:
        highs: dict[Key, int] = {}
        counts: dict[str, int] = {}
        for topic in topics:
            try:
                count = topic_partition_count(self._admin, self.settings, topic)
                if count is None:
                    continue
                counts[topic] = count
                bounds = partition_bounds(consumer, self.settings, topic, range(count))
            except MarshalWorkersError as exc:  # the broker away: keep the last ends, say so once per poll
                log.warning("dashboard: cannot read the ends of %s: %s", topic, exc)
                return
            highs.update({(topic, p): b.high for p, b in bounds.items()})
        with self._lock:
            self._highs, self._counts = highs, counts
        self.polled.set()

    def _poll_dead_letters(self, topics: Sequence[str]) -> None:
        found: dict[str, list[dict[str, Any]]] = {}
        for topic in topics:
            dlq_topic = f"{topic}.dlq"
            try:
                if topic_partition_count(self._admin, self.settings, dlq_topic) is None:
                    continue  # created at the first dead letter: none yet
                # Only what is new since the last poll: a dead-letter topic is never read whole twice.
                tally = self._tallies.setdefault(dlq_topic, Tally())
                for letter in read_dead_letters(self.settings, dlq_topic, after=tally.positions):
                    tally.add(letter)
                # The group's own letters, and those that name no group (written before letters named their
                # group: they may be its own); other groups' letters in the same topic are theirs.
                found[dlq_topic] = tally.rows({self.group, None})
            except (MarshalWorkersError, KafkaUnavailable) as exc:
                log.warning("dashboard: cannot read %s: %s", dlq_topic, exc)
        with self._lock:
            self._dead_letters, self._dead_letters_at = found, int(self._clock() * 1000)


def supervisor_step(
    read: Callable[[Callable[[Any], Dashboard]], Dashboard],
    highs: Callable[[], Mapping[Key, int]],
    counts: Callable[[], Mapping[str, int]],
    clock: Callable[[], float] = time.time,
) -> Callable[[Dashboard], Dashboard]:
    """The step of ``run --dashboard``: the supervisor's own WorldState (through ``read``, under its lock), the
    ends its workers' fetches saw for the partitions it holds (others show the lag their owners report), no
    dead letters (reading those topics is the ``dashboard`` command's job, not a supervisor's)."""

    def step(dashboard: Dashboard) -> Dashboard:
        now_ms = int(clock() * 1000)
        ends, sizes = dict(highs()), dict(counts())
        return read(lambda state: advance(dashboard, state, now_ms, ends, sizes))

    return step
