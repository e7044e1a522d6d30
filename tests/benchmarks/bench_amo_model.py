"""Benchmark: an AMO worker's rate against the model ``min(raw, batch / RTT)``, with the claim's round trip set.

    python tests/benchmarks/bench_amo_model.py [--messages 100000] [--rtt-ms 0,2,5,10] [--rounds 2]
        [--baseline /path/to/another/checkout]

One partition of the embedded broker, bench_app's handler (``msg.json()["amount"]``, one message per call).  In
one process each, as bench_loop.py does:

* raw: bench_loop.py's consumer loop on the worker's consumer settings: the partition's raw rate;
* amo RTT: the real ``Worker`` under at most once (batches of ``--batch``), a process standing in for the supervisor
  that answers each batch claim after RTT milliseconds (the claim's round trip through the supervisor and Kafka,
  without their CPU: tests/benchmarks/bench_claims.py measures the real one).

The model of docs/benchmarks.md ("At-most-once: the model") is ``min(raw, batch / RTT)``: one claim per batch, at
best with its round trip hidden behind the handling.  The worker waits for each claim before it handles the batch,
so it reaches at most ``batch / (RTT + batch / raw)``, printed alongside.  Printed per RTT: msgs/s, the model's
figure and measured / model, for this checkout and ``--baseline`` (each inner process imports marshal_workers from
its checkout), alternating, ``--rounds`` times.
The fleet's own figure, with the supervisor's and the broker's CPU, is peer_bench's (docs/benchmarks.md).  A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import checkout
from bench_run import VALUE_BYTES, machine_info, value_of

if os.environ.get("MW_BENCH_CHECKOUT"):  # an inner process: marshal_workers from the checkout it measures
    assert "marshal_workers" not in sys.modules
    sys.path.insert(0, os.environ["MW_BENCH_CHECKOUT"])


def inner(brokers: str, topic: str, count: int, variant: str, rtt_ms: float, batch: int, out: str) -> None:
    """Handle ``count`` messages of partition 0 from offset 0, raw or by an AMO worker; print msgs/s as JSON."""
    import bench_app  # reads MW_BENCH_* from the environment

    from marshal_workers.core.config import Settings
    from marshal_workers.runtime.channel import Field, Slot, WorkerSpec, monotonic_ms
    from marshal_workers.runtime.worker.worker import Worker

    settings = Settings(brokers=brokers, group="bench-amo", max_messages_per_worker=count, log_level="warning")
    if variant == "raw":
        bench_app.raw_loop(settings, topic, count)
    else:
        import multiprocessing

        slot = Slot.create(multiprocessing.get_context("fork"), 0)
        slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() + 3_600_000)  # no supervisor: a lease that outlasts the run
        ours, theirs = multiprocessing.Pipe(duplex=True)
        # A process, not a thread: a thread would wait for the worker's GIL (up to its 5 ms switch interval).
        supervisor = multiprocessing.get_context("fork").Process(
            target=answer_claims, args=(ours, rtt_ms / 1000, theirs)
        )
        supervisor.start()
        ours.close()
        Worker(WorkerSpec("bench_app:app", topic, 0, 0, settings), slot, theirs).run()
        theirs.close()
        supervisor.join()
    import marshal_workers

    first, last = (stamp(os.path.join(out, f"{what}-0")) for what in ("first", "last"))
    print(json.dumps({"msgs_per_s": (count - 1) / (last - first), "from": marshal_workers.__file__}))


def stamp(path: str) -> float:
    """The wall time bench_app stamped in ``path`` (its first field)."""
    with open(path) as f:
        return float(f.read().split()[0])


def answer_claims(supervisor_end: Any, rtt_s: float, worker_end: Any) -> None:
    """Stand in for the supervisor: every batch claim is claimed after ``rtt_s`` (until the worker closes its end)."""
    from marshal_workers.member.at_most_once import ClaimAnswer
    from marshal_workers.runtime.messages import ClaimVerdict

    worker_end.close()  # the fork's copy: the worker's close must reach us as EOF
    try:
        while True:
            supervisor_end.recv()
            if rtt_s:
                time.sleep(rtt_s)
            supervisor_end.send(ClaimVerdict(ClaimAnswer.CLAIMED))
    except (EOFError, OSError):
        pass


def one_run(root: str, brokers: str, topic: str, count: int, variant: str, rtt_ms: float, batch: int) -> float:
    """msgs/s of one inner process importing marshal_workers from ``root``."""
    with tempfile.TemporaryDirectory() as out:
        env = os.environ | {
            "MW_BENCH_CHECKOUT": root,
            "MW_BENCH_TOPIC": topic,
            "MW_BENCH_OUT": out,
            "MW_BENCH_MODE": "amo",
            "MW_BENCH_BATCH_SIZE": str(batch),
            "MW_BENCH_LAST_OFFSET": str(count - 1),
        }
        command = [sys.executable, __file__, "--inner", variant, "--brokers", brokers, "--topic", topic]
        command += ["--messages", str(count), "--rtt-ms", str(rtt_ms), "--batch", str(batch), "--out", out]
        done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{variant} from {root} failed:\n{done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["from"].startswith(root), result["from"]
        return float(result["msgs_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rtt-ms", default="0,2,5,10", help="claim round trips, comma-separated")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", default=None, help="another checkout, measured alternately")
    parser.add_argument("--inner", default=None)
    parser.add_argument("--brokers", default=None)
    parser.add_argument("--topic", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.inner:
        inner(args.brokers, args.topic, args.messages, args.inner, float(args.rtt_ms), args.batch, args.out)
        return

    import callgrind

    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    here = str(checkout.ROOT)
    checkouts = {"this": here} | ({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    print(f"bench_amo_model: {args.messages:,} messages, batch {args.batch}, RTT {rtts} ms, {args.rounds} round(s)")
    for line in machine_info():
        print("  " + line)
    rates: dict[tuple[str, float], list[float]] = {}
    raws: list[float] = []
    with EmbeddedBroker() as broker:
        values = (value_of(i, VALUE_BYTES) for i in range(args.messages))
        topic = callgrind.one_partition_topic(broker.bootstrap, "bench-amo", values)
        for round_number in range(1, args.rounds + 1):
            raw = one_run(here, broker.bootstrap, topic, args.messages, "raw", 0, args.batch)
            raws.append(raw)
            print(f"  round {round_number}: raw {raw:,.0f} msgs/s", flush=True)
            for rtt in rtts:
                for name, root in checkouts.items():
                    rate = one_run(root, broker.bootstrap, topic, args.messages, "amo", rtt, args.batch)
                    rates.setdefault((name, rtt), []).append(rate)
                    print(f"    RTT {rtt:4.1f} ms  {name:<8} {rate:10,.0f} msgs/s", flush=True)
    raw = statistics.median(raws)
    print(f"median of {args.rounds}: raw {raw:,.0f} msgs/s")
    for rtt in rtts:
        model = min(raw, args.batch / (rtt / 1000)) if rtt else raw
        waiting = args.batch / (rtt / 1000 + args.batch / raw)
        for name in checkouts:
            rate = statistics.median(rates[(name, rtt)])
            print(
                f"  RTT {rtt:4.1f} ms  {name:<8} {rate:10,.0f} msgs/s  model min(raw, batch/RTT) {model:10,.0f}"
                f"  measured/model {rate / model:5.2f}  (waiting for each claim: {waiting:,.0f})"
            )


if __name__ == "__main__":
    main()
