"""The long nemesis run: several seeds per delivery mode, each with its own broker, and a table of results.

    python tests/chaos/run_nemesis.py --modes alo,amo --seeds 1-5 --seconds 90
    python tests/chaos/run_nemesis.py --holding lanes,shared --modes alo,amo --seeds 1-3 --seconds 90

Prints each run's summary (seed, faults, losses, repeats, time to settle,
slowest SIGTERM) and exits 1 if any verdict failed.  Logs and ledgers stay in
--workdir (a fresh temporary folder by default).
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import tempfile
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # ledger, fleet, processes

from nemesis import Holding, Nemesis, NemesisConfig, Report  # noqa: E402

from marshal_workers.kafka.embedded_broker import EmbeddedBroker  # noqa: E402


def seeds(text: str) -> list[int]:
    """'1-5' or '3,7,9'."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="alo,amo")
    parser.add_argument("--seeds", type=seeds, default=seeds("1-5"))
    parser.add_argument("--seconds", type=float, default=90.0, help="seconds of faults per run")
    parser.add_argument("--rate", type=int, default=1500, help="messages per second")
    parser.add_argument("--partitions", type=int, default=12, help="partitions of the topic")
    parser.add_argument(
        "--holding", default="whole",
        help="how workers hold work, one or more of whole (a worker per partition), lanes (concurrency 8, same-key "
        "messages in order), shared (range leases, 2 processes per supervisor)",
    )  # fmt: skip
    parser.add_argument("--range-size", type=int, default=20, help="shared: offsets per lease (adaptive: the first)")
    parser.add_argument("--adaptive-ranges", action="store_true",
                        help="shared: leases sized by the handler's rate (the default of shared handlers) instead of "
                        "fixed at --range-size; at most once's loss budget is then the largest range's")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    # Stopped from outside (timeout, kill): leave by an exception, so each run's clean-up kills its fleet and
    # broker (the supervisors run in sessions of their own and would outlive us).
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: sys.exit(128 + signum))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nemesis-"))
    reports: list[Report] = []
    holdings = [Holding(h) for h in args.holding.split(",")]
    for holding, mode, seed in itertools.product(holdings, args.modes.split(","), args.seeds):
        run_dir = workdir / f"{holding.value}-{mode}-{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        config = NemesisConfig(
            mode=mode, seed=seed, fault_seconds=args.seconds, rate=args.rate, partitions=args.partitions,
            holding=holding, range_size=args.range_size, adaptive_ranges=args.adaptive_ranges,
        )
        with EmbeddedBroker(log_path=str(run_dir / "broker.log")) as broker:
            report = Nemesis(config, broker, run_dir, uuid.uuid4().hex[:10]).run()
        print(report.summary(), flush=True)
        reports.append(report)
    print()
    print("holding mode seed faults unclean lost repeated settle_s slowest_sigterm_s problems")
    for r in reports:
        slowest = max((s.seconds for s in r.sigterms), default=0.0)
        settle = "never" if r.complete_after_s is None else f"{r.complete_after_s:.1f}"
        print(f"{r.config.holding.value} {r.config.mode} {r.config.seed} {len(r.faults)} {r.unclean_faults} {r.lost} "
              f"{len(r.repeats)} {settle} {slowest:.2f} {len(r.problems)}")  # fmt: skip
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
