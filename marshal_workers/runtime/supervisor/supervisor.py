"""The supervisor: the main loop, the signals and the shutdown of one ``marshal-workers run``.

Shaped like gunicorn's arbiter.  Signal handlers only record the signal; the
main loop waits for a signal, a worker's request or exit, or the next tick,
handles the signals, then steps each of its components once, in this order
(component.py: one interface for all of them):

* MessageClaims (message_claims.py): AMO workers' batch claims, written together;
* WriteVerdicts: the verdicts of the coordination writes in flight (in_flight.py);
* WorkerPool (worker_pool.py): the workers of whole partitions, forked, reaped, restarted;
* the SharedPool (shared_pool.py): ranges of shared partitions and their workers;
* TopicWatch (topic_watch.py): the handlers' partition counts;
* CheckpointWriter (checkpoint_writer.py): checkpoints of the coordination log due from us;
* RemoteControl (remote_control.py): operators' orders, read before each heartbeat;
* PartitionClaims (partition_claims.py): whole partitions claimed, heartbeated, balanced, released.

They share one Table (assignments.py): the partitions held, the phase, the
stop flag.  All coordination I/O happens on the main thread, without waiting
on Kafka; the writes the components submit during a pass are produced
together at its end, one produce batch per coordination partition
(in_flight.py).  Workers come from a fork server started before any Kafka client
exists (librdkafka is not fork-safe), with the application module preloaded.
"""

from __future__ import annotations

import collections
import faulthandler
import logging
import queue
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from types import FrameType
from typing import TYPE_CHECKING, Any

import orjson
import setproctitle
from confluent_kafka.admin import AdminClient

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.core.logs import group_log
from marshal_workers.core.process_age import process_age
from marshal_workers.errors import StopRequested
from marshal_workers.handlers.app import App, effective_time_limits
from marshal_workers.handlers.lifespan import run_shutdown_hooks, run_startup_hooks
from marshal_workers.handlers.rate_limits import create_buckets
from marshal_workers.kafka.committed_offsets import OffsetStore
from marshal_workers.kafka.coordination_reader import drain, wakeup_pair
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.kafka.kafka_clients import admin_client
from marshal_workers.observe.dashboard_model import Dashboard
from marshal_workers.observe.metrics import Counters, Probes, Snapshot
from marshal_workers.runtime.channel import Slot
from marshal_workers.runtime.supervisor.assignments import Phase, Table
from marshal_workers.runtime.supervisor.checkpoint_writer import CheckpointWriter
from marshal_workers.runtime.supervisor.component import Component, SharedPoolStep, WriteVerdicts
from marshal_workers.runtime.supervisor.fork_server import start_fork_server
from marshal_workers.runtime.supervisor.message_claims import MessageClaims
from marshal_workers.runtime.supervisor.partition_claims import PartitionClaims
from marshal_workers.runtime.supervisor.remote_control import RemoteControl
from marshal_workers.runtime.supervisor.shared_pool import SharedPool
from marshal_workers.runtime.supervisor.supervisor_lines import StartUpTimes, loop_health, start_line, stop_line
from marshal_workers.runtime.supervisor.topic_watch import TopicWatch
from marshal_workers.runtime.supervisor.waiter import Waiter
from marshal_workers.runtime.supervisor.worker_pool import WorkerPool, fork_server_starter

if TYPE_CHECKING:  # imported where a metrics port is served (_serve_metrics): most supervisors serve none
    from marshal_workers.observe.dashboard import Publisher
    from marshal_workers.observe.metrics_server import MetricsServer

_log = logging.getLogger(__name__)

TICK_S = 0.1


@dataclass(frozen=True)
class Parts:
    """What the supervisor runs once started: its Kafka clients and its components, in the order of a pass."""

    coordinator: Coordinator
    writes: InFlightWrites  # every coordination write of the loop: it never waits on one
    claims: PartitionClaims
    pool: WorkerPool
    topics: TopicWatch
    components: tuple[tuple[str, Component], ...]  # (its name for the log, it)


class Supervisor:
    """The loop, the signals and the shutdown; the work is its components' (see the module's docstring)."""

    def __init__(self, app: App, app_path: str, settings: Settings) -> None:
        self.app = app
        self.app_path = app_path
        self.settings = settings
        self.group = settings.require_group()
        self.log = group_log(_log, self.group)
        self.hb_s = settings.heartbeat_interval
        # (soft, hard) seconds per topic; checked here so a bad combination fails before any fork.
        self.time_limits = {topic: effective_time_limits(h, settings) for topic, h in app.handlers.items()}
        self.table = Table()
        self.counters = Counters()
        self.shared = SharedPool(app, app_path, settings, self.log, self.table.shared_partition_counts.get)
        self.shared.record_outcomes = self.counters.add_outcomes  # what became of shared handlers' failed calls
        self.exit_code = 0
        self.restart_requested = False  # SIGHUP: stop as on SIGTERM, then the command runs itself again
        self._last_tick = time.monotonic()  # the end of the loop's last pass (/healthz)
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._wakeup_r: socket.socket | None = None
        self._coordinator: Coordinator | None = None
        self._offsets: OffsetStore | None = None
        self._parts: Parts | None = None  # once started
        self._waiter = Waiter()
        self._unexpected_errors = 0
        self._metrics: MetricsServer | None = None
        self._dashboard: Publisher | None = None  # run --dashboard: documents for /dashboard on the metrics port
        # The graceful stop: when it began (monotonic), releases written before it, whether workers were killed.
        self._stop_began: float | None = None
        self._stop_deadline: float | None = None
        self._releases_before_stop = 0
        self._unconfirmed_before_stop = 0
        self._workers_killed = False
        self._app_started = False  # its on_startup hooks ran: its on_shutdown hooks run as we exit

    @property
    def phase(self) -> Phase:
        return self.table.phase

    # ----------------------------------------------------------------- run

    def run(self) -> int:
        """Run until stopped; return the process exit code."""
        self._install_signal_handlers()
        try:
            try:
                self._start_up()
            except StopRequested:
                self._stopped_during_start_up()
                return self.exit_code
            parts = self._require_parts()
            while self.table.phase is not Phase.STOPPED:
                try:
                    self._wait_for_events(parts)
                    self._one_pass(parts)
                    self._check_stop_progress(time.monotonic())
                    self._unexpected_errors = 0
                    self._last_tick = time.monotonic()
                except Exception:  # noqa: BLE001 - a bug or Kafka surprise: stop in order, not die holding
                    self._after_unexpected_error()
            self._log_stop()
        finally:
            try:
                self._close()
            finally:
                if self._app_started:  # every worker stopped, every partition released (or never claimed)
                    run_shutdown_hooks(self.app.shutdown_hooks)
        return self.exit_code

    def _one_pass(self, parts: Parts) -> None:
        """The signals, then each component's step; the coordination writes they submit leave together at the end
        of the pass, one produce batch per coordination partition instead of one each (in_flight.py)."""
        parts.writes.begin_pass()
        try:
            self._timed("signals", self._handle_signals)
            now = time.monotonic()
            for name, component in parts.components:
                self._timed(name, lambda: component.step(now))  # noqa: B023 (called at once)
        finally:
            self._timed("coordination writes", parts.writes.end_pass)

    def _start_up(self) -> None:
        """Everything before the loop.  A stop signal meanwhile interrupts the steps that wait on Kafka within a
        fraction of a second (StopRequested; stopping.py): nothing is claimed before the loop, so nothing is held."""
        should_stop = self._stop_asked
        imports_s, began = process_age(), time.monotonic()
        # Before any Kafka client exists, and before the app's hooks: what they open stays the supervisor's.
        context = start_fork_server(self.app_path)
        run_startup_hooks(self.app.startup_hooks)  # AppStartupError: stop before anything is claimed
        self._app_started = True  # from here, a start-up that fails still runs the app's on_shutdown hooks
        # One bucket per rate-limited handler, shared by all its workers (rate_limits.py).
        rate_buckets = create_buckets(context, {t: h.rate_limit for t, h in self.app.handlers.items()})
        self.shared.rate_buckets = rate_buckets
        coordinator = Coordinator(self.settings)
        reading_began = time.monotonic()
        self._coordinator = coordinator.start(should_stop, member=True)
        reading_s = time.monotonic() - reading_began
        started_ms = coordinator.now_ms()
        writes = InFlightWrites(coordinator)
        self._offsets = offsets = OffsetStore(self.settings)
        admin = admin_client(self.settings)
        self.shared.attach(context, coordinator, writes, offsets)
        self._parts = self._build_parts(context, coordinator, writes, offsets, admin, rate_buckets, started_ms)
        self._parts.topics.first_look(coordinator.take_first_metadata())
        if self.settings.metrics_port:
            self._serve_metrics()
        setproctitle.setproctitle(f"marshal-workers: supervisor {self.group}")
        times = StartUpTimes(imports_s, reading_s, time.monotonic() - began - reading_s, time.process_time())
        line = start_line(self.app, self.app_path, self.settings, coordinator.client, coordinator.instance, times)
        self.log.info("%s", line)

    def _build_parts(
        self,
        context: BaseContext,
        coordinator: Coordinator,
        writes: InFlightWrites,
        offsets: OffsetStore,
        admin: AdminClient,
        rate_buckets: dict[str, Any],
        started_ms: int,
    ) -> Parts:
        """The components, each given what it depends on."""
        table, app, settings, counters, log = self.table, self.app, self.settings, self.counters, self.log
        claims = PartitionClaims(
            table,
            coordinator,
            writes,
            offsets,
            settings,
            self.time_limits,
            counters,
            log,
            new_slot=lambda start: Slot.create(context, start),
            shared_low_water_marks=self.shared.low_water_marks if self.shared.topics else None,
        )
        pool = WorkerPool(
            table,
            claims,
            app,
            self.app_path,
            settings,
            self.time_limits,
            counters,
            log,
            start_process=fork_server_starter(context),
            fail=self._fail,
            rate_buckets=rate_buckets,
        )
        remote = RemoteControl(
            table,
            coordinator,
            settings,
            log,
            started_ms,
            hand_over=claims.hand_over,
            drain=claims.drain,
            shut_down=self._begin_graceful_stop,
            hold_back_shared=self._hold_back_shared,
            shared_topics=self.shared.topics.keys(),
        )
        topics = TopicWatch(table, app, settings, admin, coordinator.partition_count, log, self._fail, self._stop_asked)
        components: tuple[tuple[str, Component], ...] = (
            ("message claims", MessageClaims(table, coordinator, writes, settings, counters, log)),
            ("write verdicts", WriteVerdicts(writes)),
            ("worker pool", pool),
            ("shared pool", SharedPoolStep(self.shared, table, self._fail)),
            ("topic watch", topics),
            ("checkpoints", CheckpointWriter(table, coordinator, writes, settings, log)),
            ("remote control", remote),
            ("partition claims", claims),
        )
        return Parts(coordinator, writes, claims, pool, topics, components)

    def _hold_back_shared(self, topics: set[str]) -> None:
        """The shared topics to lease no more ranges of (an operator paused them, or drained us)."""
        self.shared.hold_back(topics)

    def _stop_asked(self) -> bool:
        """Has SIGTERM, SIGINT or SIGHUP come (start-up steps give up on it)?"""
        return self.table.stop_signalled

    def _stopped_during_start_up(self) -> None:
        """A stop signal interrupted the start-up: nothing was claimed, so nothing is released; exit 0 (SIGHUP: the
        command runs again, as after a graceful restart)."""
        received = []
        while not self._signals.empty():
            received.append(self._signals.get_nowait())
        stops = [signum for signum in received if signum in (signal.SIGTERM, signal.SIGINT)]
        self.restart_requested = not stops and signal.SIGHUP in received
        name = signal.Signals(stops[0] if stops else signal.SIGHUP).name
        self.log.info(
            "%s during start-up: stopped before claiming anything (nothing to release)%s",
            name,
            ", restarting" if self.restart_requested else "",
        )

    def _log_stop(self) -> None:
        """The last line: a clean stop says so at INFO, with what it released and how long it took."""
        if self._stop_began is None:
            return  # SIGQUIT: it said so already
        released = sum(self.counters.releases.values()) - self._releases_before_stop
        not_confirmed = self.counters.release_failures - self._unconfirmed_before_stop
        if not_confirmed and self.exit_code == 0:
            self.exit_code = ExitCode.KAFKA_UNAVAILABLE  # not a clean stop: scripts and systemd should know
        line = stop_line(
            released, time.monotonic() - self._stop_began, self.exit_code, self._workers_killed, not_confirmed
        )
        if self.exit_code == 0 and not self._workers_killed:
            self.log.info("%s%s", line, ", restarting" if self.restart_requested else "")
        else:
            self.log.warning("%s", line)

    def _timed(self, name: str, step: Callable[[], None]) -> None:
        """Every step of the loop should take milliseconds: AMO workers wait for it to answer their claims."""
        began = time.monotonic()
        step()
        seconds = time.monotonic() - began
        if seconds > self.hb_s / 4:
            self.log.warning("the supervisor loop spent %.2fs in %s: workers waited meanwhile", seconds, name)

    def _after_unexpected_error(self) -> None:
        """A bug or an unforeseen Kafka error: stop in order (releasing) rather than die holding partitions."""
        self.log.exception("unexpected error in the supervisor loop")
        self._unexpected_errors += 1
        if self.exit_code == 0:
            self.exit_code = ExitCode.FAILURE
        if self.table.running:
            self._begin_graceful_stop()
        elif self._unexpected_errors > 20:
            self.log.error("the supervisor keeps failing while stopping: exiting without releasing the rest")
            self._quit_now()
        else:
            time.sleep(0.1)

    def _fail(self, exit_code: int) -> None:
        """Something every worker would hit too (a worker that cannot start, a changed coordination topic): stop
        with ``exit_code``."""
        self.exit_code = exit_code
        if self.table.running:
            self._begin_graceful_stop()

    # ------------------------------------------------------------- signals

    def _install_signal_handlers(self) -> None:
        self._wakeup_r, wakeup_w = wakeup_pair()
        self._wakeup_w = wakeup_w  # kept open for the handler's wake-ups
        signal.set_wakeup_fd(wakeup_w.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(signum, self._record_signal)

    def _record_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.put_nowait(signum)  # nothing else here: no logging, no I/O
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.table.stop_signalled = True

    def _handle_signals(self) -> None:
        while not self._signals.empty():
            signum = self._signals.get_nowait()
            if signum == signal.SIGUSR1:
                self._log_state()
            elif signum == signal.SIGUSR2:
                self._dump_tracebacks()
            elif signum == signal.SIGQUIT:
                self._quit_now()
            elif signum == signal.SIGHUP and self.table.running:
                self.log.info("SIGHUP: releasing every partition after its worker finishes, then restarting")
                self.restart_requested = True  # the command re-executes itself once run() returns (cli/running.py)
                self._begin_graceful_stop()
            elif signum == signal.SIGHUP:
                self.log.info("SIGHUP while stopping: ignored")
            elif self.table.running:
                self.log.info("%s: releasing every partition after its worker finishes", signal.Signals(signum).name)
                self._begin_graceful_stop()
            else:
                self.log.info("%s again: stopping workers now", signal.Signals(signum).name)
                self._workers_killed = True
                self._kill_workers()

    def _dump_tracebacks(self) -> None:
        """SIGUSR2: every thread's stack, of the supervisor and of each worker (they dump their own on it)."""
        self.log.info("SIGUSR2: the supervisor's threads, then each worker's, follow on stderr")
        faulthandler.dump_traceback(all_threads=True)
        self._require_parts().pool.signal_workers(signal.SIGUSR2)
        self.shared.signal_workers(signal.SIGUSR2)

    def _log_state(self) -> None:
        """SIGUSR1: everything the supervisor knows, in one log line (JSON after "state: ")."""
        self.log.info("state: %s", orjson.dumps(self.state_document()).decode())

    def state_document(self) -> dict[str, Any]:
        """Everything the supervisor knows (SIGUSR1's log line, the /state probe); safe from another thread."""
        for _ in range(5):
            try:
                return self._state_document()
            except RuntimeError:  # a dict changed size under us (the probe's thread): read it again
                time.sleep(0.001)
        return {"phase": self.table.phase.value, "error": "the state kept changing while it was read"}

    def _state_document(self) -> dict[str, Any]:
        parts, table, now = self._require_parts(), self.table, time.monotonic()
        return {
            "phase": table.phase.value,
            "claiming": parts.claims.claiming,
            "drained": parts.claims.drained,
            "balance": self.settings.balance,
            "topics": dict(table.partition_counts) | dict(table.shared_partition_counts),
            "partitions": [a.state(now) for a in sorted(table.assignments.values(), key=lambda a: a.key)],
            "shared": self.shared.state(),
            "cooling_down": [f"{t}[{p}]" for t, p in parts.claims.cooling_down(time.monotonic())],
            "writes_in_flight": parts.writes.counts(),
        }

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the loop ticked within an HB and the last coordination write was confirmed (not failed)."""
        writes = self._require_parts().writes
        return loop_health(
            time.monotonic() - self._last_tick,
            self.hb_s,
            writes.last_confirmed,
            writes.last_failed,
            self.table.phase.value,
        )

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: caught up with the coordination log (start-up read it) and running, so it may claim."""
        claiming = self._parts is None or self._parts.claims.claiming  # (before start-up: not stopped claiming)
        ready = self._coordinator is not None and self.table.running and claiming
        return ready, {"phase": self.table.phase.value, "claiming": claiming}

    # ------------------------------------------------------------- stopping

    def _begin_graceful_stop(self) -> None:
        self.table.phase = Phase.STOPPING
        self._stop_began = time.monotonic()
        self._releases_before_stop = sum(self.counters.releases.values())
        self._unconfirmed_before_stop = self.counters.release_failures
        self._stop_deadline = time.monotonic() + self.settings.shutdown_timeout
        for _, component in self._require_parts().components:
            component.begin_stop()
        self._check_stop_progress(time.monotonic())

    def _check_stop_progress(self, now: float) -> None:
        if self.table.phase is not Phase.STOPPING:
            return
        if all(component.stopped() for _, component in self._require_parts().components):
            self.table.phase = Phase.STOPPED  # (a claim won meanwhile is released, a range leased is cancelled)
        elif self._stop_deadline is not None and now > self._stop_deadline:
            self.log.warning("shutdown_timeout (%gs) passed: killing the workers left", self.settings.shutdown_timeout)
            self._stop_deadline = None
            self._workers_killed = True
            self._kill_workers()

    def _kill_workers(self) -> None:
        """SIGKILL every worker; each is released at its last progress when reaped."""
        self.table.phase = Phase.STOPPING
        self._require_parts().pool.kill_workers()
        self.shared.kill_workers()

    def _quit_now(self) -> None:
        """SIGQUIT: exit at once, release nothing (others take over after 2*HB)."""
        self.log.warning("SIGQUIT: exiting without releasing; partitions go stale after 2*HB")
        self._require_parts().pool.signal_workers(signal.SIGKILL)
        self.shared.kill_workers()
        self.table.assignments.clear()
        self.table.phase = Phase.STOPPED
        self._stop_began = None  # no last line but the warning above: nothing was released

    # ------------------------------------------------------- waiting loop

    def _wait_for_events(self, parts: Parts) -> None:
        """Sleep until a signal, a worker's message or exit, a fold worth acting on, or the next tick."""
        assert self._wakeup_r is not None
        own_folds = parts.coordinator.own_folds()
        waitables: list[object] = [self._wakeup_r, own_folds]
        for _, component in parts.components:
            waitables.extend(component.waitables())
        # own_folds also wakes us when a delivery report of ours comes (Coordinator._serve_deliveries).
        self.table.ready = self._waiter.wait(waitables, timeout=0 if self.table.to_start else TICK_S)
        drain(own_folds)
        drain(self._wakeup_r)

    # -------------------------------------------------------------- metrics

    def metrics_snapshot(self) -> Snapshot:
        """What the metrics endpoint shows; called from its thread, so it only reads."""
        now = time.monotonic()
        partitions = [a.stats(now) for a in sorted(self.table.assignments.values(), key=lambda a: a.key)]
        counters = replace(
            self.counters,
            releases=collections.Counter(self.counters.releases),
            worker_restarts=collections.Counter(self.counters.worker_restarts),
        )
        coordinator = self._require_parts().coordinator
        traffic = coordinator.traffic
        return Snapshot(
            self.group,
            partitions,
            counters,
            coordinator.garbage_seen,
            self.shared.stats(),
            coordinator.fetch_stalls,
            traffic.records,
            traffic.batches,
            traffic.requests,
        )

    def _serve_metrics(self) -> None:
        """The metrics port: Prometheus, the probes, /autoscale, /asyncapi.json and (run --dashboard) the dashboard."""
        # Imported here: prometheus_client, http.server and the rest cost a start-up that serves none 37 ms of CPU.
        from marshal_workers.handlers.asyncapi import asyncapi_json
        from marshal_workers.observe.autoscale_meter import AutoscaleMeter
        from marshal_workers.observe.dashboard import Publisher
        from marshal_workers.observe.metrics_server import MetricsServer

        if self.settings.dashboard:
            self._dashboard = Publisher(self._dashboard_step()).start()
        autoscale = AutoscaleMeter(self._dashboard_step(), self.settings).start()
        self._metrics = MetricsServer(
            self.settings.metrics_host,
            self.settings.metrics_port,
            self.metrics_snapshot,
            Probes(health=self.health, ready=self.readiness, state=self.state_document),
            self._dashboard,
            asyncapi=lambda: asyncapi_json(self.app, brokers=self.settings.brokers),
            autoscale=autoscale.answer,
        )

    def _dashboard_step(self) -> Callable[[Dashboard], Dashboard]:
        """The dashboard's update from our own WorldState, and the ends our workers' fetches saw."""
        from marshal_workers.observe.dashboard import supervisor_step  # as _serve_metrics: only with a metrics port

        table = self.table
        return supervisor_step(
            self._require_parts().coordinator.read,
            lambda: {a.key: a.high_watermark for a in list(table.assignments.values()) if a.high_watermark is not None},
            lambda: dict(table.partition_counts),
        )

    # ----------------------------------------------------------- plumbing

    def _require_parts(self) -> Parts:
        assert self._parts is not None, "the supervisor has not started"
        return self._parts

    def _close(self) -> None:
        parts = self._parts
        if parts is not None:
            parts.pool.signal_workers(signal.SIGKILL)
            parts.topics.close()
        if self._dashboard is not None:
            self._dashboard.close()  # first: its event streams end, so the metrics server's threads do too
        if self._metrics is not None:
            self._metrics.close()
        if self._offsets is not None:
            self._offsets.close()
        if self._coordinator is not None:
            self._coordinator.close()
        self._waiter.close()
