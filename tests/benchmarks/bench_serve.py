"""Benchmark: the HTTP service (``marshal-workers serve``) against its ceiling and against Python workers.

    /work/venv/bin/python tests/benchmarks/bench_serve.py [--seconds 10] [--clients 8 64] [--rate 200]
        [--compare main=/path/to/a/checkout] [--round-trips-only] [--brokers HOST:PORT]

Starts its own embedded broker (Tansu, memory only), or uses the Kafka cluster at --brokers (a broker on cores of
its own: on this 2-core machine the embedded broker's CPU is taken from the server and the clients, and the
ceiling has none; docs/http-service.md, "Performance"), and per case a fresh 2-partition topic and group:

1. round trips: for each --clients count, that many keep-alive HTTP clients (tests/benchmarks/
   serve_bench_client.py, spread over --client-processes processes) read and ack for --seconds against one
   server, with max=1 (one message per round trip: read + ack), and with max=10 at the first count: round trips
   and messages per second, read and ack latency (p50, p99), messages per CPU-second of the server, and the
   latency of the server's own coordination writes (from its /metrics histogram, p50 and p99).  The ceiling, in
   the same run with the same clients: a bare aiohttp server (serve_ceiling.py) answering the same request and
   response bodies without Kafka; the service's figures are also given as a share of it.  ``--compare
   NAME=PATH`` also runs each max=1 case against the server of another checkout (e.g. a worktree of main).
   Baseline in the same run: a Python shared worker (``run --processes`` the first count, the same topic kind, a
   trivial handler) on the same number of messages: messages per second and per CPU-second of its processes.
2. added latency: messages produced at --rate per second for --seconds, handled by the HTTP clients (max=1)
   or by the Python shared workers: end-to-end latency (handled time minus the message's Kafka timestamp),
   p50 and p99, and the difference.

``--round-trips-only`` runs part 1 without the Python baseline.  A benchmark, not a test: it prints figures; the
exit status is non-zero only if it could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import checkout  # noqa: F401  (sys.path: the checkout's package, this folder)
from bench_run import (
    FAST_PRODUCER,
    STARTED,
    base_env,
    cpu_seconds,
    create_topic,
    leftovers,
    machine_info,
    produce,
    value_of,
)
from confluent_kafka import Producer
from processes import process_group

from marshal_workers.kafka.embedded_broker import EmbeddedBroker, free_port

HERE = Path(__file__).resolve().parent
PARTITIONS = 2


@contextmanager
def kafka_at(brokers: str) -> Iterator[str]:
    """The bootstrap servers: ``brokers`` if given, else an embedded broker's for the time of the block."""
    if brokers:
        yield brokers
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def group_cpu(pid: int) -> float:
    return sum(cpu_seconds(p) for p in {pid, *process_group(pid)})


def start_server(
    bootstrap: str, topic: str, group: str, out: Path, package: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``marshal-workers serve`` of this checkout, or of the checkout at ``package``."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "marshal_workers",
        "serve",
        "--brokers",
        bootstrap,
        "--group",
        group,
        "--coordination-topic",
        f"__marshal-{group}",
        "--topic",
        topic,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    env = base_env()
    if package is not None:  # from there: ``python -m`` puts the working directory first on sys.path
        env["PYTHONPATH"] = os.pathsep.join([package, str(HERE)])
    return launch(command, env, out / "server.log", port, cwd=package)


def start_ceiling(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    return launch([sys.executable, str(HERE / "serve_ceiling.py"), str(port)], base_env(), out / "ceiling.log", port)


def launch(
    command: list[str], env: dict[str, str], log_path: Path, port: int, cwd: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    with open(log_path, "wb") as log:  # the server writes to its own copy
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True, cwd=cwd)
    STARTED.append(server.pid)  # its own session: checked by leftovers() at the end
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=5)
            return server, url
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the server did not start: see {log_path}") from None
            time.sleep(0.2)


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


def write_histogram(url: str) -> dict[float, float]:
    """The server's coordination write latency histogram (cumulative counts by upper bound), or {} if it has none."""
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        if line.startswith("marshal_workers_serve_write_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            found[float("inf") if bound == "+Inf" else float(bound)] = float(line.rsplit(" ", 1)[1])
    return found


def histogram_percentile(before: dict[float, float], after: dict[float, float], share: float) -> float:
    """A percentile (seconds) of what was observed between two scrapes, interpolated inside its bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    wanted, lower, below = share * counts[-1], 0.0, 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= wanted:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((wanted - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return float("nan")


def run_clients(
    url: str, clients: int, processes: int, seconds: float, most: int, out: Path
) -> tuple[list[dict[str, Any]], float]:
    """``clients`` keep-alive clients over ``processes`` processes until ``seconds`` passed: their results, and
    the wall-clock seconds they ran."""
    processes = max(1, min(processes, clients))
    shares = [clients // processes + (1 if n < clients % processes else 0) for n in range(processes)]
    started = time.monotonic()
    running = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "serve_bench_client.py"),
                url,
                str(seconds),
                str(most),
                str(out / f"client-{n}.json"),
                str(share),
            ],
            env=base_env(),
            start_new_session=True,
        )
        for n, share in enumerate(shares)
    ]
    STARTED.extend(client.pid for client in running)
    for client in running:
        client.wait(seconds + 60)
    elapsed = time.monotonic() - started
    return [json.loads((out / f"client-{n}.json").read_text()) for n in range(len(shares))], elapsed


def figures_of(results: list[dict[str, Any]], elapsed: float, cpu: float) -> dict[str, float]:
    reads = [s for r in results for s in r["reads"]]
    acks = [s for r in results for s in r["acks"]]
    handled = sum(r["messages"] for r in results)
    return {
        "round_trips_per_s": sum(r["round_trips"] for r in results) / elapsed,
        "messages_per_s": handled / elapsed,
        "messages_per_server_cpu_s": handled / cpu if cpu else float("nan"),
        "read_p50_ms": percentile(reads, 0.5) * 1000,
        "read_p99_ms": percentile(reads, 0.99) * 1000,
        "ack_p50_ms": percentile(acks, 0.5) * 1000,
        "ack_p99_ms": percentile(acks, 0.99) * 1000,
        "e2e_p50_ms": percentile([s for r in results for s in r["end_to_end"]], 0.5),
        "e2e_p99_ms": percentile([s for r in results for s in r["end_to_end"]], 0.99),
        "messages": handled,
    }


def ceiling(clients: int, processes: int, seconds: float, most: int) -> dict[str, float]:
    """The bare aiohttp server under the same clients."""
    out = Path(tempfile.mkdtemp(prefix="bench-serve-ceiling-"))
    server, url = start_ceiling(out)
    try:
        cpu_before = group_cpu(server.pid)
        results, elapsed = run_clients(url, clients, processes, seconds, most, out)
        cpu = group_cpu(server.pid) - cpu_before
    finally:
        stop(server)
    return figures_of(results, elapsed, cpu)


def http_clients(
    bootstrap: str,
    clients: int,
    seconds: float,
    most: int,
    messages: int,
    rate: int = 0,
    processes: int = 2,
    package: str | None = None,
) -> dict[str, float]:
    """The HTTP path: a server and ``clients`` clients; ``messages`` produced first, or at ``rate``."""
    topic, group = f"serve-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    out = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    create_topic(bootstrap, topic, PARTITIONS)
    if messages:
        produce(bootstrap, topic, messages, PARTITIONS)
    server, url = start_server(bootstrap, topic, group, out, package)
    try:
        cpu_before = group_cpu(server.pid)
        writes_before = write_histogram(url)
        producer = threading.Thread(target=produce_at, args=(bootstrap, topic, rate, seconds)) if rate else None
        if producer is not None:
            producer.start()
        results, elapsed = run_clients(url, clients, processes, seconds, most, out)
        if producer is not None:
            producer.join()
        cpu = group_cpu(server.pid) - cpu_before
        writes_after = write_histogram(url)
    finally:
        stop(server)
    found = figures_of(results, elapsed, cpu)
    found["write_p50_ms"] = histogram_percentile(writes_before, writes_after, 0.5) * 1000
    found["write_p99_ms"] = histogram_percentile(writes_before, writes_after, 0.99) * 1000
    return found


def python_workers(bootstrap: str, processes: int, seconds: float, messages: int, rate: int = 0) -> dict[str, float]:
    """The baseline: ``run --processes N`` of a shared handler (tests/benchmarks/shared_bench_app.py)."""
    topic, group = f"serve-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    out = Path(tempfile.mkdtemp(prefix="bench-serve-py-"))
    create_topic(bootstrap, topic, PARTITIONS)
    if messages:
        produce(bootstrap, topic, messages, PARTITIONS)
    env = base_env() | {
        "MW_BENCH_TOPIC": topic,
        "MW_BENCH_SHARED": "1",
        "MW_BENCH_OUT": str(out),
        "MW_BENCH_LATENCY": "1",
    }
    command = [
        sys.executable,
        "-m",
        "marshal_workers",
        "run",
        "shared_bench_app:app",
        "--brokers",
        bootstrap,
        "--group",
        group,
        "--coordination-topic",
        f"__marshal-{group}",
        "--processes",
        str(processes),
        "--log-level",
        "warning",
    ]
    with open(out / "supervisor.log", "wb") as log:  # the supervisor writes to its own copy
        supervisor = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    STARTED.append(supervisor.pid)
    try:
        if rate:
            time.sleep(3.0)  # its workers up before the first message, as the HTTP server's clients are
            produce_at(bootstrap, topic, rate, seconds)
        deadline = time.monotonic() + seconds + 120
        total = messages or int(rate * seconds)
        cpu: dict[int, float] = {}
        while handled_counts(out)[0] < total and time.monotonic() < deadline:
            for pid in [supervisor.pid, *process_group(supervisor.pid)]:
                cpu[pid] = max(cpu.get(pid, 0.0), cpu_seconds(pid))
            time.sleep(0.1)
        time.sleep(0.3)
        count, first, last = handled_counts(out)
    finally:
        stop(supervisor)
    latencies = [s for path in out.glob("*.lat") for s in json.loads(path.read_text())]
    return {
        "messages_per_s": count / (last - first) if last > first else float("nan"),
        "messages_per_cpu_s": count / sum(cpu.values()) if cpu else float("nan"),
        "e2e_p50_ms": percentile(latencies, 0.5),
        "e2e_p99_ms": percentile(latencies, 0.99),
        "messages": count,
    }


def handled_counts(out: Path) -> tuple[int, float, float]:
    rows = [path.read_text().split() for path in out.iterdir() if path.name.isdigit()]
    if not rows:
        return 0, 0.0, 0.0
    return sum(int(r[0]) for r in rows), min(float(r[1]) for r in rows), max(float(r[2]) for r in rows)


def produce_at(bootstrap: str, topic: str, rate: int, seconds: float) -> None:
    """``rate`` messages per second for ``seconds``, evenly (the caller may run it in a thread)."""
    producer = Producer({"bootstrap.servers": bootstrap} | FAST_PRODUCER | {"linger.ms": 0})
    started = time.monotonic()
    for n in range(int(rate * seconds)):
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        producer.produce(topic, value=value_of(n), partition=n % PARTITIONS)
        producer.poll(0)
    producer.flush(30)


def line(name: str, found: dict[str, float], bar: dict[str, float] | None = None) -> str:
    text = (
        f"    {name:<22} {found['round_trips_per_s']:7.0f} round trips/s {found['messages_per_s']:7.0f} msgs/s "
        f"{found['messages_per_server_cpu_s']:7.0f} msgs/server-CPU-s; read p50 {found['read_p50_ms']:.1f} ms "
        f"p99 {found['read_p99_ms']:.1f} ms; ack p50 {found['ack_p50_ms']:.1f} ms p99 {found['ack_p99_ms']:.1f} ms"
    )
    if not math.isnan(found.get("write_p50_ms", float("nan"))):
        text += f"; write p50 {found['write_p50_ms']:.1f} ms p99 {found['write_p99_ms']:.1f} ms"
    if bar is not None:
        text += (
            f"\n    {'':<22} of the ceiling: {found['messages_per_s'] / bar['messages_per_s']:.2f} msgs/s, "
            f"{found['messages_per_server_cpu_s'] / bar['messages_per_server_cpu_s']:.2f} per CPU-s"
        )
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--client-processes", type=int, default=2, help="Processes the clients are spread over.")
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="Also measure the server of the checkout at PATH (max=1 cases).",
    )
    parser.add_argument("--round-trips-only", action="store_true", help="Part 1 only, without the Python baseline.")
    parser.add_argument("--json", action="store_true", help="Also print the figures as JSON.")
    parser.add_argument("--brokers", default="", help="A Kafka cluster to use instead of the embedded broker.")
    args = parser.parse_args()
    others = [tuple(item.split("=", 1)) for item in args.compare]
    print("\n".join(machine_info()), flush=True)
    figures: dict[str, dict[str, float]] = {}
    with kafka_at(args.brokers) as bootstrap:
        plenty = 200_000  # more than the clients can take in --seconds
        for clients in args.clients:
            print(
                f"\n1. round trips: {clients} keep-alive HTTP clients in {min(clients, args.client_processes)} "
                f"processes, {args.seconds:g}s",
                flush=True,
            )
            figures[f"ceiling c={clients} max=1"] = bar = ceiling(clients, args.client_processes, args.seconds, 1)
            print(line("ceiling (bare aiohttp)", bar), flush=True)
            for name, path in others:
                figures[f"{name} c={clients} max=1"] = found = http_clients(
                    bootstrap, clients, args.seconds, 1, plenty, processes=args.client_processes, package=path
                )
                print(line(f"{name} max=1", found, bar), flush=True)
            figures[f"http c={clients} max=1"] = found = http_clients(
                bootstrap, clients, args.seconds, 1, plenty, processes=args.client_processes
            )
            print(line("this checkout max=1", found, bar), flush=True)
        clients = args.clients[0]
        figures[f"http c={clients} max=10"] = found = http_clients(
            bootstrap, clients, args.seconds, 10, plenty, processes=args.client_processes
        )
        print(line(f"c={clients} max=10", found), flush=True)
        if not args.round_trips_only:
            python_baselines(bootstrap, args, figures)
    if args.json:
        print(json.dumps(figures, indent=1, default=lambda v: None if v != v else v))  # noqa: PLR0124 - NaN, of whatever type
    stray = leftovers()
    if stray:
        print(f"FAIL: processes left behind: {stray}")
    return 0


def python_baselines(bootstrap: str, args: argparse.Namespace, figures: dict[str, dict[str, float]]) -> None:
    clients = args.clients[0]
    first = figures[f"http c={clients} max=1"]
    messages = max(20_000, int(first["messages"]))  # enough for a rate, not a burst
    figures["python"] = base = python_workers(bootstrap, clients, args.seconds, messages)
    print(
        f"    baseline: Python shared worker x {clients}, {messages:,} messages: "
        f"{base['messages_per_s']:7.0f} msgs/s {base['messages_per_cpu_s']:7.0f} msgs/CPU-s (all its "
        f"processes); HTTP max=1 / Python: {first['messages_per_s'] / base['messages_per_s']:.3f} wall",
        flush=True,
    )
    print(
        f"\n2. end-to-end latency at {args.rate} msgs/s for {args.seconds:g}s (handled - Kafka timestamp)", flush=True
    )
    figures["latency http"] = http = http_clients(
        bootstrap, clients, args.seconds + 2, 1, 0, rate=args.rate, processes=args.client_processes
    )
    figures["latency python"] = py = python_workers(bootstrap, clients, args.seconds, 0, rate=args.rate)
    print(
        f"    HTTP clients (max=1)   p50 {http['e2e_p50_ms']:7.1f} ms  p99 {http['e2e_p99_ms']:7.1f} ms "
        f"({int(http['messages']):,} msgs)",
        flush=True,
    )
    print(
        f"    Python shared workers  p50 {py['e2e_p50_ms']:7.1f} ms  p99 {py['e2e_p99_ms']:7.1f} ms "
        f"({int(py['messages']):,} msgs)",
        flush=True,
    )
    print(
        f"    added by HTTP          p50 {http['e2e_p50_ms'] - py['e2e_p50_ms']:+7.1f} ms  p99 "
        f"{http['e2e_p99_ms'] - py['e2e_p99_ms']:+7.1f} ms",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
