"""Benchmark: shared partitions (range leases) against one worker per partition.

    /work/venv/bin/python tests/benchmarks/bench_shared.py [--only slow|fast|records|crash] [--slow-seconds 8]

Starts its own embedded broker (Tansu, memory only), a fresh 2-partition topic and group per run, and
measures, with ``tests/benchmarks/shared_bench_app.py`` under ``python -m marshal_workers run``:

1. slow handler (sleeps 20 ms: at most 50 msgs/s per process): throughput of the classic handler (one
   worker per partition: 2) and of the shared one with 1, 4 and 16 processes on one supervisor and 16 on
   each of 3 supervisors (48), against the ideal (processes x 50 msgs/s).  Each run gets enough messages
   for about --slow-seconds at the ideal rate.  Target: >= 0.8 of the ideal up to what 2 cores allow.
2. fast handler (``msg.json()["amount"]``, as bench_run.py): the classic handler (2 workers) against the
   shared one with 2 processes (one per partition) at the default settings (adaptive range sizes; target:
   >= 0.7 of classic's msgs/s and >= 0.8 per CPU-second) and with fixed ranges of --fixed-sizes (1000 and
   10000), all on the same --fast-messages (2,000,000) messages of one topic, each run with a group of its
   own, the cases alternated --rounds times (medians reported: the machine is shared).  Start-up (from the
   supervisor's launch to the first handled message) is reported apart from the steady rate: the rate is
   messages over first-to-last handled, and messages per CPU-second counts every process of the supervisor's
   session from the first handled message seen on, over the messages handled from then on.
   Also shared 1 x 4 (two workers per partition), with no target.  --package-from DIR adds the shared default
   cases run with the package of another checkout (a before/after in one run).
3. coordination records per handled message at the default settings: the group's records in the
   coordination log after a run, over the messages.

4. crash: a 100,000-message backlog on one partition, the fast handler; kill -9 of the worker midway (at
   half the backlog handled), then every message handled: the repeated messages of the classic handler (one
   worker for the partition) and of the shared one (1 process, default settings: ranges sized by the handler, up to 10,000),
   counted from every handled offset.  Target (issue 27): shared <= 1.5 x classic.

Throughput = messages / (last handled - first handled, wall time, over every worker).  A benchmark, not a
test: misses print FAIL; the exit status is non-zero only if the benchmark itself could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import checkout  # noqa: F401  (sys.path: the checkout's package, this folder)
from bench_run import base_env, cpu_seconds, create_topic, leftovers, machine_info, produce, verdict
from processes import group_command, process_group

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_reader import read_group_state
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.observe.status import render_table, status_document

PARTITIONS = 2
PROFILE_DIR: str | None = None  # --profile: the workers write cProfile stats there (shared_bench_app.py)
SLOW_DELAY = 0.02


@dataclass
class Result:
    name: str
    messages: int
    seconds: float  # first handled to last handled, over every worker
    cpu_seconds: float  # every process of the supervisors' sessions, start-up included
    records: int
    startup_s: float = 0.0  # the supervisors' launch to the first handled message
    steady_messages: int = 0  # handled from the first time any handled message was seen (a 0.05 s poll)
    steady_cpu_seconds: float = 0.0  # the CPU the session spent from then on
    supervisor_cpu_seconds: float = 0.0  # the supervisors' own processes (claims, acks, the coordination log), all run

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_cpu_second(self) -> float:
        """Messages per CPU-second once handling began (start-up is reported apart)."""
        if self.steady_cpu_seconds > 0 and self.steady_messages > 0:
            return self.steady_messages / self.steady_cpu_seconds
        return self.messages / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def new_topic(bootstrap: str, messages: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, messages, PARTITIONS)
    return topic


def run(
    bootstrap: str,
    name: str,
    messages: int,
    *,
    shared: bool,
    processes: int = 1,
    supervisors: int = 1,
    range_size: int = 100,
    adaptive: bool | None = None,
    delay: float = 0.0,
    topic: str | None = None,
    package_from: str | None = None,
    timeout: float = 300.0,
) -> Result:
    """One run on ``topic`` (``messages`` of it; a new topic if None) with a new group; ``package_from``: the
    checkout whose package the supervisors run (default: this one's)."""
    topic = topic or new_topic(bootstrap, messages)
    group = f"group-{uuid.uuid4().hex[:8]}"
    coordination = f"__marshal-{group}"
    out = Path(tempfile.mkdtemp(prefix="bench-shared-"))
    env = base_env() | {
        "MW_BENCH_TOPIC": topic,
        "MW_BENCH_SHARED": "1" if shared else "0",
        "MW_BENCH_RANGE_SIZE": str(range_size),
        "MW_BENCH_DELAY": str(delay),
        "MW_BENCH_OUT": str(out),
        "MW_BENCH_ADAPTIVE": "1" if adaptive is None else str(int(adaptive)),
    }
    if PROFILE_DIR:
        env["MW_BENCH_PROFILE"] = PROFILE_DIR
    if package_from is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), package_from])
    started = []
    launched = time.time()
    for n in range(supervisors):
        options = ["--client-id", f"bench-{n}", "--processes", str(processes), "--heartbeat-interval", "2s"]
        command = group_command(
            "run",
            "shared_bench_app:app",
            *options,
            "--log-level",
            "warning",
            brokers=bootstrap,
            group=group,
            coordination_topic=coordination,
        )
        # ``-m`` puts the working directory first on sys.path: run from the checkout whose package is meant.
        with open(out / f"supervisor-{n}.log", "wb") as log:  # each supervisor writes to its own copy
            started.append(
                subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True, cwd=package_from)
            )
    deadline = time.monotonic() + timeout
    cpu: dict[int, float] = {}
    seen: tuple[int, float] | None = None  # (handled, CPU seconds) when handled messages were first seen
    try:
        while True:
            for supervisor in started:
                for pid in [supervisor.pid, *process_group(supervisor.pid)]:
                    cpu[pid] = max(cpu.get(pid, 0.0), cpu_seconds(pid))
            counts = _read(out)
            handled = sum(c for c, _, _ in counts)
            if seen is None and handled:
                seen = (handled, sum(cpu.values()))
            if handled >= messages:
                break
            if time.monotonic() > deadline:
                settings = Settings(
                    brokers=bootstrap, group=group, coordination_topic=coordination, heartbeat_interval=2.0
                )
                state = read_group_state(settings, group)
                print(render_table(status_document(state, int(time.time() * 1000)), int(time.time() * 1000)))
                for supervisor in started:
                    supervisor.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                raise RuntimeError(
                    f"{name}: {sum(c for c, _, _ in counts)} of {messages} handled in {timeout:.0f}s (logs in {out})"
                )
            time.sleep(0.05)
        time.sleep(0.3)  # the last reports
        counts = _read(out)
        first, last = min(f for _, f, _ in counts), max(t for _, _, t in counts)
    finally:
        for supervisor in started:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(30)
    settings = Settings(brokers=bootstrap, group=group, coordination_topic=coordination, heartbeat_interval=2.0)
    records = read_group_state(settings, group).stats.applied
    total, cpu_total = sum(c for c, _, _ in counts), sum(cpu.values())
    seen_handled, seen_cpu = seen if seen is not None else (0, 0.0)
    return Result(
        name,
        total,
        last - first,
        cpu_total,
        records,
        first - launched,
        total - seen_handled,
        cpu_total - seen_cpu,
        sum(cpu.get(supervisor.pid, 0.0) for supervisor in started),
    )


def _read(out: Path) -> list[tuple[int, float, float]]:
    found = []
    for path in out.iterdir():
        if path.name.isdigit():
            count, first, last = path.read_text().split()
            found.append((int(count), float(first), float(last)))
    return found


def slow(bootstrap: str, seconds: float) -> None:
    print("\n1. slow handler (20 ms per message) on a 2-partition topic", flush=True)
    ideal_per_process = 1 / SLOW_DELAY
    cases = [
        ("classic (2 workers)", False, 1, 1, 2),
        ("shared 1 x 1", True, 1, 1, 1),
        ("shared 1 x 4", True, 4, 1, 4),
        ("shared 1 x 16", True, 16, 1, 16),
        ("shared 3 x 16", True, 16, 3, 48),
    ]
    for name, shared, processes, supervisors, workers in cases:
        ideal = workers * ideal_per_process
        messages = int(ideal * seconds)
        result = run(
            bootstrap, name, messages, shared=shared, processes=processes, supervisors=supervisors, delay=SLOW_DELAY
        )
        ratio = result.rate / ideal
        print(
            f"    {name:22} {result.messages:6,} msgs in {result.seconds:5.1f}s = {result.rate:7.1f} msgs/s; ideal "
            f"{ideal:6.0f}: {ratio:.2f} {verdict(ratio >= 0.8)}; CPU {result.cpu_seconds:5.1f}s",
            flush=True,
        )


def fast(bootstrap: str, messages: int, sizes: list[int], rounds: int, package_from: str | None) -> None:
    print(
        f"\n2. fast handler (msg.json()) on a 2-partition topic, {messages:,} messages, {rounds} round(s), medians",
        flush=True,
    )
    topic = new_topic(bootstrap, messages)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("classic (2 workers)", {"shared": False}),
        ("shared 1 x 2, default", {"shared": True, "processes": 2}),
    ]
    if package_from:
        cases.append(
            (
                f"shared 1 x 2, default, {Path(package_from).name}",
                {"shared": True, "processes": 2, "package_from": package_from},
            )
        )
    # Two workers per partition: they share each partition's backlog (no target: twice the processes on 2 cores).
    cases.append(("shared 1 x 4, default", {"shared": True, "processes": 4, "no_target": True}))
    if package_from:
        cases.append(
            (
                f"shared 1 x 4, default, {Path(package_from).name}",
                {"shared": True, "processes": 4, "package_from": package_from, "no_target": True},
            )
        )
    cases += [
        (f"shared 1 x 2, fixed {size}", {"shared": True, "processes": 2, "range_size": size, "adaptive": False})
        for size in sizes
    ]
    results: dict[str, list[Result]] = {name: [] for name, _ in cases}
    for n in range(rounds):
        for name, options in cases:
            result = run(
                bootstrap, name, messages, topic=topic, **{k: v for k, v in options.items() if k != "no_target"}
            )
            results[name].append(result)
            print(
                f"      round {n + 1}: {name:34} {result.rate:9.0f} msgs/s  {result.per_cpu_second:8.0f} msgs/CPU-s  "
                f"start-up {result.startup_s:4.2f}s  ({result.seconds:.2f}s handling; CPU {result.cpu_seconds:.2f}s, "
                f"{result.supervisor_cpu_seconds:.2f}s of it the supervisor's)",
                flush=True,
            )
    classic = results[cases[0][0]]
    classic_rate = statistics.median(r.rate for r in classic)
    classic_cpu = statistics.median(r.per_cpu_second for r in classic)
    for name, options in cases:
        rate = statistics.median(r.rate for r in results[name])
        per_cpu = statistics.median(r.per_cpu_second for r in results[name])
        startup = statistics.median(r.startup_s for r in results[name])
        line = f"    {name:36} {rate:9.0f} msgs/s  {per_cpu:8.0f} msgs/CPU-s  start-up {startup:4.2f}s"
        if options["shared"]:
            wall, cpu = rate / classic_rate, per_cpu / classic_cpu
            per_message = statistics.median(r.records / r.messages for r in results[name])
            line += f"   ratio to classic: wall {wall:.2f}, per CPU-s {cpu:.2f}; {per_message:.5f} records/msg"
            if "range_size" not in options and "no_target" not in options:
                line += f" (target 0.7 / 0.8: {verdict(wall >= 0.7 and cpu >= 0.8)})"
        print(line, flush=True)


def records(bootstrap: str) -> None:
    print("\n3. coordination records per message, default settings, slow handler, 1 x 4", flush=True)
    result = run(bootstrap, "records", 2000, shared=True, processes=4, delay=0.005)
    print(
        f"    {result.records:,} records for {result.messages:,} messages: {result.records / result.messages:.3f} "
        "per message (claims, acks, renewals, checkpoints)",
        flush=True,
    )


def crash_repeats(bootstrap: str, name: str, messages: int, *, shared: bool, timeout: float = 300.0) -> int:
    """Repeated messages after a kill -9 of the (one) worker of a one-partition backlog, halfway through."""
    topic, group = f"bench-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, messages, 1)
    out = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    env = base_env() | {
        "MW_BENCH_TOPIC": topic,
        "MW_BENCH_SHARED": "1" if shared else "0",  # default settings: adaptive ranges
        "MW_BENCH_OUT": str(out),
        "MW_BENCH_OFFSETS": "1",
    }
    options = ["--client-id", "bench", "--processes", "1", "--heartbeat-interval", "2s", "--log-level", "warning"]
    command = group_command(
        "run", "shared_bench_app:app", *options, brokers=bootstrap, group=group, coordination_topic=f"__marshal-{group}"
    )
    with open(out / "supervisor.log", "wb") as log:  # the supervisor writes to its own copy
        supervisor = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    killed = False
    try:
        while True:
            handled = _handled_offsets(out)
            if not killed and len(handled) >= messages // 2:
                pids = [int(path.name.split(".")[0]) for path in out.glob("*.offsets")]
                os.kill(pids[0], signal.SIGKILL)  # the one worker so far, midway
                killed = True
            if killed and len(set(handled)) >= messages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {len(set(handled))} of {messages} handled in {timeout:.0f}s ({out})")
            time.sleep(0.05)
        return len(handled) - len(set(handled))
    finally:
        os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait(30)


def _handled_offsets(out: Path) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in out.glob("*.offsets"):
        found += [tuple(line.split()) for line in path.read_text().splitlines() if len(line.split()) == 2]  # type: ignore[misc]
    return found


def crash(bootstrap: str, messages: int = 100_000) -> None:
    print(
        f"\n4. kill -9 of the worker halfway through a {messages:,}-message backlog on one partition (fast handler)",
        flush=True,
    )
    classic = crash_repeats(bootstrap, "classic", messages, shared=False)
    shared = crash_repeats(bootstrap, "shared", messages, shared=True)
    ratio = shared / max(classic, 1)
    print(
        f"    repeated messages: classic (1 worker) {classic}, shared (1 process, default adaptive ranges, up to 10,000) {shared}: "
        f"{ratio:.2f} x classic (counting classic as 1 if 0) {verdict(shared <= 1.5 * max(classic, 1))}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["slow", "fast", "records", "crash"])
    parser.add_argument("--slow-seconds", type=float, default=8.0)
    parser.add_argument("--fast-messages", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2, help="fast section: rounds of its cases, alternated")
    parser.add_argument(
        "--package-from",
        help="fast section: also run the shared default with this checkout's package (a before/after in one run)",
    )
    parser.add_argument(
        "--fixed-sizes",
        default="1000,10000",
        help="fixed range sizes (adaptive_ranges=False) the fast section also runs, comma-separated",
    )
    parser.add_argument("--profile", metavar="DIR", help="workers write cProfile stats to DIR/<pid>.prof")
    args = parser.parse_args()
    global PROFILE_DIR
    PROFILE_DIR = args.profile
    print("\n".join(machine_info()), flush=True)
    with EmbeddedBroker() as broker:
        if args.only in (None, "slow"):
            slow(broker.bootstrap, args.slow_seconds)
        if args.only in (None, "fast"):
            fast(
                broker.bootstrap,
                args.fast_messages,
                [int(n) for n in args.fixed_sizes.split(",") if n],
                args.rounds,
                args.package_from,
            )
        if args.only in (None, "records"):
            records(broker.bootstrap)
        if args.only in (None, "crash"):
            crash(broker.bootstrap)
    stray = leftovers()
    if stray:
        print(f"FAIL: processes left behind: {stray}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
