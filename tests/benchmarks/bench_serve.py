"""Benchmark: the HTTP service (``marshal-workers serve``) against its two ceilings and against Python workers.

    python tests/benchmarks/bench_serve.py [--seconds 10] [--clients 8 64] [--rate 200]
        [--durable-linger-ms default 0] [--batch-max 100] [--batch-messages 1000000]
        [--compare main=/path/to/a/checkout] [--round-trips-only] [--brokers HOST:PORT]

Starts its own embedded broker (Tansu, memory only), or uses the Kafka cluster at --brokers (a broker on cores of
its own: on this 2-core machine the embedded broker's CPU is taken from the server and the clients;
docs/http-service.md, "Performance"), and per case a fresh 2-partition topic and group:

1. round trips: for each --clients count, that many keep-alive HTTP clients (tests/benchmarks/
   serve_bench_client.py, spread over --client-processes processes) read and ack for --seconds against one
   server, with max=1 (one message per round trip: read + ack), and with max=10 at the first count: round trips
   and messages per second, read and ack latency (p50, p99), messages per CPU-second of the server, and the
   latency of the server's own coordination writes (from its /metrics histogram, p50 and p99).  Two ceilings, in
   the same run with the same clients, both a bare aiohttp server (serve_ceiling.py) answering the same request
   and response bodies, reads from memory: in memory, whose acks write nothing (what the web server, the JSON
   library and the clients allow), and durable, whose every ack request produces one ``acks=all`` idempotent
   record (the package's output producer) to a topic of its own on the same broker and is answered after its
   delivery report (what a server must do at least to answer an ack durably); ``--durable-linger-ms`` runs one
   durable ceiling per value given, its producer's ``linger.ms`` set as a user would (``[kafka.producer]``;
   ``default``: the output producer as it is, librdkafka's 5 ms).  The service's figures are also given as a
   share of each.  ``--compare NAME=PATH`` also runs the max=1 and max=--batch-max cases against the
   server of another checkout (e.g. a worktree of main).
2. batches: the first --clients count reading and acking --batch-max offsets a request (--batch-messages
   produced first; 0 skips this part), against a classic worker (``run --processes 2``: each partition to one
   worker process, a trivial handler) on as many messages of the same topic kind: messages per second, and the
   service's share of the worker's; the in-memory ceiling at the same max, for what the web server and the
   clients allow.
3. the Python shared workers (``run --processes`` the first count, the same topic kind, a trivial handler) on
   the messages of the first max=1 case: messages per second and per CPU-second of its processes; and the
   added latency: messages produced at --rate per second for --seconds, handled by the HTTP clients (max=1) or
   by the Python shared workers: end-to-end latency (handled time minus the message's Kafka timestamp), p50
   and p99, and the difference.

``--round-trips-only`` runs parts 1 and 2, without part 3.  A benchmark, not a test: it prints figures; the exit
status is non-zero only if it could not run.
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
    group_cpu,
    leftovers,
    machine_info,
    produce,
    value_of,
)
from confluent_kafka import Producer
from processes import group_command, process_group

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


def start_server(
    bootstrap: str, topic: str, group: str, out: Path, package: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``marshal-workers serve`` of this checkout, or of the checkout at ``package``."""
    port = free_port()
    options = ["--topic", topic, "--port", str(port), "--log-level", "warning"]
    command = group_command("serve", *options, brokers=bootstrap, group=group, coordination_topic=f"__marshal-{group}")
    env = base_env()
    if package is not None:  # from there: ``python -m`` puts the working directory first on sys.path
        env["PYTHONPATH"] = os.pathsep.join([package, str(HERE)])
    return launch(command, env, out / "server.log", port, cwd=package)


def start_ceiling(
    out: Path, durable: tuple[str, str] | None = None, linger_ms: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    """serve_ceiling.py: in memory, or with one durable record per ack to ``durable`` = (bootstrap, topic), its
    producer's linger.ms ``linger_ms`` if given."""
    port = free_port()
    command = [sys.executable, str(HERE / "serve_ceiling.py"), str(port)]
    if durable is not None:
        command += ["--durable", *durable]
        if linger_ms:
            command += ["--linger-ms", linger_ms]
    return launch(command, base_env(), out / "ceiling.log", port)


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


def ceiling(
    clients: int, processes: int, seconds: float, most: int, bootstrap: str = "", linger_ms: str = ""
) -> dict[str, float]:
    """The bare aiohttp server under the same clients: in memory, or (``bootstrap``) with one durable record per
    ack to a fresh topic of its own on that broker (one partition, as a coordination log)."""
    out = Path(tempfile.mkdtemp(prefix="bench-serve-ceiling-"))
    durable = None
    if bootstrap:
        durable = (bootstrap, f"ceiling-{uuid.uuid4().hex[:8]}")
        create_topic(bootstrap, durable[1], 1)
    server, url = start_ceiling(out, durable, linger_ms)
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


def python_workers(
    bootstrap: str, processes: int, seconds: float, messages: int, rate: int = 0, shared: bool = True
) -> dict[str, float]:
    """The baseline: ``run --processes N`` of a handler (tests/benchmarks/shared_bench_app.py), shared, or a
    classic worker (each partition to one process)."""
    topic, group = f"serve-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    out = Path(tempfile.mkdtemp(prefix="bench-serve-py-"))
    create_topic(bootstrap, topic, PARTITIONS)
    if messages:
        produce(bootstrap, topic, messages, PARTITIONS)
    env = base_env() | {
        "MW_BENCH_TOPIC": topic,
        "MW_BENCH_SHARED": "1" if shared else "0",
        "MW_BENCH_OUT": str(out),
        "MW_BENCH_LATENCY": "1",
    }
    options = ["--processes", str(processes), "--log-level", "warning"]
    command = group_command(
        "run", "shared_bench_app:app", *options, brokers=bootstrap, group=group, coordination_topic=f"__marshal-{group}"
    )
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


def line(name: str, found: dict[str, float], bars: dict[str, dict[str, float]] | None = None) -> str:
    """A case's figures, and its share of each of ``bars`` (name -> figures)."""
    text = (
        f"    {name:<24} {found['round_trips_per_s']:7.0f} round trips/s {found['messages_per_s']:7.0f} msgs/s "
        f"{found['messages_per_server_cpu_s']:7.0f} msgs/server-CPU-s; read p50 {found['read_p50_ms']:.1f} ms "
        f"p99 {found['read_p99_ms']:.1f} ms; ack p50 {found['ack_p50_ms']:.1f} ms p99 {found['ack_p99_ms']:.1f} ms"
    )
    if not math.isnan(found.get("write_p50_ms", float("nan"))):
        text += f"; write p50 {found['write_p50_ms']:.1f} ms p99 {found['write_p99_ms']:.1f} ms"
    for bar_name, bar in (bars or {}).items():
        text += (
            f"\n    {'':<24} of the {bar_name}: {found['messages_per_s'] / bar['messages_per_s']:.2f} msgs/s, "
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
    parser.add_argument(
        "--durable-linger-ms",
        nargs="+",
        default=["default"],
        help="The durable ceiling's producer's linger.ms, one ceiling each ('default': the output producer's).",
    )
    parser.add_argument("--batch-max", type=int, default=100, help="max of part 2's reads (and acks).")
    parser.add_argument("--batch-messages", type=int, default=1_000_000, help="Messages for part 2 (0: skip part 2).")
    parser.add_argument(
        "--round-trips-only", action="store_true", help="Parts 1 and 2 only, without part 3 (the Python baselines)."
    )
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
            figures[f"ceiling c={clients} max=1"] = memory = ceiling(clients, args.client_processes, args.seconds, 1)
            print(line("ceiling in memory", memory), flush=True)
            bars = {"in-memory ceiling": memory}
            for linger in args.durable_linger_ms:
                name = "durable ceiling" + (f" linger {linger} ms" if linger != "default" else "")
                figures[f"{name} c={clients} max=1"] = durable = ceiling(
                    clients, args.client_processes, args.seconds, 1, bootstrap, "" if linger == "default" else linger
                )
                print(line(name, durable, {"in-memory ceiling": memory}), flush=True)
                bars[name] = durable
            for name, path in others:
                figures[f"{name} c={clients} max=1"] = found = http_clients(
                    bootstrap, clients, args.seconds, 1, plenty, processes=args.client_processes, package=path
                )
                print(line(f"{name} max=1", found, bars), flush=True)
            figures[f"http c={clients} max=1"] = found = http_clients(
                bootstrap, clients, args.seconds, 1, plenty, processes=args.client_processes
            )
            print(line("this checkout max=1", found, bars), flush=True)
        clients = args.clients[0]
        figures[f"http c={clients} max=10"] = found = http_clients(
            bootstrap, clients, args.seconds, 10, plenty, processes=args.client_processes
        )
        print(line(f"c={clients} max=10", found), flush=True)
        if args.batch_messages:
            batches(bootstrap, args, others, figures)
        if not args.round_trips_only:
            python_baselines(bootstrap, args, figures)
    if args.json:
        print(json.dumps(figures, indent=1, default=lambda v: None if v != v else v))  # noqa: PLR0124 - NaN, of whatever type
    stray = leftovers()
    if stray:
        print(f"FAIL: processes left behind: {stray}")
    return 0


def batches(
    bootstrap: str, args: argparse.Namespace, others: list[tuple[str, ...]], figures: dict[str, dict[str, float]]
) -> None:
    """Reads and acks of --batch-max offsets a request against a classic worker (``run``, one process per
    partition) on as many messages of the same topic kind."""
    clients, most, messages = args.clients[0], args.batch_max, args.batch_messages
    print(
        f"\n2. batches: {clients} keep-alive HTTP clients, max={most} ({messages:,} messages produced first), "
        f"against a classic worker (run --processes {PARTITIONS}, one per partition)",
        flush=True,
    )
    # What the web server, the JSON library and the clients allow at this max, writing nothing: the bar above both.
    figures[f"ceiling c={clients} max={most}"] = memory = ceiling(clients, args.client_processes, args.seconds, most)
    print(line("ceiling in memory", memory), flush=True)
    cases = [*((name, path) for name, path in others), ("this checkout", None)]
    found: dict[str, dict[str, float]] = {}
    for checkout_name, path in cases:
        name, key = f"{checkout_name} max={most}", "http" if path is None else checkout_name
        found[name] = figures[f"{key} c={clients} max={most}"] = http_clients(
            bootstrap, clients, args.seconds, most, messages, processes=args.client_processes, package=path
        )
        print(line(name, found[name], {"in-memory ceiling": memory}), flush=True)
        if found[name]["messages"] >= 0.95 * messages:
            print(f"    {'':<24} (it ran out of messages: give --batch-messages more)", flush=True)
    # As many as were produced for the HTTP clients: at several hundred thousand a second a fifth of that was a
    # third of a second's burst, whose rate varied by half from run to run.
    handled = max(messages, int(max(f["messages"] for f in found.values())))
    figures["classic"] = base = python_workers(bootstrap, PARTITIONS, args.seconds, handled, shared=False)
    print(
        f"    {'classic worker x ' + str(PARTITIONS):<24} {base['messages_per_s']:7.0f} msgs/s "
        f"{base['messages_per_cpu_s']:7.0f} msgs/CPU-s (all its processes), {handled:,} messages",
        flush=True,
    )
    for name, case in [("ceiling in memory", memory), *found.items()]:
        print(f"    {name:<24} of the classic worker: {case['messages_per_s'] / base['messages_per_s']:.2f} msgs/s")


def python_baselines(bootstrap: str, args: argparse.Namespace, figures: dict[str, dict[str, float]]) -> None:
    clients = args.clients[0]
    first = figures[f"http c={clients} max=1"]
    messages = max(20_000, int(first["messages"]))  # enough for a rate, not a burst
    print(f"\n3. Python shared workers x {clients} against the HTTP clients (max=1)", flush=True)
    figures["python"] = base = python_workers(bootstrap, clients, args.seconds, messages)
    print(
        f"    baseline: Python shared worker x {clients}, {messages:,} messages: "
        f"{base['messages_per_s']:7.0f} msgs/s {base['messages_per_cpu_s']:7.0f} msgs/CPU-s (all its "
        f"processes); HTTP max=1 / Python: {first['messages_per_s'] / base['messages_per_s']:.3f} wall",
        flush=True,
    )
    print(f"    end-to-end latency at {args.rate} msgs/s for {args.seconds:g}s (handled - Kafka timestamp)", flush=True)
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
