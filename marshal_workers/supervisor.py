"""The supervisor: claims partitions, runs one worker per partition, hands them over.

Shaped like gunicorn's arbiter.  Signal handlers only record the signal; the
main loop waits for a signal, a worker's request or exit, or the next tick,
then does one thing per method: handle signals, answer AMO claims, reap
workers, heartbeat, claim, refresh topics, restart crashed workers.

All coordination I/O happens here, on the main thread.  Workers come from a
fork server started before any Kafka client exists (librdkafka is not
fork-safe), with the application module preloaded.
"""

from __future__ import annotations

import collections
import concurrent.futures
import enum
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import queue
import random
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import orjson
import setproctitle
from confluent_kafka.admin import AdminClient

from marshal_workers import checkpoints, done_set
from marshal_workers.app import App, Mode, OnError, effective_time_limits
from marshal_workers.balance import (
    BalanceState,
    FairShare,
    claim_cap,
    fair_share,
    greedy_claims,
    is_hungry,
    partition_to_ask_for,
    partitions_to_hand_over,
    settled,
    yields_to_askers,
)
from marshal_workers.channel import ClaimAnswer, Field, Slot, WorkerSpec, above, monotonic_ms
from marshal_workers.config import Settings
from marshal_workers.coordination_log import drain, wakeup_pair
from marshal_workers.coordinator import Coordinator, Progress, heartbeat_verdicts, message_claim_verdicts
from marshal_workers.errors import UnknownTopicError
from marshal_workers.exit_codes import ExitCode
from marshal_workers.health import HealthPolicy, PartitionHealth, Sample, observe
from marshal_workers.in_flight import InFlightWrites
from marshal_workers.kafka_clients import admin_client, cluster_metadata, ensure_topic
from marshal_workers.loader import split_app_path
from marshal_workers.logs import group_log
from marshal_workers.metrics import Counters, MetricsServer, PartitionStats, Snapshot
from marshal_workers.offsets import OffsetLookupError, OffsetStore
from marshal_workers.restarts import RestartPolicy
from marshal_workers.shared_pool import SharedPool
from marshal_workers.worker import WorkerExit, worker_main
from marshal_workers.world_state import Owner, WorldState

_log = logging.getLogger(__name__)

Key = tuple[str, int]
TICK_S = 0.1
CLAIM_INTERVAL_S = 0.25
CLAIMS_PER_TICK = 4  # our first claims (others see us), and partitions free for an HB, per round
START_BUDGET_S = 0.02  # seconds per pass of the loop spent starting the workers of new claims


class Phase(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # graceful: workers finish what they hold, then we release
    STOPPED = "stopped"


@dataclass
class Assignment:
    """A partition we own, and its worker."""

    topic: str
    partition: int
    slot: Slot
    process: BaseProcess | None = None
    connection: Connection | None = None
    started_offset: int = 0
    claimed_end: int = -1  # AMO: end of the last batch claim accepted; a restart never starts before it
    crashes_in_a_row: int = 0
    restart_at: float | None = None  # monotonic time of a pending restart
    lost: bool = False  # someone else owns it now: stop the worker, release nothing
    unhealthy: bool = False  # its worker cannot keep up: stop it and release the partition as sick
    handing_over: bool = False  # balance="fair": we hold more than our share; stop it and release it
    timed_out: tuple[int, int] | None = None  # messages [start, end) whose call the hard time limit is killing
    last_killed: tuple[int, int] | None = None  # the messages of the previous kill
    time_limit_kills: int = 0  # kills in a row on those same messages
    give_up_on: tuple[int, int] | None = None  # for the next worker: apply on_error to these, don't call
    claimed_at: float = field(default_factory=time.monotonic)
    health: PartitionHealth = field(default_factory=PartitionHealth)

    @property
    def key(self) -> Key:
        return (self.topic, self.partition)

    @property
    def next_offset(self) -> int:
        return self.slot.get(Field.NEXT_OFFSET)

    @property
    def high_watermark(self) -> int | None:
        """The partition's end as its worker's last fetch saw it; None before the first fetch."""
        high = self.slot.get(Field.HIGH_WATERMARK)
        return None if high < 0 else high

    @property
    def lag(self) -> int | None:
        high = self.high_watermark
        return None if high is None else max(high - self.next_offset, 0)


@dataclass
class Timers:
    """Monotonic times at which periodic work is next due."""

    heartbeat: float = 0.0
    claim: float = 0.0
    ask: float = 0.0  # the next time we may ask another member for a partition
    topics: float = 0.0
    checkpoint: float = 0.0
    stop_deadline: float | None = None


MessageClaim = tuple[Assignment, Connection | None, int]  # who asked (which worker's pipe), for what end offset


class Supervisor:
    def __init__(self, app: App, app_path: str, settings: Settings) -> None:
        self.app = app
        self.app_path = app_path
        self.settings = settings
        self.group = settings.require_group()
        self.log = group_log(_log, self.group)
        self.hb_s = settings.heartbeat_interval
        self.restart_policy = RestartPolicy(limit=settings.crash_limit)
        self.health_policy = HealthPolicy(behind_cycles=settings.behind_cycles, stall_after_s=settings.heartbeat_interval)
        # (soft, hard) seconds per topic; checked here so a bad combination fails before any fork.
        self.time_limits = {topic: effective_time_limits(h, settings) for topic, h in app.handlers.items()}
        self.assignments: dict[Key, Assignment] = {}
        self.cooldown_until: dict[Key, float] = {}  # monotonic; partitions released as sick
        self.partition_counts: dict[str, int] = {}  # topics whose partitions are claimed whole
        self.shared_partition_counts: dict[str, int] = {}  # shared handlers' topics (shared_pool)
        self.shared = SharedPool(app, app_path, settings, self.log, self.shared_partition_counts.get)
        self.phase = Phase.RUNNING
        self.exit_code = 0
        self.claiming = True
        self.timers = Timers()
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._context: BaseContext | None = None
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
        self._metadata_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata")
        self._metadata: concurrent.futures.Future[Any] | None = None  # a refresh under way
        self._unexpected_errors = 0
        self._balance = BalanceState()
        self._free_since: dict[Key, float] = {}  # monotonic: when a partition was first seen free
        self.counters = Counters()
        self._metrics: MetricsServer | None = None

    # ----------------------------------------------------------------- run

    def run(self) -> int:
        """Run until stopped; return the process exit code."""
        self._install_signal_handlers()
        self._context = self._start_fork_server()  # before any Kafka client exists
        self._coordinator = Coordinator(self.settings).start()
        self._writes = InFlightWrites(self._coordinator)
        self._offsets = OffsetStore(self.settings)
        self._admin = admin_client(self.settings)
        self.shared.attach(self._context, self._coordinator, self._writes, self._offsets)
        try:
            self._refresh_topics(first=True)
            if self.settings.metrics_port:
                self._metrics = MetricsServer(self.settings.metrics_host, self.settings.metrics_port, self.metrics_snapshot)
            setproctitle.setproctitle(f"marshal-workers: supervisor {self.group}")
            self.log.info(
                "supervisor %s/%s running %s on %s",
                self._coordinator.client, self._coordinator.instance, self.app, self.settings.brokers,
            )  # fmt: skip
            steps = (
                self._handle_signals,
                self._submit_message_claims,
                self._collect_writes,
                self._start_queued_workers,
                self._reap_workers,
                self.shared.step,
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
                except Exception:
                    self._after_unexpected_error()
        finally:
            self._close()
        return self.exit_code

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

    def _periodic_work(self) -> None:
        now = time.monotonic()
        if now >= self.timers.heartbeat:
            self.timers.heartbeat = now + self.hb_s / 2
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
        self._enforce_time_limits()
        self._restart_due_workers(now)
        self._check_stop_progress(now)

    # ------------------------------------------------------------- signals

    def _install_signal_handlers(self) -> None:
        self._wakeup_r, wakeup_w = wakeup_pair()
        self._wakeup_w = wakeup_w  # kept open for the handler's wake-ups
        signal.set_wakeup_fd(wakeup_w.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
            signal.signal(signum, self._record_signal)

    def _record_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.put_nowait(signum)  # nothing else here: no logging, no I/O
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stop_signalled = True

    def _handle_signals(self) -> None:
        while not self._signals.empty():
            signum = self._signals.get_nowait()
            if signum == signal.SIGUSR1:
                self._log_state()
            elif signum == signal.SIGQUIT:
                self._quit_now()
            elif self.phase is Phase.RUNNING:
                self.log.info("%s: releasing every partition after its worker finishes", signal.Signals(signum).name)
                self._begin_graceful_stop()
            else:
                self.log.info("%s again: stopping workers now", signal.Signals(signum).name)
                self._kill_workers()

    def _log_state(self) -> None:
        """SIGUSR1: everything the supervisor knows, in one log line (JSON after "state: ")."""
        partitions = []
        for a in sorted(self.assignments.values(), key=lambda a: a.key):
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
                    "in_flight": a.slot.get(Field.IN_FLIGHT),
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
            "balance": self.settings.balance,
            "topics": self.partition_counts | self.shared_partition_counts,
            "partitions": partitions,
            "shared": self.shared.state(),
            "cooling_down": [f"{t}[{p}]" for (t, p), until in self.cooldown_until.items() if until > time.monotonic()],
            "writes_in_flight": self._require_writes().counts(),
        }
        self.log.info("state: %s", orjson.dumps(state).decode())

    def _begin_graceful_stop(self) -> None:
        self.phase = Phase.STOPPING
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
            self._kill_workers()

    def _kill_workers(self) -> None:
        """SIGKILL every worker; each is released at its last progress when reaped."""
        self.phase = Phase.STOPPING
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGKILL)
        self.shared.kill_workers()

    def _quit_now(self) -> None:
        """SIGQUIT: exit at once, release nothing (others take over after 2*HB)."""
        self.log.warning("SIGQUIT: exiting without releasing; partitions go stale after 2*HB")
        for assignment in self.assignments.values():
            self._signal_worker(assignment, signal.SIGKILL)
        self.shared.kill_workers()
        self.assignments.clear()
        self.phase = Phase.STOPPED

    def _stop_worker(self, assignment: Assignment) -> None:
        """Ask a worker to finish the message or batch in hand and exit: the flag first, then the signal.

        A worker forked a moment ago still ignores SIGTERM (inherited from the fork server) until it
        installs its handler; it reads the flag right after doing so, so the request is never lost.
        """
        assignment.slot.set(Field.STOP_REQUESTED, 1)
        self._signal_worker(assignment, signal.SIGTERM)

    def _signal_worker(self, assignment: Assignment, signum: int) -> None:
        if assignment.process is not None and assignment.process.pid is not None:
            try:
                os.kill(assignment.process.pid, signum)
            except ProcessLookupError:
                pass

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
        ready = multiprocessing.connection.wait(waitables, timeout=0 if self._to_start else TICK_S)  # type: ignore[arg-type]
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
            self._apply_metadata(cluster_metadata(admin, self.settings), first=True)
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
                ensure_topic(admin, self.settings, self.app.handlers[topic].dlq_topic, count)

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

    # --------------------------------------------------------------- claims

    def _claim_free_partitions(self) -> None:
        if self.phase is not Phase.RUNNING or not self.claiming:
            return
        coordinator = self._require_coordinator()
        now_ms, monotonic = coordinator.now_ms(), time.monotonic()
        room = (self.settings.max_partitions or float("inf")) - self._held_or_claiming()
        if room <= 0:
            return
        busy = self.assignments.keys() | self._claiming | self._releasing
        wanted = [
            (topic, p)
            for topic, count in self.partition_counts.items()
            for p in range(count)
            if (topic, p) not in busy and self.cooldown_until.get((topic, p), 0) <= monotonic
        ]
        me = self._me()
        free = coordinator.read(lambda world: [key for key in wanted if world.is_free(*key, now_ms, *me)])
        self._free_since = {key: self._free_since.get(key, monotonic) for key in free}
        random.shuffle(free)
        if not self._announced:
            # Our first claims tell the members that start with us that we are here: claim a few, then our part.
            free = free[:CLAIMS_PER_TICK]
        elif self.settings.balance == "fair":
            free = self._fair_claims(free, now_ms, monotonic)
        else:
            members = len(self._group_view(now_ms)[0])
            free = free[: greedy_claims(len(free), members, CLAIMS_PER_TICK)]
        if free:
            self._announced = True
            self._claim_all(free[: int(min(room, len(free)))])

    def _fair_claims(self, free: list[Key], now_ms: int, monotonic: float) -> list[Key]:
        """balance="fair": which free partitions to claim.  One freed just now only up to our share, and not
        while a member that asks for partitions could take it; one free for an HB is anyone's (a few a round)."""
        counts, askers = self._group_view(now_ms)
        share = fair_share(sum(self.partition_counts.values()), len(counts))
        long_free = [key for key in free if monotonic - self._free_since[key] >= self.hb_s][:CLAIMS_PER_TICK]
        if yields_to_askers(self._me(), counts, share, askers):
            return long_free
        room = claim_cap(share, self.settings.max_partitions) - self._held_or_claiming()
        just_freed = [key for key in free if monotonic - self._free_since[key] < self.hb_s]
        return just_freed[: max(room, 0)] + long_free

    def _held_or_claiming(self) -> int:
        return len(self.assignments) + len(self._claiming)

    def _claim(self, topic: str, partition: int, asking: bool = False) -> None:
        self._claim_all([(topic, partition)], asking)

    def _claim_all(self, keys: list[Key], asking: bool = False) -> None:
        """Write claims, all in one round trip; their verdicts (a later pass of the loop) start the workers."""
        keys = [key for key in keys if key not in self._claiming]
        if self.phase is not Phase.RUNNING or not keys:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        self._claiming.update(keys)
        coordinator = self._require_coordinator()
        self._require_writes().submit(
            "claim",
            [coordinator.claim_record(*key) for key in keys],
            lambda verdicts: self._after_claims(keys, verdicts, written_ms, asking),
            lambda exc: self._claims_failed(keys, exc),
        )

    def _claims_failed(self, keys: list[Key], exc: Exception) -> None:
        self._claiming.difference_update(keys)
        for key in keys:
            self.log.warning("claim of %s[%d] not confirmed: %s", *key, exc)

    def _after_claims(self, keys: list[Key], verdicts: list[bool], written_ms: int, asking: bool) -> None:
        """Start a worker for every claim accepted (positions looked up together), then heartbeat them all."""
        self._claiming.difference_update(keys)
        won = [key for key, accepted in zip(keys, verdicts) if accepted]
        refused = len(keys) - len(won)
        if asking:
            self.counters.asks += refused
        else:
            self.counters.claims_refused += refused
        self.counters.claims_accepted += len(won)
        started = []
        for key, position in self._start_positions(won).items():
            assignment = self._take(key, position, written_ms)
            if assignment is not None:
                started.append(assignment)
        if started:
            self._send_heartbeats(started)  # the log learns where they resume, without waiting for the next round

    def _take(self, key: Key, position: tuple[int, list[done_set.Range]], written_ms: int) -> Assignment | None:
        """A partition just claimed: its assignment and worker (None if a stop began and it was released)."""
        assert self._context is not None
        topic, partition = key
        start, skip = done_set.resume_past(*position)
        slot = Slot.create(self._context, start)
        if skip:  # the heartbeat carries it on; a heartbeat without it would tell the log nothing is done
            slot.publish_done(start, done_set.encode(start, skip))
        assignment = Assignment(topic, partition, slot, started_offset=start)
        self.assignments[key] = assignment
        self._extend_lease(assignment, written_ms)
        self.log.info("claimed %s[%d], resuming at offset %d", topic, partition, start)
        if self.phase is not Phase.RUNNING:
            self._release(assignment)  # the claim was in flight when a stop began
        elif self._stop_signalled:
            assignment.restart_at = time.monotonic()  # a stop is on its way: handling it releases this one, unforked
        else:
            self._to_start.append(assignment)  # started by _start_queued_workers, a few per pass of the loop
        return assignment if key in self.assignments else None

    def _start_positions(self, keys: list[Key]) -> dict[Key, tuple[int, list[done_set.Range]]]:
        """Where each partition resumes, and the done ranges above it: from the log; else the group's committed
        offsets (one lookup for all); else auto_offset_reset.  A partition whose position Kafka does not tell
        is left out: never guess a position; the claim lapses unused (2*HB) and the partition is tried again."""
        found = self._require_coordinator().read(lambda world: {key: _resume_position(world, *key) for key in keys})
        positions = {key: (resume, skip) for key, (resume, skip) in found.items() if resume is not None}
        unknown = [key for key in keys if key not in positions]
        if not unknown:
            return positions
        offsets = self._require_offsets()
        try:
            committed = offsets.committed_many(unknown)
        except OffsetLookupError as exc:
            self.log.warning("claimed %d partition(s) but cannot tell where they start (%s): leaving them",
                             len(unknown), exc)  # fmt: skip
            return positions
        for key in unknown:
            offset = committed[key]
            if offset is not None:
                positions[key] = (offset, [])
        never_seen = [key for key in unknown if key not in positions]
        for key, reset in (offsets.reset_offsets(never_seen) if never_seen else {}).items():
            if isinstance(reset, OffsetLookupError):
                self.log.warning("claimed %s[%d] but cannot tell where it starts (%s): leaving it", *key, reset)
                continue
            self.log.info(
                "%s[%d] has no known position: starting at %s offset %d",
                *key, self.settings.auto_offset_reset, reset,
            )  # fmt: skip
            positions[key] = (reset, [])
        return positions

    # ------------------------------------------------------------ heartbeats

    def _heartbeat(self) -> None:
        """Heartbeat every partition we hold with its worker's progress; a refusal means it is lost."""
        held = [a for a in self.assignments.values() if not a.lost]
        if held:
            self._send_heartbeats(held)
        if self.shared.topics:
            # Shared partitions: the low-water marks, as the group's offsets (a backup of the log's bookkeeping).
            self._require_offsets().commit(self.shared.low_water_marks())

    def _send_heartbeats(self, held: list[Assignment]) -> None:
        progress = [_progress(a) for a in held]
        written_ms = monotonic_ms()  # before the write: the lease errs short
        self._require_writes().submit(
            "heartbeat",
            self._require_coordinator().heartbeat_records(progress),
            lambda verdicts: self._after_heartbeats(held, progress, heartbeat_verdicts(progress, verdicts), written_ms),
            self._heartbeat_failed,
        )

    def _heartbeat_failed(self, exc: Exception) -> None:
        self.log.warning("heartbeat not confirmed (leases run out unless the next one is): %s", exc)
        self.counters.heartbeat_failures += 1

    def _after_heartbeats(self, held: list[Assignment], progress: list[Progress], verdicts: list[bool], written_ms: int) -> None:
        backup = []
        for assignment, sent, accepted in zip(held, progress, verdicts):
            if self.assignments.get(assignment.key) is not assignment or assignment.lost:
                continue  # released, or lost, since this heartbeat was written
            if accepted:
                self._extend_lease(assignment, written_ms)
                self._check_health(assignment)
                backup.append((sent.topic, sent.partition, sent.offset))
            else:
                self._lose(assignment)
        # The backup holds only what we own: a lost partition's offset is its new owner's to commit.
        self._require_offsets().commit(backup)
        self._require_offsets().poll()

    def _check_health(self, assignment: Assignment) -> None:
        """One health cycle: release the partition if its worker cannot keep up and someone else can."""
        high = assignment.high_watermark
        if assignment.process is None or assignment.unhealthy or high is None:
            return
        sample = Sample(time.monotonic(), assignment.next_offset, high, assignment.slot.get(Field.PROCESSED))
        assignment.health, verdict = observe(assignment.health, sample, self.health_policy)
        if not verdict.release or not self.settings.release_if_behind or self.phase is not Phase.RUNNING:
            return
        where = f"{assignment.topic}[{assignment.partition}]"
        coordinator = self._require_coordinator()
        others = coordinator.read(lambda world: world.live_members(coordinator.now_ms())) - {self._me()}
        if not others:
            self.log.warning("%s is %s (lag %d) but no other member could take it: keeping it", where, verdict.value, sample.lag)
            assignment.health = PartitionHealth()  # judge it afresh rather than warn every cycle
            return
        self.log.warning("%s is %s (lag %d): handing it over to another member", where, verdict.value, sample.lag)
        assignment.unhealthy = True
        self._stop_worker(assignment)

    def _extend_lease(self, assignment: Assignment, written_ms: int) -> None:
        """Hold the partition until 2*HB after our accepted record, minus half an HB of safety."""
        lease = written_ms + int(1.5 * self.settings.heartbeat_ms)
        if lease > assignment.slot.get(Field.LEASE_UNTIL_MS):  # a late verdict never shortens it
            assignment.slot.set(Field.LEASE_UNTIL_MS, lease)

    def _lose(self, assignment: Assignment) -> None:
        """Someone else owns the partition: stop its worker at once, release nothing."""
        assignment.slot.set(Field.LEASE_UNTIL_MS, 0)
        assignment.lost = True
        self.counters.partitions_lost += 1
        coordinator = self._require_coordinator()
        owner = coordinator.read(lambda world: world.owner(assignment.topic, assignment.partition))
        if owner is None:
            self.log.warning("%s[%d] was taken from us (a pause?): stopping its worker", assignment.topic, assignment.partition)
        else:
            self.log.warning("lost %s[%d] to %s: stopping its worker", assignment.topic, assignment.partition, owner)
        if owner is not None and owner.client == coordinator.client and owner.instance != coordinator.instance:
            self.log.error(
                "another process uses our client id %r and took our partitions: every instance needs its own "
                "--client-id; this one stops claiming",
                coordinator.client,
            )
            self.claiming = False
        if assignment.process is None:
            self._forget(assignment)
        else:
            self._stop_worker(assignment)

    # -------------------------------------------------------------- balance

    def _me(self) -> Owner:
        coordinator = self._require_coordinator()
        return Owner(coordinator.client, coordinator.instance)

    def _group_view(self, now_ms: int) -> tuple[dict[Owner, int], set[Owner]]:
        """The live members of the group (us included) with the partitions each holds, and who asks for more."""
        me = self._me()

        def view(world: WorldState) -> tuple[dict[Owner, int], set[Owner]]:
            held = world.holdings(now_ms)
            counts = {member: len(held.get(member, ())) for member in world.live_members(now_ms) | {me}}
            return counts, world.askers(now_ms)

        return self._require_coordinator().read(view)

    def _rebalance(self) -> None:
        """balance="fair": hand partitions over to members that ask, and ask when we hold too few.

        Asking is a claim of the busiest member's partition: refused while its
        owner lives, but the refusal is in the log, so every member sees who
        asks.  With balance="greedy" only an idle member asks, so the health
        monitor knows someone could take a partition.
        """
        if self.phase is not Phase.RUNNING or not self.claiming:
            return
        coordinator = self._require_coordinator()
        now_ms, now, me = coordinator.now_ms(), time.monotonic(), self._me()
        if self.settings.balance == "fair":
            counts, askers = self._group_view(now_ms)
            share = fair_share(sum(self.partition_counts.values()), len(counts))
            held = [a for a in self.assignments.values() if not (a.lost or a.unhealthy or a.handing_over)]
            counts[me] = len(held)
            hungry = is_hungry(len(self.assignments), share, self.settings.max_partitions)
            if hungry:
                askers.add(me)  # about to ask, if not already
            wanted = partitions_to_hand_over(me, counts, share, askers)
            self._balance, count = settled(self._balance, wanted, now, settle_s=self.hb_s)
            for assignment in sorted(held, key=lambda a: a.claimed_at)[len(held) - count :] if count else []:
                self._hand_over(assignment, share)
        else:
            hungry = not self.assignments
        if hungry and now >= self.timers.ask and not coordinator.read(lambda world: world.is_paused(now_ms)):
            self.timers.ask = now + self.hb_s  # once per HB keeps us visible (2*HB) at one record per HB
            wanted_key = partition_to_ask_for(coordinator.read(lambda world: world.holdings(now_ms)), me)
            if wanted_key is not None:
                self._claim(*wanted_key, asking=True)  # accepted only if its owner went stale: a take-over

    def _hand_over(self, assignment: Assignment, share: FairShare) -> None:
        self.log.info(
            "%s[%d]: handing it over (balance=fair: our share is %d to %d partitions)",
            assignment.topic, assignment.partition, share.low, share.high,
        )  # fmt: skip
        assignment.handing_over = True
        if assignment.process is None:
            self._release_handed_over(assignment)
        else:
            self._stop_worker(assignment)  # released when it exits

    def _release_handed_over(self, assignment: Assignment) -> None:
        self._release(assignment)
        # Not ours to take back when the release wakes our claim loop: it is meant for another member.
        self.cooldown_until[assignment.key] = time.monotonic() + 2 * self.hb_s

    # --------------------------------------------------------- AMO claims

    def _submit_message_claims(self) -> None:
        """Write every AMO batch claim the workers asked for, all in one go, without waiting."""
        asked: list[MessageClaim] = []
        for assignment in self.assignments.values():
            connection = assignment.connection
            try:
                while connection is not None and connection.poll(0):
                    end = int(connection.recv())
                    if assignment.lost:
                        self._answer(assignment, ClaimAnswer.REFUSED)  # not ours: refused without asking the log
                    else:
                        asked.append((assignment, connection, end))
            except (EOFError, OSError):
                assignment.connection = None  # the worker is gone; reaping deals with it
        if not asked:
            return
        written_ms = monotonic_ms()  # before the write: the lease errs short
        claims = [(a.topic, a.partition, end) for a, _, end in asked]
        self._require_writes().submit(
            "message claim",
            self._require_coordinator().message_claims(claims),
            lambda verdicts: self._after_message_claims(asked, message_claim_verdicts(claims, verdicts), written_ms),
            lambda exc: self._message_claims_failed(asked, exc),
            # Fail fast: a worker waits on this.  Told so, it asks again (the log keeps the highest claim).
            within=self.hb_s,
        )

    def _after_message_claims(self, asked: list[MessageClaim], verdicts: list[bool], written_ms: int) -> None:
        """Answer the workers whose claims have been folded: claimed (handle it) or refused (not ours: stop)."""
        for (assignment, connection, end), accepted in zip(asked, verdicts):
            if accepted:
                assignment.claimed_end = max(assignment.claimed_end, end)
                self._extend_lease(assignment, written_ms)
            if assignment.connection is connection:  # not a worker that has since been replaced
                self._answer(assignment, ClaimAnswer.CLAIMED if accepted else ClaimAnswer.REFUSED)

    def _message_claims_failed(self, asked: list[MessageClaim], exc: Exception) -> None:
        """Kafka did not confirm the claims in time: tell those workers, who ask again (or stop, if asked to)."""
        for assignment, connection, end in asked:
            self.counters.message_claims_unconfirmed += 1
            self.log.warning(
                "%s[%d]: claim of the messages before offset %d: %s; its worker asks again",
                assignment.topic, assignment.partition, end, exc,
            )  # fmt: skip
            if assignment.connection is connection:
                self._answer(assignment, ClaimAnswer.UNCONFIRMED)

    def _answer(self, assignment: Assignment, answer: ClaimAnswer) -> None:
        if assignment.connection is not None:
            try:
                assignment.connection.send(int(answer))
            except OSError:
                pass  # the worker is gone; reaping deals with it

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

    # -------------------------------------------------------------- workers

    def _start_worker(self, assignment: Assignment) -> None:
        assert self._context is not None
        # AMO: messages before claimed_end were claimed; whatever became of them, they are never handled again.
        # ALO: what the last worker did out of order is skipped (its done set, as published in the slot).
        offset, runs = assignment.slot.position()
        start, skip = done_set.resume_past(max(offset, assignment.claimed_end), done_set.decode(offset, runs))
        slot = assignment.slot
        slot.set(Field.NEXT_OFFSET, start)
        slot.set(Field.CALL_STARTED_MS, 0)  # a killed worker's call must not time the new one out
        slot.set(Field.STOP_REQUESTED, 0)
        slot.set(Field.IN_FLIGHT, 0)
        spec = WorkerSpec(
            self.app_path, assignment.topic, assignment.partition, start, self.settings, assignment.give_up_on,
            skip=tuple(skip),
        )
        assignment.give_up_on = None
        if assignment.restart_at is not None:
            self.counters.worker_restarts += 1
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(spec, assignment.slot.array, theirs),
            name=f"worker {assignment.topic}[{assignment.partition}]",
            daemon=True,
        )
        process.start()
        theirs.close()
        assignment.process, assignment.connection = process, ours
        assignment.started_offset, assignment.restart_at = start, None
        assignment.health = PartitionHealth()  # a new worker is judged afresh

    def _reap_workers(self) -> None:
        for assignment in list(self.assignments.values()):
            process = assignment.process
            if process is None or process.is_alive():
                continue
            process.join()
            code = process.exitcode
            process.close()
            assignment.process = None
            if assignment.connection is not None:
                assignment.connection.close()
                assignment.connection = None
            self._after_exit(assignment, code if code is not None else -1)

    def _after_exit(self, assignment: Assignment, code: int) -> None:
        where = f"{assignment.topic}[{assignment.partition}]"
        if assignment.lost:
            self._forget(assignment)
        elif code == WorkerExit.BOOT_ERROR:
            self.log.error("the worker for %s could not start (see its error above): stopping", where)
            self.exit_code = ExitCode.WORKER_BOOT_ERROR
            self._release(assignment)
            if self.phase is Phase.RUNNING:
                self._begin_graceful_stop()
        elif code == WorkerExit.RELEASE or assignment.unhealthy:
            self._release(assignment, sick=True)
        elif assignment.handing_over:
            self._release_handed_over(assignment)
        elif code == WorkerExit.LOST:
            self._after_lost_claim(assignment)
        elif self.phase is not Phase.RUNNING:
            self._release(assignment)  # stopped (or killed past the timeout): hand over at its progress
        elif assignment.timed_out is not None:
            self._after_time_limit(assignment)
        elif code == WorkerExit.RECYCLE and assignment.next_offset > assignment.started_offset:
            assignment.restart_at = time.monotonic()  # a lifecycle limit, not a crash: a fresh worker now
            assignment.crashes_in_a_row = 0
        else:
            self._after_crash(assignment, code)

    def _after_crash(self, assignment: Assignment, code: int) -> None:
        made_progress = assignment.next_offset > assignment.started_offset
        assignment.crashes_in_a_row = 1 if made_progress else assignment.crashes_in_a_row + 1
        delay = self.restart_policy.delay(assignment.crashes_in_a_row)
        where = f"{assignment.topic}[{assignment.partition}]"
        if delay is None:
            self.log.error("worker for %s crashed %d times in a row: releasing it as sick", where, assignment.crashes_in_a_row)
            self._release(assignment, sick=True)
            return
        self.log.warning(
            "worker for %s exited with %s at offset %d: restarting in %.1fs",
            where, _describe_exit(code), assignment.next_offset, delay,
        )  # fmt: skip
        assignment.restart_at = time.monotonic() + delay

    def _enforce_time_limits(self) -> None:
        """Kill a worker whose handler call has run past the hard time limit (it may be stuck in C code)."""
        now_ms = monotonic_ms()
        for assignment in self.assignments.values():
            limit = self.time_limits[assignment.topic][1]
            started = assignment.slot.get(Field.CALL_STARTED_MS)
            if not limit or assignment.process is None or started <= 0 or assignment.timed_out is not None:
                continue
            if now_ms - started > limit * 1000:
                slot = assignment.slot
                killed = (slot.get(Field.CALL_FIRST_OFFSET), slot.get(Field.CALL_END_OFFSET))
                if assignment.slot.get(Field.CALL_STARTED_MS) != started:
                    continue  # that call just ended (another began): the offsets may be the next call's
                assignment.timed_out = killed
                self.log.error(
                    "%s[%d]: handler call on offsets %d..%d ran past time_limit (%gs): killing its worker",
                    assignment.topic, assignment.partition, assignment.timed_out[0], assignment.timed_out[1] - 1, limit,
                )  # fmt: skip
                self.counters.time_limit_kills += 1
                self._signal_worker(assignment, signal.SIGKILL)

    def _after_time_limit(self, assignment: Assignment) -> None:
        """A killed call is retried by the handler's error policy: again, then dead letter or release.

        AMO needs nothing: the killed messages were claimed, and a new worker starts after the claim.
        (A release already due, sick, hand-over or shutdown, is made by _after_exit instead of this.)
        """
        killed, assignment.timed_out = assignment.timed_out, None
        assert killed is not None
        # Counted per first message: a batch refetched after a restart may be longer (more has arrived).
        same = assignment.last_killed is not None and killed[0] == assignment.last_killed[0]
        assignment.time_limit_kills = assignment.time_limit_kills + 1 if same else 1
        assignment.last_killed = killed
        handler = self.app.handlers[assignment.topic]
        where = f"{assignment.topic}[{assignment.partition}]"
        if handler.mode is Mode.AMO or assignment.time_limit_kills <= handler.retries:
            assignment.restart_at = time.monotonic() + handler.retry_delay(assignment.time_limit_kills - 1)
        elif handler.on_error is OnError.RELEASE:
            self.log.error("%s: offset %d timed out %d times: releasing it", where, killed[0], assignment.time_limit_kills)
            self._release(assignment, sick=True)
        else:
            self.log.error("%s: offset %d timed out %d times: dead-lettering it", where, killed[0], assignment.time_limit_kills)
            assignment.give_up_on, assignment.time_limit_kills, assignment.last_killed = killed, 0, None
            assignment.restart_at = time.monotonic()

    def _after_lost_claim(self, assignment: Assignment) -> None:
        """An AMO claim was refused: gone if someone else owns it, else (a lapsed lease) start again."""
        if not self._owns(assignment):
            self._forget(assignment)
        elif self.phase is Phase.RUNNING:
            assignment.restart_at = time.monotonic()
        else:
            self._release(assignment)

    def _start_queued_workers(self) -> None:
        """Start the workers of partitions just claimed, for up to START_BUDGET_S per pass of the loop.

        A fork waits for the fork server, which competes for the CPU with every worker starting: starting
        a hundred in one pass once held the loop for seconds, and the heartbeats with it.
        """
        budget_ends = time.monotonic() + START_BUDGET_S
        while self._to_start and time.monotonic() < budget_ends:
            assignment = self._to_start.popleft()
            current = self.assignments.get(assignment.key) is assignment and not assignment.lost
            if current and assignment.process is None and self.phase is Phase.RUNNING and not self._stop_signalled:
                self._start_worker(assignment)

    def _restart_due_workers(self, now: float) -> None:
        if self.phase is not Phase.RUNNING:
            return
        for assignment in self.assignments.values():
            if assignment.restart_at is not None and assignment.restart_at <= now and assignment.process is None:
                self._start_worker(assignment)

    # ------------------------------------------------------------ releases

    def _release(self, assignment: Assignment, sick: bool = False) -> None:
        """Write the release with the worker's progress, so the next owner resumes exactly there."""
        offset, done = _position(assignment)
        topic, partition = assignment.key
        self._forget(assignment)
        if not self._owns(assignment):
            # Only an owner's release means anything; another's could pass for an operator's during a pause.
            self.log.info("%s[%d] is no longer ours: nothing to release", topic, partition)
            return
        reason = _release_reason(self.phase, assignment, sick)
        self.counters.releases[reason] += 1
        if sick:
            self.cooldown_until[assignment.key] = time.monotonic() + self.settings.sick_cooldown
        self._releasing.add(assignment.key)
        how = "as sick " if sick else ""

        def released(verdicts: list[bool]) -> None:
            self._releasing.discard(assignment.key)
            refused = "" if verdicts[0] else " (refused: no longer ours)"
            self.log.info("released %s[%d] %sat offset %d%s", topic, partition, how, offset, refused)

        def failed(exc: Exception) -> None:
            self._releasing.discard(assignment.key)
            self.log.error("release of %s[%d] at offset %d not confirmed: %s", topic, partition, offset, exc)

        self._require_writes().submit(
            "release", [self._require_coordinator().release_record(topic, partition, offset, done)], released, failed
        )

    def _owns(self, assignment: Assignment) -> bool:
        owner = self._require_coordinator().read(lambda world: world.owner(assignment.topic, assignment.partition))
        return owner == self._me()

    def _forget(self, assignment: Assignment) -> None:
        self.assignments.pop(assignment.key, None)

    # -------------------------------------------------------------- metrics

    def metrics_snapshot(self) -> Snapshot:
        """What the metrics endpoint shows; called from its thread, so it only reads."""
        partitions = []
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
                    in_flight=a.slot.get(Field.IN_FLIGHT),
                    window_used=a.slot.get(Field.WINDOW_USED),
                    latency_counts=a.slot.latency_counts(),
                    latency_sum_s=a.slot.get(Field.LATENCY_SUM_NS) / 1e9,
                )
            )
        counters = replace(self.counters, releases=collections.Counter(self.counters.releases))
        return Snapshot(self.group, partitions, counters, self._require_coordinator().garbage_seen, self.shared.stats())

    # ----------------------------------------------------------- plumbing

    def _start_fork_server(self) -> BaseContext:
        context = multiprocessing.get_context("forkserver")
        module, _ = split_app_path(self.app_path)
        context.set_forkserver_preload(["marshal_workers.forkserver_preload", "marshal_workers.worker", module])
        multiprocessing.forkserver.ensure_running()
        return context

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
        if self._metrics is not None:
            self._metrics.close()
        if self._offsets is not None:
            self._offsets.close()
        if self._coordinator is not None:
            self._coordinator.close()


def _progress(assignment: Assignment) -> Progress:
    """The heartbeat of one partition: its worker's position, with lag, rate, calls in flight and window use."""
    rate = assignment.health.consume_rate
    rate = None if rate is None else round(max(rate, 0.0), 1)
    offset, done = _position(assignment)
    slot = assignment.slot
    in_flight, window_used = slot.get(Field.IN_FLIGHT), slot.get(Field.WINDOW_USED)
    return Progress(
        assignment.topic, assignment.partition, offset, assignment.lag, rate, done or None,
        in_flight or None, window_used or None,
    )  # fmt: skip


def _position(assignment: Assignment) -> tuple[int, list[int]]:
    """Where the next owner resumes, and the done set above it (ALO); AMO never resumes before a claim."""
    offset, done = assignment.slot.position()
    if assignment.claimed_end <= offset:
        return offset, done
    ranges = done_set.decode(offset, done)
    return assignment.claimed_end, done_set.encode(assignment.claimed_end, above(ranges, assignment.claimed_end))




def _release_reason(phase: Phase, assignment: Assignment, sick: bool) -> str:
    if sick:
        return "sick"
    if assignment.handing_over:
        return "balance"
    return "shutdown" if phase is not Phase.RUNNING else "error"


def _resume_position(world: WorldState, topic: str, partition: int) -> tuple[int | None, list[done_set.Range]]:
    state = world.get(topic, partition)
    return (None, []) if state is None else (state.resume_offset, state.skip_ranges())


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
