"""Benchmark: a whole ALO worker's instructions per message against the raw consumer loop's (valgrind).

    /work/venv/bin/python tests/benchmarks/bench_loop.py [--messages 20000] [--rounds 2] [--value-bytes 26]

bench_run.py times whole fleets; on this shared 2-core machine its ratios move by several percent from one
run to the next.  This counts instructions instead (callgrind.py), in one process each, on the same records
of one partition of the embedded broker:

* raw: bench_run.py's baseline loop (``consume(500, 0.5)``, the error check, ``handle(Message(record))``)
  on a Consumer with the worker's own settings (``client_profiles.worker_consumer``);
* worker: the real ``Worker`` running bench_app's ALO handler in-process, as a supervisor's fork would,
  with a lease far away; ``max_messages_per_worker`` = N makes it stop (as a recycle) after N messages;
* amo: the same worker under at most once (batches of 500), a thread answering each batch claim at once:
  the worker's own cost per message without the claim's round trip through the supervisor and Kafka.

Each runs at N and 2N messages; instructions per message = (I(2N) - I(N)) / N, so start-up, imports and the
worker's set-up and finish cancel out.  The handler is bench_app's ``msg.json()["amount"]`` everywhere.
The issue 11 target is ALO at 0.9 of raw per CPU-second, i.e. worker / raw <= 1.11 here (an upper bound of
what the loop itself may cost: bench_run.py also counts the supervisor).  A benchmark, not a test.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
from typing import Any

import callgrind
import checkout  # noqa: F401  (puts the checkout on sys.path)
from bench_run import VALUE_BYTES, value_of  # the same records as bench_run.py's

VARIANTS = {
    "raw": "raw consumer loop",
    "worker": "marshal-workers ALO worker",
    "amo": "AMO worker, claims answered at once",
}
TARGET = 1 / 0.9


def inner(brokers: str, topic: str, count: int, variant: str) -> None:
    """Run under valgrind: handle ``count`` messages of partition 0 from offset 0, one way or the other."""
    import bench_app  # reads MW_BENCH_* from the environment: topic, ALO, the stamp directory

    from marshal_workers.core.config import Settings
    from marshal_workers.runtime.channel import Field, Slot, WorkerSpec, monotonic_ms
    from marshal_workers.runtime.worker.worker import Worker

    settings = Settings(brokers=brokers, group="bench-loop", max_messages_per_worker=count, log_level="warning")
    spec = WorkerSpec("bench_app:app", topic, 0, 0, settings)
    if variant == "raw":
        bench_app.raw_loop(settings, topic, count)
        return
    slot = Slot.create(multiprocessing.get_context("fork"), 0)
    slot.set(Field.LEASE_UNTIL_MS, monotonic_ms() + 3_600_000)  # no supervisor: a lease that outlasts the run
    ours, theirs = multiprocessing.Pipe(duplex=True)
    if variant == "amo":
        threading.Thread(target=answer_claims, args=(ours,), daemon=True).start()
    Worker(spec, slot, theirs).run()
    handled = slot.get(Field.NEXT_OFFSET)
    if handled != count:
        raise SystemExit(f"the worker stopped at offset {handled}, not {count}")
    ours.close()


def answer_claims(supervisor_end: Any) -> None:
    """Stand in for the supervisor: every batch claim is claimed at once (until the worker closes its end)."""
    from marshal_workers.member.at_most_once import ClaimAnswer
    from marshal_workers.runtime.messages import ClaimVerdict

    try:
        while True:
            supervisor_end.recv()
            supervisor_end.send(ClaimVerdict(ClaimAnswer.CLAIMED))
    except (EOFError, OSError):
        pass


def main() -> None:
    parser = callgrind.arguments(__doc__.split("\n\n")[0], VARIANTS)
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES, help="bytes of each JSON value (padded)")
    args = parser.parse_args()
    if args.inner:
        inner(args.brokers, args.topic, args.messages, args.variant)
        return

    from marshal_workers.kafka.embedded_broker import EmbeddedBroker

    n = args.messages
    print(
        f"bench_loop: instructions per message (callgrind), N = {n:,} and 2N, {args.rounds} round(s), "
        f"values of {len(value_of(0, args.value_bytes))} bytes",
        flush=True,
    )
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as stamps:
        values = (value_of(i, args.value_bytes) for i in range(2 * n))
        topic = callgrind.one_partition_topic(broker.bootstrap, "bench-loop", values)
        env = {"MW_BENCH_TOPIC": topic, "MW_BENCH_OUT": stamps, "MW_BENCH_LAST_OFFSET": "-1"}
        per_message: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for round_number in range(1, args.rounds + 1):
            for variant, label in VARIANTS.items():
                once, twice = (
                    callgrind.instructions(
                        __file__,
                        callgrind.inner_arguments(broker.bootstrap, topic, count, variant),
                        env | {"MW_BENCH_MODE": "amo" if variant == "amo" else "alo"},
                    )
                    for count in (n, 2 * n)
                )
                per_message[variant].append((twice - once) / n)
                print(
                    f"  round {round_number} {label:<34} {per_message[variant][-1]:10,.0f} instructions/message "
                    f"(I(N) {once:,}, I(2N) {twice:,})",
                    flush=True,
                )
    raw, worker, amo = (min(per_message[variant]) for variant in VARIANTS)
    print()
    print(f"  raw consumer loop    {raw:10,.0f} instructions/message (lowest of {args.rounds})")
    print(f"  ALO worker           {worker:10,.0f} instructions/message (lowest of {args.rounds})")
    print(
        f"  worker / raw         {worker / raw:10.3f}   target <= {TARGET:.3f} (0.9 of raw's messages per CPU)   "
        f"{'PASS' if worker / raw <= TARGET else 'FAIL'}"
    )
    print(
        f"  AMO worker           {amo:10,.0f} instructions/message (lowest of {args.rounds}; claims answered at once)"
    )
    print(f"  AMO worker / raw     {amo / raw:10.3f}   (bench_run.py's AMO target: 0.6 of raw, i.e. <= {1 / 0.6:.3f})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
