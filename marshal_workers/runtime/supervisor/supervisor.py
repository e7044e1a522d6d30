"""The supervisor: the main loop, the signals and the shutdown of one ``marshal-workers run``.

Shaped like gunicorn's arbiter.  Signal handlers only record the signal; the
main loop waits for a signal, a worker's request or exit, or the next tick,
then does one thing per step: handle signals, answer AMO claims, reap
workers, tend the shared pool, heartbeat, claim, refresh topics, restart
crashed workers.  The supervisor holds two kinds of assignment, each with
its own policy:

* whole partitions, one worker each: claimed, heartbeated, balanced and
  released by PartitionClaims (partition_claims.py), their workers forked,
  reaped and restarted by WorkerPool (worker_pool.py);
* ranges of shared partitions, leased for ``--processes`` workers per shared
  handler: the SharedPool (shared_pool.py).

All coordination I/O happens here, on the main thread, without waiting on
Kafka (in_flight.py).  Workers come from a fork server started before any
Kafka client exists (librdkafka is not fork-safe), with the application
module preloaded.
"""

from __future__ import annotations

import collections
import concurrent.futures
import faulthandler
import logging
import queue
import random
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.context import BaseContext
from types import FrameType
from typing import Any

import orjson
import setproctitle
from confluent_kafka.admin import AdminClient

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.core.logs import group_log
from marshal_workers.errors import StopRequested, UnknownTopicError
from marshal_workers.handlers.app import App, OnError, effective_time_limits
from marshal_workers.handlers.rate_limits import create_buckets
from marshal_workers.kafka.coordination_log import drain, wakeup_pair
from marshal_workers.kafka.coordinator import Coordinator
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.kafka.kafka_clients import admin_client, cluster_metadata, ensure_topic
from marshal_workers.kafka.offsets import OffsetStore
from marshal_workers.observe.dashboard import Publisher, supervisor_step
from marshal_workers.observe.dashboard_model import Dashboard
from marshal_workers.observe.metrics import Counters, MetricsServer, PartitionStats, Probes, Snapshot
from marshal_workers.protocol import checkpoints
from marshal_workers.protocol.balance import (
    BalanceState,
)
from marshal_workers.protocol.health import HealthPolicy
from marshal_workers.protocol.restarts import RestartPolicy
from marshal_workers.runtime.channel import Field, monotonic_ms
from marshal_workers.runtime.supervisor.assignments import Assignment, Key, Phase, Timers
from marshal_workers.runtime.supervisor.partition_claims import PartitionClaims
from marshal_workers.runtime.supervisor.remote_control import RemoteControl
from marshal_workers.runtime.supervisor.shared_pool import SharedPool
from marshal_workers.runtime.supervisor.supervisor_lines import start_line, stop_line
from marshal_workers.runtime.supervisor.waiter import Waiter
from marshal_workers.runtime.supervisor.worker_pool import WorkerPool

_log = logging.getLogger(__name__)

TICK_S = 0.1
CLAIM_INTERVAL_S = 0.25


class Supervisor(PartitionClaims, WorkerPool, RemoteControl):
    """The loop, the signals and the shutdown; whole partitions are claimed by PartitionClaims
    (partition_claims.py) and run by WorkerPool (worker_pool.py), ranges of shared partitions by the
    SharedPool (shared_pool.py)."""

    def __init__(self, app: App, app_path: str, settings: Settings) -> None:
        self.app = app
        self.app_path = app_path
        self.settings = settings
        self.group = settings.require_group()
        self.log = group_log(_log, self.group)
        self.hb_s = settings.heartbeat_interval
        self.restart_policy = RestartPolicy(limit=settings.crash_limit)
        # (soft, hard) seconds per topic; checked here so a bad combination fails before any fork.
        self.time_limits = {topic: effective_time_limits(h, settings) for topic, h in app.handlers.items()}
        # A handler call in flight is progress until it passes its time limit (hard, else soft; none: ever).
        self.health_policies = {
            topic: HealthPolicy(behind_cycles=settings.behind_cycles, stall_after_s=settings.heartbeat_interval,
                                call_time_limit=hard or soft)
            for topic, (soft, hard) in self.time_limits.items()
        }  # fmt: skip
        self.assignments: dict[Key, Assignment] = {}
        self.cooldown_until: dict[Key, float] = {}  # monotonic; partitions released as sick
        self.partition_counts: dict[str, int] = {}  # topics whose partitions are claimed whole
        self.shared_partition_counts: dict[str, int] = {}  # shared handlers' topics (shared_pool)
        self.shared = SharedPool(app, app_path, settings, self.log, self.shared_partition_counts.get)
        self.phase = Phase.RUNNING
        self.exit_code = 0
        self.restart_requested = False
        self._last_tick = time.monotonic()  # the end of the loop's last pass (/healthz)  # SIGHUP: stop as on SIGTERM, then the command runs itself again
        self.claiming = True
        self.drained = False  # an operator drained our client (remote_control.py)
        self.started_ms = 0  # coordinator time at start: an operator's shutdown order before it is not for us
        self.timers = Timers()
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._context: BaseContext | None = None
        self.rate_buckets: dict[str, Any] = {}  # rate-limited topic -> its token bucket (rate_limits.py)
        self._coordinator: Coordinator | None = None
        self._offsets: OffsetStore | None = None
        self._wakeup_r: socket.socket | None = None
        self._admin: AdminClient | None = None
        self._writes: InFlightWrites | None = None  # every coordination write of the loop: it never waits on one
        self._claiming: set[Key] = set()  # claims in flight
        self._checkpointing: set[int] = set()  # coordination partitions whose checkpoint is being written
        self._releasing: set[Key] = set()  # releases in flight
        self._stop_signalled = False  # SIGTERM/SIGINT received, perhaps not handled yet: fork nothing more
        self._announced = False  # our first claims are written: later rounds claim our part at once
        self._to_start: collections.deque[Assignment] = collections.deque()  # claimed, worker not started yet
        self._waiter = Waiter()
        self._held_claims = []  # AMO claims asked while one message-claim write is in flight (group commit)
        self._message_claims_in_flight = False
        self.ready: set[object] = set()  # what the loop's last wait found readable: workers' pipes and sentinels
        self._metadata_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata")
        self._metadata: concurrent.futures.Future[Any] | None = None  # a refresh under way
        self._unexpected_errors = 0
        self._balance = BalanceState()
        self._free_since: dict[Key, float] = {}  # monotonic: when a partition was first seen free
        self.counters = Counters()
        self.shared.record_outcomes = self.counters.add_outcomes  # what became of shared handlers' failed calls
        self._metrics: MetricsServer | None = None
        # The graceful stop: when it began (monotonic), releases written before it, whether workers were killed.
        self._stop_began: float | None = None
        self._releases_before_stop = 0
        self._workers_killed = False
        self._dashboard: Publisher | None = None  # run --dashboard: documents for /dashboard on the metrics port

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
            steps = (
                self._handle_signals,
                self._submit_message_claims,
                self._collect_writes,
                self._start_queued_workers,
                self._reap_workers,
                self._tend_shared_pool,
                self._periodic_work,
            )
            while self.phase is not Phase.STOPPED:
                try:
                    self._wait_for_events()
                    for step in steps:
                        began = time.monotonic()
                        step()
                        self._warn_if_slow(step, time.monotonic() - began)
                    self._unexpected_errors = 0
                    self._last_tick = time.monotonic()
                except Exception:
                    self._after_unexpected_error()
            self._log_stop()
        finally:
            self._close()
        return self.exit_code

    def _start_up(self) -> None:
        """Everything before the loop.  A stop signal meanwhile interrupts the steps that wait on Kafka within a
        fraction of a second (StopRequested; stopping.py): nothing is claimed before the loop, so nothing is held."""
        should_stop = self._stop_asked
        self._context = self._start_fork_server()  # before any Kafka client exists
        # One bucket per rate-limited handler, shared by all its workers (rate_limits.py).
        self.rate_buckets = create_buckets(self._context, {t: h.rate_limit for t, h in self.app.handlers.items()})
        self.shared.rate_buckets = self.rate_buckets
        coordinator = Coordinator(self.settings)
        self._coordinator = coordinator.start(should_stop, member=True)
        self.started_ms = coordinator.now_ms()
        self._writes = InFlightWrites(coordinator)
        self._offsets = OffsetStore(self.settings)
        self._admin = admin_client(self.settings)
        self.shared.attach(self._context, coordinator, self._writes, self._offsets)
        self._refresh_topics(first=True)
        if self.settings.metrics_port:
            if self.settings.dashboard:
                self._dashboard = Publisher(self._dashboard_step()).start()
            self._metrics = MetricsServer(
                self.settings.metrics_host, self.settings.metrics_port, self.metrics_snapshot,
                Probes(health=self.health, ready=self.readiness, state=self.state_document), self._dashboard,
            )  # fmt: skip
        setproctitle.setproctitle(f"marshal-workers: supervisor {self.group}")
        line = start_line(self.app, self.app_path, self.settings, coordinator.client, coordinator.instance)
        self.log.info("%s", line)

    def _stop_asked(self) -> bool:
        """Has SIGTERM, SIGINT or SIGHUP come (start-up steps give up on it)?"""
        return self._stop_signalled

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
            name, ", restarting" if self.restart_requested else "",
        )  # fmt: skip

    def _log_stop(self) -> None:
        """The last line: a clean stop says so at INFO, with what it released and how long it took."""
        if self._stop_began is None:
            return  # SIGQUIT: it said so already
        released = sum(self.counters.releases.values()) - self._releases_before_stop
        line = stop_line(released, time.monotonic() - self._stop_began, self.exit_code, self._workers_killed)
        if self.exit_code == 0 and not self._workers_killed:
            self.log.info("%s%s", line, ", restarting" if self.restart_requested else "")
        else:
            self.log.warning("%s", line)

    def _warn_if_slow(self, step: Callable[[], None], seconds: float) -> None:
        """Every step of the loop should take milliseconds: AMO workers wait for it to answer their claims."""
        if seconds > self.hb_s / 4:
            self.log.warning("the supervisor loop spent %.2fs in %s: workers waited meanwhile", seconds, step.__name__)

    def _after_unexpected_error(self) -> None:
        """A bug or an unforeseen Kafka error: stop in order (releasing) rather than die holding partitions."""
        self.log.exception("unexpected error in the supervisor loop")
        self._unexpected_errors += 1
        if self.exit_code == 0:
            self.exit_code = ExitCode.FAILURE
        if self.phase is Phase.RUNNING:
            self._begin_graceful_stop()
        elif self._unexpected_errors > 20:
            self.log.error("the supervisor keeps failing while stopping: exiting without releasing the rest")
            self._quit_now()
        else:
            time.sleep(0.1)

    def _tend_shared_pool(self) -> None:
        self.shared.step()
        if self.shared.boot_failed and self.phase is Phase.RUNNING:
            self.exit_code = ExitCode.WORKER_BOOT_ERROR
            self._begin_graceful_stop()

    def _periodic_work(self) -> None:
        now = time.monotonic()
        if now >= self.timers.heartbeat:
            self.timers.heartbeat = now + self.hb_s / 2
            self._obey_operators()
            self._heartbeat()
            self._rebalance()
        if now >= self.timers.topics:
            self.timers.topics = now + max(2 * self.hb_s, 5.0)
            self._refresh_topics()
        if now >= self.timers.checkpoint:
            self.timers.checkpoint = now + self.hb_s
            self._write_checkpoints()
        self._take_metadata()
        if now >= self.timers.claim:
            self.timers.claim = now + CLAIM_INTERVAL_S * random.uniform(0.5, 1.5)
            self._claim_free_partitions()
        self._watch_calls()
        self._enforce_time_limits()
        self._restart_due_workers(now)
        self._check_stop_progress(now)

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
            self._stop_signalled = True

    def _handle_signals(self) -> None:
        while not self._signals.empty():
            signum = self._signals.get_nowait()
            if signum == signal.SIGUSR1:
                self._log_state()
            elif signum == signal.SIGUSR2:
                self._dump_tracebacks()
            elif signum == signal.SIGQUIT:
                self._quit_now()
            elif signum == signal.SIGHUP and self.phase is Phase.RUNNING:
                self.log.info("SIGHUP: releasing every partition after its worker finishes, then restarting")
                self.restart_requested = True  # the command re-executes itself once run() returns (cli.py)
                self._begin_graceful_stop()
            elif signum == signal.SIGHUP:
                self.log.info("SIGHUP while stopping: ignored")
            elif self.phase is Phase.RUNNING:
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
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGUSR2)
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
        return {"phase": self.phase.value, "error": "the state kept changing while it was read"}

    def _state_document(self) -> dict[str, Any]:
        partitions = []
        now = time.monotonic()
        for a in sorted(list(self.assignments.values()), key=lambda a: a.key):
            call_age = a.call_age(now)
            partitions.append(
                {
                    "topic": a.topic,
                    "partition": a.partition,
                    "worker_pid": None if a.process is None else a.process.pid,
                    "next_offset": a.next_offset,
                    "high_watermark": a.high_watermark,
                    "lag": a.lag,
                    "processed": a.slot.get(Field.PROCESSED),
                    "dead_lettered": a.slot.get(Field.DEAD_LETTERED),
                    "in_flight": a.calls_in_flight,
                    "call_age_s": None if call_age is None else round(call_age, 3),
                    "window_used": a.slot.get(Field.WINDOW_USED),
                    "lease_left_s": round((a.slot.get(Field.LEASE_UNTIL_MS) - monotonic_ms()) / 1000, 3),
                    "crashes_in_a_row": a.crashes_in_a_row,
                    "claimed_end": a.claimed_end,
                    "lost": a.lost,
                    "unhealthy": a.unhealthy,
                    "handing_over": a.handing_over,
                }
            )
        state = {
            "phase": self.phase.value,
            "claiming": self.claiming,
            "drained": self.drained,
            "balance": self.settings.balance,
            "topics": dict(self.partition_counts) | dict(self.shared_partition_counts),
            "partitions": partitions,
            "shared": self.shared.state(),
            "cooling_down": [f"{t}[{p}]" for (t, p), until in list(self.cooldown_until.items()) if until > time.monotonic()],
            "writes_in_flight": self._require_writes().counts(),
        }
        return state

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the loop ticked within an HB and the last coordination write was confirmed (not failed)."""
        tick_age = time.monotonic() - self._last_tick
        writes = self._require_writes()
        confirmed = writes.last_confirmed >= writes.last_failed
        detail = {"loop_tick_age_s": round(tick_age, 3), "last_write_confirmed": confirmed, "phase": self.phase.value}
        return tick_age < self.hb_s and confirmed, detail

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: caught up with the coordination log (start-up read it) and running, so it may claim."""
        ready = self._coordinator is not None and self.phase is Phase.RUNNING and self.claiming
        return ready, {"phase": self.phase.value, "claiming": self.claiming}

    def _begin_graceful_stop(self) -> None:
        self.phase = Phase.STOPPING
        self._stop_began = time.monotonic()
        self._releases_before_stop = sum(self.counters.releases.values())
        self.timers.stop_deadline = time.monotonic() + self.settings.shutdown_timeout
        for assignment in list(self.assignments.values()):
            if assignment.process is None:
                self._release(assignment)  # waiting for a restart: nothing runs, release at once
            else:
                self._stop_worker(assignment)
        self.shared.begin_stop()
        self._check_stop_progress(time.monotonic())

    def _check_stop_progress(self, now: float) -> None:
        if self.phase is not Phase.STOPPING:
            return
        if not self.assignments and not self._releasing and not self._claiming and self.shared.stopped():
            self.phase = Phase.STOPPED  # (a claim won meanwhile is released, a range leased is cancelled)
        elif self.timers.stop_deadline is not None and now > self.timers.stop_deadline:
            self.log.warning("shutdown_timeout (%gs) passed: killing the workers left", self.settings.shutdown_timeout)
            self.timers.stop_deadline = None
            self._workers_killed = True
            self._kill_workers()


    def _quit_now(self) -> None:
        """SIGQUIT: exit at once, release nothing (others take over after 2*HB)."""
        self.log.warning("SIGQUIT: exiting without releasing; partitions go stale after 2*HB")
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGKILL)
        self.shared.kill_workers()
        self.assignments.clear()
        self.phase = Phase.STOPPED
        self._stop_began = None  # no last line but the warning above: nothing was released


    # ------------------------------------------------------- waiting loop

    def _wait_for_events(self) -> None:
        """Sleep until a signal, a worker's message or exit, a fold worth acting on, or the next tick."""
        assert self._wakeup_r is not None
        coordinator = self._require_coordinator()
        releases, own_folds = coordinator.release_events(), coordinator.own_folds()
        waitables: list[object] = [self._wakeup_r, releases, own_folds, *self.shared.waitables()]
        for assignment in self.assignments.values():
            if assignment.process is not None:
                waitables.append(assignment.process.sentinel)
                if assignment.connection is not None:
                    waitables.append(assignment.connection)
        # own_folds also wakes us when a delivery report of ours comes (Coordinator._serve_deliveries).
        ready = self._waiter.wait(waitables, timeout=0 if self._to_start else TICK_S)
        self.ready = ready
        if releases in ready:
            drain(releases)
            self.timers.claim = 0.0  # a partition was released: try to take it now, not at the next tick
        drain(own_folds)
        drain(self._wakeup_r)

    # --------------------------------------------------------------- topics

    def _refresh_topics(self, first: bool = False) -> None:
        """Learn the partition counts of the handlers' topics; new partitions get claimed.

        Only the first time in the loop's thread: later, a metadata request (which waits for a broker that
        does not answer) runs on a thread of its own, and _take_metadata applies its answer.
        """
        admin = self._admin
        assert admin is not None
        if first:
            self._apply_metadata(cluster_metadata(admin, self.settings, self._stop_asked), first=True)
        elif self._metadata is None:
            self._metadata = self._metadata_thread.submit(cluster_metadata, admin, self.settings)

    def _take_metadata(self) -> None:
        if self._metadata is None or not self._metadata.done():
            return
        future, self._metadata = self._metadata, None
        try:
            metadata = future.result()
        except Exception as exc:
            self.log.warning("could not refresh topic metadata: %s", exc)
            return
        self._apply_metadata(metadata)

    def _apply_metadata(self, metadata: Any, first: bool = False) -> None:
        admin = self._admin
        assert admin is not None
        self._check_coordination_partitions(metadata)
        for topic in self.app.topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                if first:
                    raise UnknownTopicError(
                        f"handler topic {topic!r} does not exist on {self.settings.brokers}; create it, "
                        "or remove its handler"
                    )
                self.log.error("topic %s has disappeared from the cluster", topic)
                continue
            count = len(found.partitions)
            counts = self.shared_partition_counts if self.app.handlers[topic].shared else self.partition_counts
            if topic in counts and count != counts[topic]:
                self.log.info("topic %s now has %d partitions (was %d)", topic, count, counts[topic])
            counts[topic] = count
            if first and self.app.handlers[topic].on_error is OnError.DLQ:
                dlq_topic = self.app.handlers[topic].dlq_topic
                ensure_topic(admin, self.settings, dlq_topic, count, should_stop=self._stop_asked)

    def _check_coordination_partitions(self, metadata: Any) -> None:
        """Routing is md5(topic) mod the coordination topic's partition count: if the count changed, members
        started before and after the change write about a topic to different logs.  Stop rather than split."""
        coordinator = self._require_coordinator()
        found = metadata.topics.get(self.settings.coordination_topic)
        count = None if found is None or found.error is not None else len(found.partitions)
        if count is None or count == coordinator.partition_count or self.phase is not Phase.RUNNING:
            return
        self.log.error(
            "the coordination topic %s now has %d partitions (it had %d when we started): members would route "
            "records differently; stopping. Restart every member of the group together.",
            self.settings.coordination_topic, count, coordinator.partition_count,
        )  # fmt: skip
        self.exit_code = ExitCode.COORDINATION_ERROR
        self._begin_graceful_stop()

    def _collect_writes(self) -> None:
        self._require_writes().collect()

    # ---------------------------------------------------------- checkpoints

    def _write_checkpoints(self) -> None:
        """Write the checkpoint of each coordination partition that is due from us (checkpoints.due)."""
        interval_ms = round(self.settings.checkpoint_interval * 1000)
        if not interval_ms or self.phase is not Phase.RUNNING:
            return
        coordinator, me = self._require_coordinator(), self._me()
        now_ms = coordinator.now_ms()
        for partition in range(coordinator.partition_count):
            if partition in self._checkpointing:
                continue
            if not coordinator.read(lambda world: checkpoints.due(world, partition, now_ms, interval_ms, me)):
                continue
            records = coordinator.checkpoint_records(partition)
            self._checkpointing.add(partition)
            self._require_writes().submit(
                "checkpoint",
                records,
                lambda _verdicts, p=partition: self._checkpointing.discard(p),
                lambda exc, p=partition: self._checkpoint_failed(p, exc),
                partitions=[partition] * len(records),
            )

    def _checkpoint_failed(self, partition: int, exc: Exception) -> None:
        self._checkpointing.discard(partition)
        self.log.warning("checkpoint of coordination partition %d not confirmed: %s", partition, exc)

    # -------------------------------------------------------------- metrics

    def metrics_snapshot(self) -> Snapshot:
        """What the metrics endpoint shows; called from its thread, so it only reads."""
        partitions = []
        now = time.monotonic()
        for a in sorted(list(self.assignments.values()), key=lambda a: a.key):
            partitions.append(
                PartitionStats(
                    topic=a.topic,
                    partition=a.partition,
                    next_offset=a.next_offset,
                    high_watermark=a.high_watermark,
                    lag=a.lag,
                    messages_per_second=a.health.consume_rate,
                    handled=a.slot.get(Field.PROCESSED),
                    dead_lettered=a.slot.get(Field.DEAD_LETTERED),
                    in_flight=a.calls_in_flight,
                    call_age_s=a.call_age(now) or 0.0,
                    window_used=a.slot.get(Field.WINDOW_USED),
                    fetch_stalls=a.slot.get(Field.FETCH_STALLS),
                    latency_counts=a.slot.latency_counts(),
                    latency_sum_s=a.slot.get(Field.LATENCY_SUM_NS) / 1e9,
                )
            )
        counters = replace(
            self.counters, releases=collections.Counter(self.counters.releases),
            worker_restarts=collections.Counter(self.counters.worker_restarts),
        )  # fmt: skip
        coordinator = self._require_coordinator()
        return Snapshot(
            self.group, partitions, counters, coordinator.garbage_seen, self.shared.stats(), coordinator.fetch_stalls
        )

    def _dashboard_step(self) -> Callable[[Dashboard], Dashboard]:
        """The dashboard's update from our own WorldState, and the ends our workers' fetches saw."""
        return supervisor_step(
            self._require_coordinator().read,
            lambda: {a.key: a.high_watermark for a in list(self.assignments.values()) if a.high_watermark is not None},
            lambda: dict(self.partition_counts),
        )

    # ----------------------------------------------------------- plumbing


    def _require_coordinator(self) -> Coordinator:
        assert self._coordinator is not None
        return self._coordinator

    def _require_writes(self) -> InFlightWrites:
        assert self._writes is not None
        return self._writes

    def _require_offsets(self) -> OffsetStore:
        assert self._offsets is not None
        return self._offsets

    def _close(self) -> None:
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGKILL)
        self._metadata_thread.shutdown(wait=False, cancel_futures=True)
        if self._dashboard is not None:
            self._dashboard.close()  # first: its event streams end, so the metrics server's threads do too
        if self._metrics is not None:
            self._metrics.close()
        if self._offsets is not None:
            self._offsets.close()
        if self._coordinator is not None:
            self._coordinator.close()
        self._waiter.close()
