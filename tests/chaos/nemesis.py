"""The nemesis: random faults against a fleet of real supervisors, then heal, and judge what a user sees.

A seed fixes the plan: which faults, when, how long (``plan_faults``, pure).
The run starts a broker of its own (it freezes it), a topic, a steady
producer and several supervisors of the sink app, which writes one ledger
line per handled message (client, pid, partition, offset, value, time).
Faults fire on schedule, each on a target that no other fault holds.  Then
everything is healed and the verdicts are taken from the outside only: the
ledger, ``marshal-workers status --json``, exit codes and the process table,
so they hold whatever shape the supervisor takes inside.

Replay a run with the same seed (``MW_NEMESIS_SEED``); the plan is the same,
the machine's timing is not.
"""

from __future__ import annotations

import enum
import os
import random
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fleet import HB, Fleet, StatusCall
from ledger import (
    FaultWindow,
    LossRun,
    Repeat,
    broker_stalls,
    loss_runs,
    out_of_key_order,
    repeats,
    unavailable_s,
    unexplained_losses,
    unexplained_repeats,
)
from processes import child_environment, cmdline, process_group, titled
from timings import StartUp, after_the_heal, settled_seen_s, slowest_call, slowest_start, start_ups, timings_line

from marshal_workers.core.config import Settings
from marshal_workers.handlers.handler_options import MAX_RANGE_SIZE
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.kafka.reader_start import log_consumer

HB_S = float(HB.rstrip("s"))
LEASE_S = 1.5 * HB_S  # a supervisor's workers stop at its last confirmed write plus 1.5 HB
# A SIGTERM exits within the handler's time plus this (plus any broker freeze meanwhile): a bound that catches a stop
# that hangs, not a target (the summary reports the slowest SIGTERM; about 0.3 s on an idle machine).  It was 1 s,
# and a supervisor took 1.28 s with other developers' tests on the 2 cores: timing figures belong in the report.
SIGTERM_GRACE_S = 5.0
# After SIGCONT the broker answers a backlog and readers catch up: a release may wait that long too.
BROKER_RECOVERY_S = 2 * HB_S
CANARY_STALL_S = 0.5  # a canary later than this: the broker stalled (Nemesis._watch_writes)


class Kind(enum.Enum):
    KILL_SUPERVISOR = "kill -9 a supervisor, restart it"
    TERM_SUPERVISOR = "SIGTERM a supervisor, restart it"
    TERM_WHILE_CLAIMING = "kill -9 a supervisor, restart it, SIGTERM it at its first claim, restart it"
    FREEZE_SUPERVISOR = "SIGSTOP a supervisor for 2.5-4 HB"
    KILL_WORKER = "kill -9 a worker"
    KILL_WORKER_CLAIMING = "kill -9 a worker, then its replacement as it starts (claiming)"
    FREEZE_BROKER = "SIGSTOP the broker for 1-2 s"
    FREEZE_BROKER_PAST_LEASE = "SIGSTOP the broker for longer than a lease (2-3 HB)"


BROKER_FAULTS = {Kind.FREEZE_BROKER, Kind.FREEZE_BROKER_PAST_LEASE}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the faults began
    kind: Kind
    pick: int  # chooses the target among those no other fault holds at that time
    length: float  # a freeze's length, or the pause before a restart


def plan_faults(seed: int, seconds: float, hb_s: float = HB_S) -> list[Fault]:
    """Every 2-6 s a fault, for ``seconds``: the same seed, the same plan.

    Kinds are dealt from shuffled decks of all of them, so a short run still meets every kind.
    """
    rng = random.Random(seed)
    faults, at, deck = [], rng.uniform(1.0, 3.0), []
    while at < seconds:
        if not deck:
            deck = rng.sample(list(Kind), len(Kind))
        kind = deck.pop()
        if kind is Kind.FREEZE_SUPERVISOR:
            length = rng.uniform(2.5, 4.0) * hb_s
        elif kind is Kind.FREEZE_BROKER:
            length = rng.uniform(1.0, 2.0)
        elif kind is Kind.FREEZE_BROKER_PAST_LEASE:
            length = rng.uniform(2.0, 3.0) * hb_s
        else:
            length = rng.uniform(0.2, 2.0)
        faults.append(Fault(round(at, 3), kind, rng.randrange(1 << 30), round(length, 3)))
        at += rng.uniform(2.0, 6.0)
    return faults


class Holding(enum.Enum):
    """How the fleet's workers hold work (the handler's options)."""

    WHOLE = "whole"  # one worker per partition, one call at a time
    LANES = "lanes"  # one worker per partition, calls in flight together (concurrency), same-key calls in order
    SHARED = "shared"  # shared=True: every supervisor's workers lease ranges of offsets of every partition


SUPERVISOR_FAULTS = {"kill_supervisor", "term_while_claiming", "freeze_supervisor"}


@dataclass(frozen=True)
class NemesisConfig:
    mode: str  # "alo" or "amo"
    seed: int
    fault_seconds: float
    partitions: int = 12
    supervisors: int = 3
    rate: int = 1500  # messages per second, produced while the faults run
    batch_size: int = 20  # AMO: the most messages one claim covers
    handler_delay: float = 0.0005  # seconds per message
    settle_timeout: float = 120.0
    holding: Holding = Holding.WHOLE
    concurrency: int = 8  # lanes: calls in flight per worker
    keys: int = 16  # lanes: message N has key N mod keys
    processes: int = 2  # shared: workers per supervisor
    range_size: int = 20  # shared: offsets per lease (adaptive: the first leases')
    adaptive_ranges: bool = False  # shared: leases sized by the handler's rate (at most MAX_RANGE_SIZE), not fixed
    pending_timeout: float = 3.0  # shared: a lease not renewed lapses after this (a frozen supervisor's do)

    @property
    def handler_seconds(self) -> float:
        """The longest a worker takes to finish what it holds: a whole claimed batch under AMO, a range shared."""
        if self.holding is Holding.SHARED:
            return self.handler_delay * self.largest_range
        return self.handler_delay * (self.batch_size if self.mode == "amo" else 1)

    @property
    def largest_range(self) -> int:
        """The most offsets one shared lease may cover."""
        return MAX_RANGE_SIZE if self.adaptive_ranges else self.range_size

    @property
    def claimed(self) -> int:
        """The offsets one claim covers, which an unclean fault may lose at most once per claim (AMO)."""
        return self.largest_range if self.holding is Holding.SHARED else self.batch_size

    def claims_lost_at_most(self, fault: FaultWindow) -> int:
        """How many claims (batches, ranges) one unclean fault may lose on one partition (docs/faults.md).

        A whole partition's worker holds one claimed batch.  A shared worker holds up to two leased ranges (the
        one in hand and the next): a supervisor's fault may lose both of each of its workers' ranges, a worker's
        crash its range in hand (the next goes back), the broker's every worker's."""
        if self.holding is not Holding.SHARED:
            return 1
        if fault.kind in SUPERVISOR_FAULTS:
            return 2 * self.processes
        if fault.kind == "kill_worker":
            return 1
        if fault.kind == "kill_worker_claiming":
            return 2
        return 2 * self.processes * self.supervisors  # the broker: every lease may lapse


@dataclass(frozen=True)
class SigtermExit:
    client: str
    sent_at: float
    seconds: float
    code: int | None  # None: it did not exit within a minute
    broker_frozen_s: float  # how long the broker was frozen or stalled, or recovering, between signal and exit
    when: str  # "faults" or "final"


@dataclass
class Report:
    config: NemesisConfig
    faults: list[FaultWindow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sigterms: list[SigtermExit] = field(default_factory=list)
    delivered: int = 0
    handled_lines: int = 0
    losses: list[LossRun] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)
    healed_at: float = 0.0
    # From the heal (every fault over, production stopped) to the ledger line that completed it: for ALO the
    # first handling of the last message to be handled, for AMO the last line.  Read off the ledger, so the
    # time `status` takes to read the log does not count; 0 if the ledger was complete at the heal.
    complete_after_s: float | None = None
    problems: list[str] = field(default_factory=list)
    workdir: Path | None = None
    coordination_records: int | None = None  # the coordination topic's size at the end (ListOffsets: about)
    late_canaries: list[tuple[float, float]] = field(default_factory=list)  # (sent, read) of each late one, freezes too
    # What a user waits for (timings.py): every `status` call after the heal; from the heal until a status answer
    # showed every partition at its end (the answer's arrival: unlike complete_after_s, `status`'s own time counts);
    # every (re)start of a supervisor, to its start line.
    status_calls: list[StatusCall] = field(default_factory=list)
    settled_seen_s: float | None = None
    start_ups: list[StartUp] = field(default_factory=list)

    @property
    def unclean_faults(self) -> int:
        return sum(f.unclean for f in self.faults)

    @property
    def lost(self) -> int:
        return sum(run.size for run in self.losses)

    @property
    def slowest_status(self) -> StatusCall | None:
        return slowest_call(self.status_calls)

    @property
    def slowest_start_s(self) -> float | None:
        slowest = slowest_start(self.start_ups)
        return None if slowest is None else slowest.seconds

    def summary(self) -> str:
        c = self.config
        kinds: dict[str, int] = {}
        for f in self.faults:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        slowest = max(self.sigterms, key=lambda s: s.seconds, default=None)
        per_fault = max(self.unclean_faults, 1)
        lines = [
            (
                f"nemesis {c.mode} {c.holding.value} seed={c.seed} (replay: MW_NEMESIS_SEED={c.seed}): "
                f"{c.fault_seconds:g}s of faults, "
                f"{c.supervisors} supervisors, {c.partitions} partitions, {c.rate} msgs/s, HB {HB}"
            ),
            f"  faults: {len(self.faults)} ({self.unclean_faults} unclean), skipped {len(self.skipped)}: "
            + ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items())),
            (
                f"  delivered {self.delivered}, ledger lines {self.handled_lines}, lost {self.lost} "
                f"({self.lost / per_fault:.1f} per unclean fault), repeated {len(self.repeats)} "
                f"({len(self.repeats) / per_fault:.1f} per unclean fault)"
            ),
            f"  {'complete' if c.mode == 'alo' else 'settled'} "
            + (f"{self.complete_after_s:.1f}s after the last fault" if self.complete_after_s is not None else "NEVER"),
            "  " + timings_line(self.status_calls, self.settled_seen_s, self.start_ups),
            (
                f"  coordination log: about {self.coordination_records} records; canaries later than "
                f"{CANARY_STALL_S:g}s (freezes included): {len(self.late_canaries)}, the longest "
                f"{max((end - start for start, end in self.late_canaries), default=0.0):.1f}s"
            ),
            f"  SIGTERMs: {len(self.sigterms)}, slowest "
            + (
                f"{slowest.seconds:.2f}s ({slowest.client}, {slowest.when}, exit {slowest.code}, broker frozen or "
                f"stalled {slowest.broker_frozen_s:.1f}s meanwhile or just before)"
                if slowest
                else "none"
            ),
        ]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        if self.workdir is not None:
            lines.append(f"  logs and ledger: {self.workdir}")
        return "\n".join(lines)


class Nemesis:
    """One run: ``run()`` returns a Report whose ``problems`` list every verdict that failed."""

    def __init__(self, config: NemesisConfig, broker: EmbeddedBroker, workdir: Path, unique: str) -> None:
        self.config = config
        self.broker = broker
        self.workdir = workdir
        topic = f"nemesis-{unique}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=config.partitions, replication_factor=1)])[topic].result(10)
        self.fleet = Fleet(
            brokers=broker.bootstrap,
            group=f"nemesis-{unique}",
            topic=topic,
            coordination_topic=f"__marshal-{unique}",
            sink=workdir / "ledger.txt",
            partitions=config.partitions,
            env={
                "MW_TEST_MODE": config.mode,
                "MW_TEST_BATCH_SIZE": str(config.batch_size),
                "MW_TEST_DELAY": str(config.handler_delay),
            }
            | holding_env(config),
        )
        self.clients = [f"s{i}" for i in range(config.supervisors)]
        self.report = Report(config, workdir=workdir)
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # supervisors a fault holds (down, frozen, being signalled)
        self._broker_busy = False
        self._frozen: list[tuple[float, float]] = []  # broker freezes (start, end)
        self._stalls: list[tuple[float, float]] = []  # the broker silent on its own (the canary): (start, end)
        self._delivered: dict[tuple[int, int], str] = {}
        self._produce_errors: list[KafkaError] = []
        self._started: list[subprocess.Popen[bytes]] = []  # every supervisor process, to check none is left
        self._starts: list[tuple[str, float, int]] = []  # every start: (client, spawned at, its log's size then)
        self._status_answers: list[tuple[StatusCall, bool]] = []  # while waiting to settle: did it show settled?
        self._ending = False  # set by the clean-up: a fault thread still running starts nothing more

    # ---------------------------------------------------------------- run

    def run(self) -> Report:
        stop_producing = threading.Event()
        producer = threading.Thread(target=self._produce, args=(stop_producing,), name="nemesis-producer")
        stop_watching = threading.Event()  # the canary watches until the final stop is over
        canary = threading.Thread(
            target=self._guarded_call, args=(self._watch_writes, stop_watching), name="nemesis-canary"
        )
        try:
            for client in self.clients:
                self._start(client)
            self._wait(self._all_owned, 60, "every partition owned before the faults")
            producer.start()
            canary.start()
            self._run_faults()
            stop_producing.set()
            producer.join(180)
            self._heal()
            self._wait_complete()
            self._wait(self._one_owner_one_worker, 60, "every partition owned by one live supervisor with one worker")
            self._final_stop()
            stop_watching.set()
            canary.join(180)
            self._judge()
        except Exception:  # noqa: BLE001 - the nemesis reports its own failure as a problem, whatever it is
            self.report.problems.append(f"the nemesis itself failed: {traceback.format_exc()}")
        finally:
            if self.report.problems:
                self._write_coordination_log()
            stop_producing.set()
            stop_watching.set()
            if self.broker.process is not None:
                self.broker.resume()
            self._kill_everything()
            self._write_fault_log()
            self._collect_timings()
        return self.report

    def _with_broker_frozen(self, start: StartUp) -> StartUp:
        """A start-up that waited on a frozen or stalled broker is no measure of the supervisor's own."""
        if start.seconds is None:
            return start
        frozen = unavailable_s(
            self._frozen + self._stalls, start.started_at, start.started_at + start.seconds, recovery=BROKER_RECOVERY_S
        )
        return replace(start, broker_frozen_s=frozen)

    def _collect_timings(self) -> None:
        """The report's timings, once every supervisor is gone (its log complete): figures, never a verdict here."""
        report = self.report
        try:
            if report.healed_at:
                report.status_calls = after_the_heal(self.fleet.status_calls, report.healed_at)
                report.settled_seen_s = settled_seen_s(self._status_answers, report.healed_at)
            for client in self.clients:
                starts = [(at, log_from) for name, at, log_from in self._starts if name == client]
                if starts:
                    report.start_ups += [
                        self._with_broker_frozen(start)
                        for start in start_ups(client, self.fleet.logs[client].read_bytes(), starts)
                    ]
        except Exception:  # noqa: BLE001 - reported as a problem of the run, with its traceback
            report.problems.append(f"timing the run failed: {traceback.format_exc()}")

    def _write_coordination_log(self) -> None:
        """coordination.txt: the group's whole coordination log, decoded and folded (``marshal-workers log``), for
        reading a failed run; written while the broker still runs."""
        self.broker.resume()
        command = self.fleet.command("log", "--from-beginning")
        with open(self.workdir / "coordination.txt", "wb") as out:
            try:
                subprocess.run(
                    command, check=False, stdout=out, stderr=subprocess.STDOUT, timeout=120, env=child_environment()
                )
            except subprocess.TimeoutExpired:
                out.write(b"\n(log did not finish within 120 s)\n")

    def _write_fault_log(self) -> None:
        """faults.txt beside the ledger and the logs: what happened when, for reading a failed run."""
        lines = [
            f"{f.start:.3f} {f.end:.3f} {f.kind} {f.target} {'unclean' if f.unclean else 'clean'}"
            for f in sorted(self.report.faults, key=lambda f: f.start)
        ]
        lines += [f"skipped: {why}" for why in self.report.skipped]
        (self.workdir / "faults.txt").write_text("\n".join(lines) + "\n")

    def _run_faults(self) -> None:
        began = time.monotonic()
        threads = []
        for fault in plan_faults(self.config.seed, self.config.fault_seconds):
            time.sleep(max(0.0, began + fault.at - time.monotonic()))
            thread = threading.Thread(target=self._guarded, args=(fault,), name=f"fault {fault.kind.name}")
            thread.start()
            threads.append(thread)
        time.sleep(max(0.0, began + self.config.fault_seconds - time.monotonic()))
        for thread in threads:
            thread.join(180)

    def _guarded_call(self, function: Callable[[threading.Event], None], stop: threading.Event) -> None:
        try:
            function(stop)
        except Exception:  # noqa: BLE001 - a fault thread's failure, whatever it is, is a reported problem
            self.report.problems.append(f"{function.__name__} failed: {traceback.format_exc()}")

    def _guarded(self, fault: Fault) -> None:
        try:
            self._apply(fault)
        except Exception:  # noqa: BLE001 - a fault's failure, whatever it is, is a reported problem
            self.report.problems.append(f"fault {fault} failed: {traceback.format_exc()}")

    def _heal(self) -> None:
        """Every fault is over; make sure the broker runs and every supervisor is up."""
        self.broker.resume()
        for client in self.clients:
            if self.fleet.processes[client].poll() is not None:
                self.report.problems.append(
                    f"{client} was down at the heal (exit {self.fleet.processes[client].poll()})"
                )
                self._start(client)
        self.report.healed_at = time.time()

    # ------------------------------------------------------------- faults

    def _apply(self, fault: Fault) -> None:
        if fault.kind in BROKER_FAULTS:
            self._freeze_broker(fault)
            return
        client = self._take(fault)
        if client is None:
            return
        try:
            {
                Kind.KILL_SUPERVISOR: self._kill_supervisor,
                Kind.TERM_SUPERVISOR: self._term_supervisor,
                Kind.TERM_WHILE_CLAIMING: self._term_while_claiming,
                Kind.FREEZE_SUPERVISOR: self._freeze_supervisor,
                Kind.KILL_WORKER: self._kill_worker,
                Kind.KILL_WORKER_CLAIMING: self._kill_worker_claiming,
            }[fault.kind](client, fault)
        finally:
            with self._lock:
                self._busy.discard(client)

    def _take(self, fault: Fault) -> str | None:
        with self._lock:
            free = [c for c in self.clients if c not in self._busy]
            if not free:
                self.report.skipped.append(f"{fault.kind.value} at {fault.at}s: every supervisor was taken")
                return None
            client = free[fault.pick % len(free)]
            self._busy.add(client)
            return client

    def _record(self, kind: Kind | str, unclean: bool, start: float, end: float, target: str) -> None:
        name = kind.name.lower() if isinstance(kind, Kind) else kind
        with self._lock:
            self.report.faults.append(FaultWindow(name, unclean, start, end, target))

    def _kill_supervisor(self, client: str, fault: Fault) -> None:
        self._kill(client, fault.kind)
        time.sleep(fault.length)
        self._start(client)

    def _kill(self, client: str, kind: Kind) -> None:
        process = self.fleet.processes[client]
        at = time.time()
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        self._record(kind, True, at, at, client)

    def _term_supervisor(self, client: str, fault: Fault) -> None:
        self._term(client, "faults")
        time.sleep(fault.length)
        self._start(client)

    def _term_while_claiming(self, client: str, fault: Fault) -> None:
        """A restarted supervisor takes its partitions back at once (fast reclaim): SIGTERM it in the middle."""
        self._kill(client, fault.kind)
        time.sleep(fault.length)
        log_from = self._start(client)
        self._wait(lambda: self._claimed_since(client, log_from), 30, f"{client} to claim", interval=0.002)
        self._term(client, "faults")
        self._start(client)

    def _term(self, client: str, when: str) -> None:
        process = self.fleet.processes[client]
        sent = time.time()
        process.send_signal(signal.SIGTERM)
        try:
            code: int | None = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        exited = time.time()
        self._record("sigterm", False, sent, exited, client)
        with self._lock:
            self.report.sigterms.append(SigtermExit(client, sent, exited - sent, code, 0.0, when))

    def _freeze_supervisor(self, client: str, fault: Fault) -> None:
        process = self.fleet.processes[client]
        at = time.time()
        os.kill(process.pid, signal.SIGSTOP)
        try:
            time.sleep(fault.length)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        self._record(fault.kind, True, at, time.time(), client)

    def _workers(self, client: str) -> dict[int, int]:
        """The supervisor's workers now: partition -> pid, or (shared) pid -> pid."""
        if self.config.holding is Holding.SHARED:
            return {pid: pid for pid in self.fleet.shared_worker_pids(client)}
        return self.fleet.worker_pids(client)

    def _pick_worker(self, client: str, fault: Fault) -> tuple[int, int] | None:
        """(partition or pid, pid) of one of the supervisor's workers, or None (skipped) if it runs none."""
        workers = self._workers(client)
        if not workers:
            self.report.skipped.append(f"{fault.kind.value} at {fault.at}s: {client} ran no worker")
            return None
        which = sorted(workers)[fault.pick % len(workers)]
        return which, workers[which]

    def _kill_worker(self, client: str, fault: Fault) -> None:
        picked = self._pick_worker(client, fault)
        if picked is not None:
            at = time.time()
            _kill_quietly(picked[1])
            self._record(fault.kind, True, at, at, client)

    def _kill_worker_claiming(self, client: str, fault: Fault) -> None:
        """Kill a worker, then its replacement as soon as it shows up: a new worker's first act is its claim."""
        picked = self._pick_worker(client, fault)
        if picked is None:
            return
        which, first = picked
        before = set(self._workers(client).values())
        at = time.time()
        _kill_quietly(first)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.config.holding is Holding.SHARED:  # any new shared worker replaces it
                replacement = next(iter(set(self._workers(client).values()) - before), None)
            else:
                replacement = self._workers(client).get(which)
            if replacement not in (None, first):
                _kill_quietly(replacement)
                break
            time.sleep(0.002)
        self._record(fault.kind, True, at, time.time(), client)

    def _freeze_broker(self, fault: Fault) -> None:
        with self._lock:
            if self._broker_busy:
                self.report.skipped.append(f"{fault.kind.value} at {fault.at}s: the broker was frozen already")
                return
            self._broker_busy = True
        at = time.time()
        self.broker.pause()
        try:
            time.sleep(fault.length)
        finally:
            self.broker.resume()
            end = time.time()
            with self._lock:
                self._frozen.append((at, end))
                self._broker_busy = False
        self._record(fault.kind, True, at, end, "broker")

    # --------------------------------------------------------- supervisors

    def _start(self, client: str) -> int:
        """Start (or restart) a supervisor and wait until it runs; returns where its new log lines begin."""
        log_path = self.fleet.sink.with_name(f"{client}.log")
        log_from = log_path.stat().st_size if log_path.exists() else 0
        with self._lock:
            if self._ending:
                raise RuntimeError(f"not restarting {client}: the run is being cleaned up")
            extra = ["--processes", str(self.config.processes)] if self.config.holding is Holding.SHARED else []
            spawned = time.time()
            process = self.fleet.start(client, "--balance", "fair", *extra)
            self._started.append(process)
            self._starts.append((client, spawned, log_from))
        self._wait(
            lambda: process.poll() is not None or " running " in self._log_since(client, log_from),
            60,
            f"{client} to start",
        )
        if process.poll() is not None:
            raise RuntimeError(f"{client} exited with {process.poll()} at start:\n{self._log_since(client, log_from)}")
        return log_from

    def _claimed_since(self, client: str, log_from: int) -> bool:
        """Has the supervisor claimed work since its start: a whole partition (its log says so), or (shared) a
        range that one of its workers handles (the worker's title names its partition)?"""
        if self.config.holding is Holding.SHARED:
            return any("[" in cmdline(pid) for pid in self._workers(client).values())
        return "claimed " in self._log_since(client, log_from)

    def _log_since(self, client: str, offset: int) -> str:
        with open(self.fleet.logs[client], "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def _final_stop(self) -> None:
        """SIGTERM every supervisor at once: each exits 0 in time, and nothing of them is left."""
        threads = [threading.Thread(target=self._term, args=(client, "final")) for client in self.clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)

    def _kill_everything(self) -> None:
        with self._lock:
            self._ending = True
        for process in self._started:
            for pid in [process.pid, *process_group(process.pid)]:
                _kill_quietly(pid)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        # A supervisor whose start a stop signal interrupted (after its fork, before it was recorded) is found
        # by its title, which names the run's group; its workers too.
        for pid in titled(f" {self.fleet.group}"):
            _kill_quietly(pid)

    # ------------------------------------------------------------ producer

    def _produce(self, stop: threading.Event) -> None:
        """Messages 'N' at the configured rate, partition N mod the count; remembers where each landed."""
        producer = Producer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
                "message.timeout.ms": 300_000,  # a broker freeze delays messages, it does not lose them
            }
        )

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self._produce_errors.append(error)
            else:
                self._delivered[(message.partition(), message.offset())] = message.value().decode()

        began, n = time.monotonic(), 0
        while not stop.is_set():
            due = int((time.monotonic() - began) * self.config.rate)
            while n < due:
                key = str(n % self.config.keys).encode() if self.config.holding is Holding.LANES else None
                producer.produce(
                    self.fleet.topic,
                    value=str(n).encode(),
                    key=key,
                    partition=n % self.config.partitions,
                    on_delivery=delivered,
                )
                n += 1
            producer.poll(0.01)
        left = producer.flush(150)
        if left or self._produce_errors:
            self.report.problems.append(
                f"the producer lost messages: {left} undelivered, errors {self._produce_errors[:3]}"
            )

    def _watch_writes(self, stop: threading.Event) -> None:
        """The canary, for stalls of the broker with no fault injected (the embedded broker has them, for
        seconds, mostly after a freeze): every 0.1 s a write of the time to a topic of its own, read back; one
        read later than CANARY_STALL_S marks a stall from its send to its read.  A stop meanwhile waits for the
        broker, and an AMO claim may land after its worker gave up, as under a freeze.  (Stalls of the
        coordination partition alone it does not see: a canary writing there provoked the broker's reader
        fault within 1,300 records, and one only reading there saw stalls of its own that the fleet did not.)"""
        own = f"{self.fleet.topic}-canary"
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})  # kept while its future runs
        admin.create_topics([NewTopic(own, 1, 1)])[own].result(30)
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 0, "message.timeout.ms": 300_000})
        consumer = self._canary_reader(TopicPartition(own, 0, OFFSET_END))
        try:
            while not stop.is_set():
                producer.produce(own, value=repr(time.time()).encode())
                producer.poll(0)
                for message in consumer.consume(1000, timeout=0.1):
                    if message.error() is None and time.time() - float(message.value()) > CANARY_STALL_S:
                        self._stalled(float(message.value()), time.time())
        finally:
            producer.flush(10)
            consumer.close()

    def _canary_reader(self, partition: TopicPartition) -> Consumer:
        """A reader set up as a supervisor's log reader is (librdkafka's defaults would wait up to a second
        between fetches: a stall of the canary's own)."""
        consumer = log_consumer(Settings(brokers=self.broker.bootstrap), "nemesis", "canary", catch_up=False)
        consumer.assign([partition])
        return consumer

    def _stalled(self, start: float, end: float) -> None:
        with self._lock:
            self._stalls.append((start, end))

    # ------------------------------------------------------------ verdicts

    def _ends(self) -> dict[int, int]:
        ends = dict.fromkeys(range(self.config.partitions), 0)
        for partition, offset in self._delivered:
            ends[partition] = max(ends[partition], offset + 1)
        return ends

    def _all_owned(self) -> bool:
        """Ready for the faults: every partition fresh with its owner (shared: every supervisor's workers up)."""
        if self.config.holding is Holding.SHARED:
            return all(len(self._workers(client)) == self.config.processes for client in self.clients)
        rows = self.fleet.status_rows()
        return len(rows) == self.config.partitions and all(row["state"] == "fresh" for row in rows.values())

    def _wait_complete(self) -> None:
        """ALO: every delivered message handled; both modes: every partition's position at its end."""
        ends, delivered = self._ends(), set(self._delivered)

        def complete() -> bool:
            try:
                positions = self._positions()
            except (subprocess.TimeoutExpired, AssertionError):
                return False  # status could not read the log: judged (and probed) at the deadline
            settled = all(positions.get(p, 0) >= end for p, end in ends.items())
            # The call _positions just made: only this thread asks `status` now (fault threads read /proc).
            self._status_answers.append((self.fleet.status_calls[-1], settled))
            if not settled:
                return False
            if self.config.mode == "alo":
                return delivered <= {(line.partition, line.offset) for line in self.fleet.lines()}
            return True

        if self._wait(complete, self.config.settle_timeout, "a complete ledger", fail=False):
            handled = self.fleet.lines()
            if self.config.mode == "alo":
                first = {}
                for line in handled:
                    key = (line.partition, line.offset)
                    first[key] = min(first.get(key, line.at), line.at)
                completed = max((first[key] for key in delivered), default=0.0)
            else:
                completed = max((line.at for line in handled), default=0.0)
            self.report.complete_after_s = max(0.0, completed - self.report.healed_at)
        else:
            try:
                positions = self._positions()
                behind: object = {p: (positions.get(p), end) for p, end in ends.items() if positions.get(p, 0) < end}
            except (subprocess.TimeoutExpired, AssertionError) as exc:
                behind = f"unknown: status failed ({str(exc)[-300:]})"
            self.report.problems.append(
                f"not {'complete' if self.config.mode == 'alo' else 'settled'} {self.config.settle_timeout:g}s after "
                f"the heal; partitions behind (position, end): {behind}; the coordination log: {self._probe_log()}"
            )

    def _positions(self) -> dict[int, int]:
        """Where each partition's next owner would resume: its offset, or (shared) its low-water mark."""
        if self.config.holding is Holding.SHARED:
            return {p: row["low_water_mark"] or 0 for p, row in self.fleet.shared_rows().items()}
        return {p: row["offset"] or 0 for p, row in self.fleet.status_rows().items()}

    def _probe_log(self) -> dict[str, object]:
        """What a fresh reader gets from the coordination topic (to tell a broker fault from ours)."""
        found: dict[str, object] = {}
        try:
            partitions = self._coordination_partitions()
        except Exception as exc:  # noqa: BLE001 - a diagnosis: whatever failed is what it reports
            return {"metadata": repr(exc)}
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = Consumer(
                {
                    "bootstrap.servers": self.broker.bootstrap,
                    "group.id": f"probe-{isolation}",
                    "isolation.level": isolation,
                    "enable.partition.eof": True,
                }
            )
            try:
                consumer.assign([TopicPartition(self.fleet.coordination_topic, p, 0) for p in range(partitions)])
                last: dict[int, int] = {}
                eof: set[int] = set()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and len(eof) < partitions:
                    message = consumer.poll(0.2)
                    if message is None:
                        continue
                    if message.error() is None:
                        last[message.partition()] = message.offset()
                    elif message.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(message.partition())
                ends = {
                    p: consumer.get_watermark_offsets(TopicPartition(self.fleet.coordination_topic, p), timeout=5)
                    for p in last
                }
                found[isolation] = {"last read": last, "at end": sorted(eof), "watermarks": ends}
            except Exception as exc:  # noqa: BLE001 - a diagnosis: whatever failed is what it reports
                found[isolation] = repr(exc)
            finally:
                consumer.close()
        return found

    def _one_owner_one_worker(self) -> bool:
        """Every partition owned by one live supervisor that runs one worker for it (shared: every supervisor runs
        its workers, and none holds a whole partition)."""
        if self.config.holding is Holding.SHARED:
            return self._all_owned() and not any(self.fleet.worker_pids(client) for client in self.clients)
        rows = self.fleet.status_rows()
        workers: dict[int, list[str]] = {}
        for client in self.clients:
            for partition in self.fleet.worker_pids(client):
                workers.setdefault(partition, []).append(client)
        return (
            all(
                row["state"] == "fresh" and workers.get(partition) == [row["client"]] for partition, row in rows.items()
            )
            and len(rows) == self.config.partitions
        )

    def _count_coordination_records(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "nemesis-count"})
        try:
            self.report.coordination_records = sum(
                consumer.get_watermark_offsets(TopicPartition(self.fleet.coordination_topic, p), timeout=10)[1]
                for p in range(self._coordination_partitions())
            )
        except Exception:  # noqa: BLE001, S110 - a figure for the summary, not a verdict
            pass
        finally:
            consumer.close()

    def _coordination_partitions(self) -> int:
        topics = AdminClient({"bootstrap.servers": self.broker.bootstrap}).list_topics(timeout=10).topics
        return len(topics[self.fleet.coordination_topic].partitions)

    def _judge(self) -> None:
        self._count_coordination_records()
        report, config = self.report, self.config
        report.late_canaries = list(self._stalls)
        # Stalls of the broker's own past a lease are unclean faults, as an injected freeze past the lease is.
        report.faults += broker_stalls(self._stalls, self._frozen, lease=LEASE_S, grace=CANARY_STALL_S)
        handled = self.fleet.lines()
        report.delivered, report.handled_lines = len(self._delivered), len(handled)
        report.losses = loss_runs(self._delivered, handled)
        report.repeats = repeats(handled)
        if config.mode == "alo":
            report.problems += [f"at least once, yet lost: {run}" for run in report.losses]
            report.problems += unexplained_repeats(report.repeats, report.faults, slack=self._lease_s())
        else:
            report.problems += [f"at most once, yet handled twice: {r}" for r in report.repeats]
            report.problems += unexplained_losses(
                report.losses,
                report.faults,
                config.claimed,
                slack=self._lease_s(),
                units=config.claims_lost_at_most,
                holes=config.holding is Holding.LANES,
            )
        if config.holding is Holding.LANES:
            keys = config.keys
            report.problems += out_of_key_order(handled, key_of=lambda value: str(int(value) % keys))
        for i, exit_ in enumerate(report.sigterms):
            exited = exit_.sent_at + exit_.seconds
            frozen = unavailable_s(self._frozen + self._stalls, exit_.sent_at, exited, recovery=BROKER_RECOVERY_S)
            exit_ = report.sigterms[i] = replace(exit_, broker_frozen_s=frozen)
            allowed = config.handler_seconds + SIGTERM_GRACE_S + exit_.broker_frozen_s
            if exit_.code != 0 or exit_.seconds > allowed:
                report.problems.append(
                    f"SIGTERM to {exit_.client} ({exit_.when}): exit {exit_.code} after {exit_.seconds:.2f}s "
                    f"(allowed {allowed:.2f}s)"
                )
        left = self._wait(self._nothing_left, 15, "every process to end", fail=False)
        if not left:
            report.problems.append(f"processes left after the final SIGTERM: {self._leftovers()}")

    def _lease_s(self) -> float:
        """How long after a fault its workers may go on: the lease (shared: the pending timeout)."""
        return max(LEASE_S, self.config.pending_timeout) if self.config.holding is Holding.SHARED else LEASE_S

    def _leftovers(self) -> list[int]:
        return [pid for process in self._started for pid in process_group(process.pid)]

    def _nothing_left(self) -> bool:
        return not self._leftovers()

    def _wait(
        self, condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2, fail: bool = True
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                if fail:
                    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
                return False
            time.sleep(interval)
        return True


def holding_env(config: NemesisConfig) -> dict[str, str]:
    """The sink app's settings for the way the fleet holds work (tests/apps/sink_app.py)."""
    if config.holding is Holding.LANES:
        return {"MW_TEST_CONCURRENCY": str(config.concurrency)}
    if config.holding is Holding.SHARED:
        return {
            "MW_TEST_SHARED": "1",
            "MW_TEST_RANGE_SIZE": str(config.range_size),
            "MW_TEST_ADAPTIVE_RANGES": "1" if config.adaptive_ranges else "0",
            "MW_TEST_PENDING_TIMEOUT": f"{config.pending_timeout:g}s",
        }
    return {}


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def seed_from_environment(default: int) -> int:
    """MW_NEMESIS_SEED if set (a number, or "random" for a fresh one), else ``default``."""
    value = os.environ.get("MW_NEMESIS_SEED", "")
    if value == "random":
        return random.randrange(1 << 31)
    return int(value) if value else default
