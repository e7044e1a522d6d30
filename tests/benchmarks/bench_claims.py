"""Benchmark: the round trip of one at-most-once claim, with verdicts from delivery reports and without.

    /work/venv/bin/python tests/benchmarks/bench_claims.py [--claims 500] [--rounds 3]

Starts its own embedded broker and one coordinator that owns two partitions,
then writes --claims message claims one after the other (each waits for its
verdict, as an AMO worker waits), alternating, --rounds times:

a. verdicts from delivery reports (CoordinationLog.fold_delivered, the default);
b. verdicts read back from the log only (fold_delivered switched off).

Prints milliseconds per claim (median of the rounds) and b / a.  A benchmark,
not a test: the exit status is 0 unless it could not run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import checkout  # noqa: F401 - puts the checkout on sys.path
from bench_run import machine_info

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator, message_claim_verdicts
from marshal_workers.kafka.embedded_broker import EmbeddedBroker


def claims_per_ms(coordinator: Coordinator, topic: str, count: int, first_end: int) -> float:
    """Milliseconds per claim, ``count`` claims one after another, each waiting for its verdict."""
    began = time.perf_counter()
    for end in range(first_end, first_end + count):
        claims = [(topic, 0, end)]
        pending = coordinator.submit(coordinator.message_claims(claims))
        while (verdicts := coordinator.collect(pending)) is None:
            time.sleep(0.0001)
        assert message_claim_verdicts(claims, verdicts) == [True]
    return 1000 * (time.perf_counter() - began) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("one at-most-once claim at a time, verdicts from delivery reports (a) and from the log only (b)")
    for line in machine_info():
        print("  " + line)
    results: dict[str, list[float]] = {"a": [], "b": []}
    with EmbeddedBroker() as broker:
        settings = Settings(brokers=broker.bootstrap, group=f"bench-{uuid.uuid4().hex[:8]}")
        with Coordinator(settings) as coordinator:
            topic = f"claims-{uuid.uuid4().hex[:8]}"
            assert coordinator.claim(topic, 0)
            log = coordinator._log
            assert log is not None
            end = 1
            for _ in range(args.rounds):
                for key, fast in (("a", True), ("b", False)):
                    log.fast_verdicts = fast
                    results[key].append(claims_per_ms(coordinator, topic, args.claims, end))
                    end += args.claims
            log.fast_verdicts = True
    a, b = statistics.median(results["a"]), statistics.median(results["b"])
    print(f"  a. from delivery reports  {a:6.2f} ms per claim   {[round(x, 2) for x in results['a']]}")
    print(f"  b. from the log only      {b:6.2f} ms per claim   {[round(x, 2) for x in results['b']]}")
    print(f"  b / a = {b / a:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
