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
   10000), on the same 200,000 messages: wall-clock rate and messages per CPU-second (every process of the
   supervisor's session).
3. coordination records per handled message at the default settings: the group's records in the
   coordination log after a run, over the messages.

4. crash: a 100,000-message backlog on one partition, the fast handler; kill -9 of the worker midway (at
   half the backlog handled), then every message handled: the repeated messages of the classic handler (one
   worker for the partition) and of the shared one (1 process, range_size 10,000: the largest), counted from
   every handled offset.  Target (issue 27): shared <= 1.5 x classic.

Throughput = messages / (last handled - first handled, wall time, over every worker).  A benchmark, not a
test: misses print FAIL; the exit status is non-zero only if the benchmark itself could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import checkout  # noqa: F401  (sys.path: the checkout's package, this folder)
from bench_run import base_env, cpu_seconds, create_topic, leftovers, machine_info, produce, verdict
from processes import process_group

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_log import read_group_state
from marshal_workers.kafka.embedded_broker import EmbeddedBroker
from marshal_workers.observe.status import render_table, status_document

PARTITIONS = 2
SLOW_DELAY = 0.02


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    cpu_seconds: float
    records: int

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_cpu_second(self) -> float:
        return self.messages / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def run(bootstrap: str, name: str, messages: int, *, shared: bool, processes: int = 1, supervisors: int = 1,
        range_size: int = 100, adaptive: bool | None = None, delay: float = 0.0,
        timeout: float = 300.0) -> Result:  # fmt: skip
    topic, group = f"bench-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, messages, PARTITIONS)
    coordination = f"__marshal-{group}"
    out = Path(tempfile.mkdtemp(prefix="bench-shared-"))
    env = base_env() | {
        "MW_BENCH_TOPIC": topic, "MW_BENCH_SHARED": "1" if shared else "0", "MW_BENCH_RANGE_SIZE": str(range_size),
        "MW_BENCH_DELAY": str(delay), "MW_BENCH_OUT": str(out),
        "MW_BENCH_ADAPTIVE": "1" if adaptive is None else str(int(adaptive)),
    }  # fmt: skip
    started = []
    for n in range(supervisors):
        command = [
            sys.executable, "-m", "marshal_workers", "run", "shared_bench_app:app", "--brokers", bootstrap,
            "--group", group, "--coordination-topic", coordination, "--client-id", f"bench-{n}",
            "--processes", str(processes), "--heartbeat-interval", "2s", "--log-level", "warning",
        ]  # fmt: skip
        log = open(out / f"supervisor-{n}.log", "wb")
        started.append(subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True))
    deadline = time.monotonic() + timeout
    cpu: dict[int, float] = {}
    try:
        while True:
            for supervisor in started:
                for pid in [supervisor.pid, *process_group(supervisor.pid)]:
                    cpu[pid] = max(cpu.get(pid, 0.0), cpu_seconds(pid))
            counts = _read(out)
            if sum(c for c, _, _ in counts) >= messages:
                break
            if time.monotonic() > deadline:
                settings = Settings(brokers=bootstrap, group=group, coordination_topic=coordination,
                                    heartbeat_interval=2.0)  # fmt: skip
                state = read_group_state(settings, group)
                print(render_table(status_document(state, int(time.time() * 1000)), int(time.time() * 1000)))
                for supervisor in started:
                    supervisor.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                raise RuntimeError(f"{name}: {sum(c for c, _, _ in counts)} of {messages} handled in {timeout:.0f}s "
                                   f"(logs in {out})")  # fmt: skip
            time.sleep(0.1)
        time.sleep(0.3)  # the last reports
        counts = _read(out)
        first, last = min(f for _, f, _ in counts), max(t for _, _, t in counts)
    finally:
        for supervisor in started:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(30)
    settings = Settings(brokers=bootstrap, group=group, coordination_topic=coordination, heartbeat_interval=2.0)
    records = read_group_state(settings, group).stats.applied
    return Result(name, sum(c for c, _, _ in counts), last - first, sum(cpu.values()), records)


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
    cases = [("classic (2 workers)", False, 1, 1, 2), ("shared 1 x 1", True, 1, 1, 1), ("shared 1 x 4", True, 4, 1, 4),
             ("shared 1 x 16", True, 16, 1, 16), ("shared 3 x 16", True, 16, 3, 48)]  # fmt: skip
    for name, shared, processes, supervisors, workers in cases:
        ideal = workers * ideal_per_process
        messages = int(ideal * seconds)
        result = run(bootstrap, name, messages, shared=shared, processes=processes, supervisors=supervisors,
                     delay=SLOW_DELAY)  # fmt: skip
        ratio = result.rate / ideal
        print(f"    {name:22} {result.messages:6,} msgs in {result.seconds:5.1f}s = {result.rate:7.1f} msgs/s; ideal "
              f"{ideal:6.0f}: {ratio:.2f} {verdict(ratio >= 0.8)}; CPU {result.cpu_seconds:5.1f}s", flush=True)  # fmt: skip


def fast(bootstrap: str, messages: int, sizes: list[int]) -> None:
    print(f"\n2. fast handler (msg.json()) on a 2-partition topic, {messages:,} messages", flush=True)
    classic = run(bootstrap, "classic", messages, shared=False)
    print(f"    {'classic (2 workers)':30} {classic.rate:8.0f} msgs/s  {classic.per_cpu_second:8.0f} msgs/CPU-s",
          flush=True)  # fmt: skip
    cases = [("shared 1 x 2, default", {}), *((f"shared 1 x 2, fixed {size}", {"range_size": size, "adaptive": False})
                                              for size in sizes)]  # fmt: skip
    for name, options in cases:
        result = run(bootstrap, name, messages, shared=True, processes=2, **options)  # type: ignore[arg-type]
        wall, cpu = result.rate / classic.rate, result.per_cpu_second / classic.per_cpu_second
        target = f" (target 0.7 / 0.8: {verdict(wall >= 0.7 and cpu >= 0.8)})" if not options else ""
        print(f"    {name:30} {result.rate:8.0f} msgs/s  {result.per_cpu_second:8.0f} msgs/CPU-s"
              f"   ratio to classic: wall {wall:.2f}, per CPU-s {cpu:.2f}; {result.records / result.messages:.4f} "
              f"records/msg{target}", flush=True)  # fmt: skip


def records(bootstrap: str) -> None:
    print("\n3. coordination records per message, default settings, slow handler, 1 x 4", flush=True)
    result = run(bootstrap, "records", 2000, shared=True, processes=4, delay=0.005)
    print(f"    {result.records:,} records for {result.messages:,} messages: {result.records / result.messages:.3f} "
          "per message (claims, acks, renewals, checkpoints)", flush=True)


def crash_repeats(bootstrap: str, name: str, messages: int, *, shared: bool, timeout: float = 300.0) -> int:
    """Repeated messages after a kill -9 of the (one) worker of a one-partition backlog, halfway through."""
    topic, group = f"bench-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, messages, 1)
    out = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    env = base_env() | {
        "MW_BENCH_TOPIC": topic, "MW_BENCH_SHARED": "1" if shared else "0", "MW_BENCH_RANGE_SIZE": "10000",
        "MW_BENCH_OUT": str(out), "MW_BENCH_OFFSETS": "1",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "marshal_workers", "run", "shared_bench_app:app", "--brokers", bootstrap,
        "--group", group, "--coordination-topic", f"__marshal-{group}", "--client-id", "bench",
        "--processes", "1", "--heartbeat-interval", "2s", "--log-level", "warning",
    ]  # fmt: skip
    log = open(out / "supervisor.log", "wb")
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
    print(f"\n4. kill -9 of the worker halfway through a {messages:,}-message backlog on one partition (fast handler)",
          flush=True)  # fmt: skip
    classic = crash_repeats(bootstrap, "classic", messages, shared=False)
    shared = crash_repeats(bootstrap, "shared", messages, shared=True)
    ratio = shared / max(classic, 1)
    print(f"    repeated messages: classic (1 worker) {classic}, shared (1 process, range_size 10,000) {shared}: "
          f"{ratio:.2f} x classic (counting classic as 1 if 0) {verdict(shared <= 1.5 * max(classic, 1))}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["slow", "fast", "records", "crash"])
    parser.add_argument("--slow-seconds", type=float, default=8.0)
    parser.add_argument("--fast-messages", type=int, default=200_000)
    parser.add_argument("--fixed-sizes", default="1000,10000",
                        help="fixed range sizes (adaptive_ranges=False) the fast section also runs, comma-separated")  # fmt: skip
    args = parser.parse_args()
    print("\n".join(machine_info()), flush=True)
    with EmbeddedBroker() as broker:
        if args.only in (None, "slow"):
            slow(broker.bootstrap, args.slow_seconds)
        if args.only in (None, "fast"):
            fast(broker.bootstrap, args.fast_messages, [int(n) for n in args.fixed_sizes.split(",") if n])
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
