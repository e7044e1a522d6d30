"""The long nemesis run: several seeds per delivery mode, each with its own broker, and a table of results.

    python tests/chaos/run_nemesis.py --modes alo,amo --seeds 1-5 --seconds 90
    python tests/chaos/run_nemesis.py --holding lanes,shared --modes alo,amo --seeds 1-3 --seconds 90
    python tests/chaos/run_nemesis.py --modes amo --seeds 1-5 --busy-cores 1 --status-bound 5 --settle-bound 15

Prints each run's summary (seed, faults, losses, repeats, time to settle,
slowest SIGTERM, slowest status after the heal, settled as status saw it,
slowest supervisor start-up) and exits 1 if any verdict failed.  Logs and
ledgers stay in --workdir (a fresh temporary folder by default).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # ledger, fleet, processes

from fleet import StatusCall  # noqa: E402
from nemesis import Holding, Nemesis, NemesisConfig, Report  # noqa: E402
from timings import over_bounds  # noqa: E402

from marshal_workers.kafka.embedded_broker import EmbeddedBroker  # noqa: E402


def seeds(text: str) -> list[int]:
    """'1-5' or '3,7,9'."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


# A core kept busy until stopped; it also ends by itself once its parent is gone (run_nemesis.py killed by a
# SIGKILL cannot stop it), so a load meant for one run never outlives it on a shared machine.
BUSY_LOOP = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def start_busy_cores(count: int, started: list[subprocess.Popen[bytes]]) -> None:
    """``count`` processes that each keep a core busy, appended to ``started`` as each starts (so a failure midway
    still leaves every one of them in the caller's hands, to stop)."""
    for _ in range(count):
        started.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())]))


def stop_busy_cores(started: list[subprocess.Popen[bytes]]) -> None:
    """Stop each busy process by its PID, and reap it."""
    for process in started:
        process.kill()
        process.wait(30)


COLUMNS = (
    "holding",
    "mode",
    "seed",
    "faults",
    "unclean",
    "lost",
    "repeated",
    "settle_s",
    "slowest_sigterm_s",
    "slowest_status_s",
    "settled_seen_s",
    "slowest_start_s",
    "problems",
)


def table(reports: list[Report]) -> list[str]:
    """The final table: a header and a row per run, space-separated."""
    rows = [" ".join(COLUMNS)]
    for r in reports:
        slowest = max((s.seconds for s in r.sigterms), default=0.0)
        rows.append(
            f"{r.config.holding.value} {r.config.mode} {r.config.seed} {len(r.faults)} {r.unclean_faults} {r.lost} "
            f"{len(r.repeats)} {_seconds(r.complete_after_s, 'never')} {slowest:.2f} {_status_cell(r.slowest_status)} "
            f"{_seconds(r.settled_seen_s, 'never')} {_seconds(r.slowest_start_s, '-')} {len(r.problems)}"
        )
    return rows


def _seconds(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.1f}"


def _status_cell(call: StatusCall | None) -> str:
    """The slowest status call's seconds; a timed-out one is marked, its figure being only the timeout."""
    if call is None:
        return "-"
    return f"{call.seconds:.1f}" + ("(timeout)" if call.timed_out else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="alo,amo")
    parser.add_argument("--seeds", type=seeds, default=seeds("1-5"))
    parser.add_argument("--seconds", type=float, default=90.0, help="seconds of faults per run")
    parser.add_argument("--rate", type=int, default=1500, help="messages per second")
    parser.add_argument("--partitions", type=int, default=12, help="partitions of the topic")
    parser.add_argument(
        "--holding",
        default="whole",
        help="how workers hold work, one or more of whole (a worker per partition), lanes (concurrency 8, same-key "
        "messages in order), shared (range leases, 2 processes per supervisor)",
    )
    parser.add_argument("--range-size", type=int, default=20, help="shared: offsets per lease (adaptive: the first)")
    parser.add_argument(
        "--adaptive-ranges",
        action="store_true",
        help="shared: leases sized by the handler's rate (the default of shared handlers) instead of "
        "fixed at --range-size; at most once's loss budget is then the largest range's",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--busy-cores",
        type=int,
        default=0,
        help="keep this many cores busy (a Python busy loop each) for the whole of the runs",
    )
    parser.add_argument(
        "--status-bound",
        type=float,
        default=None,
        help="a problem if a status call after the heal takes longer (seconds; a timed-out one does)",
    )
    parser.add_argument(
        "--settle-bound",
        type=float,
        default=None,
        help="a problem if no status answer shows the fleet settled within this many seconds of the heal",
    )
    args = parser.parse_args()
    # Stopped from outside (timeout, kill): leave by an exception, so each run's clean-up kills its fleet and
    # broker (the supervisors run in sessions of their own and would outlive us), and the busy loops are stopped.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: sys.exit(128 + signum))
    busy: list[subprocess.Popen[bytes]] = []
    try:
        start_busy_cores(args.busy_cores, busy)
        if busy:
            print(f"busy cores: {len(busy)} busy loops started, pids {[p.pid for p in busy]}", flush=True)
        reports = run_all(args)
    finally:
        stop_busy_cores(busy)
        if busy:
            print(f"busy cores: stopped pids {[p.pid for p in busy]}", flush=True)
    print()
    print("\n".join(table(reports)))
    return 1 if any(r.problems for r in reports) else 0


def run_all(args: argparse.Namespace) -> list[Report]:
    """Every run the arguments ask for, each on a broker of its own; each summary printed as it ends."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nemesis-"))
    reports: list[Report] = []
    holdings = [Holding(h) for h in args.holding.split(",")]
    for holding, mode, seed in itertools.product(holdings, args.modes.split(","), args.seeds):
        run_dir = workdir / f"{holding.value}-{mode}-{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        config = NemesisConfig(
            mode=mode,
            seed=seed,
            fault_seconds=args.seconds,
            rate=args.rate,
            partitions=args.partitions,
            holding=holding,
            range_size=args.range_size,
            adaptive_ranges=args.adaptive_ranges,
        )
        with EmbeddedBroker(log_path=str(run_dir / "broker.log")) as broker:
            report = Nemesis(config, broker, run_dir, uuid.uuid4().hex[:10]).run()
        # The acceptance bounds on timings: here only, never in the suite (a loaded CI machine would spoil them).
        report.problems += over_bounds(report.status_calls, report.settled_seen_s, args.status_bound, args.settle_bound)
        print(report.summary(), flush=True)
        reports.append(report)
    return reports


if __name__ == "__main__":
    sys.exit(main())
