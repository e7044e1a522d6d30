"""``marshal-workers serve`` under cProfile (its event loop thread) with each thread's CPU time sampled: a tool of
profile_serve.py.

    python serve_profiled.py OUT_DIR serve-arguments...

Writes OUT_DIR/threads.json every 0.5 s (CPU seconds per thread: Python threads by name, librdkafka's by their
OS name) and, once the server stops (SIGTERM), OUT_DIR/loop.prof (cProfile of the main thread: the event loop).  MW_PROFILE_THREADS=name,name also profiles those
threads (serve-loop, coordination-deliveries, coordination-log) into OUT_DIR/<name>.prof.
"""

from __future__ import annotations

import cProfile
import json
import os
import sys
import threading
import time
from pathlib import Path

import checkout  # noqa: F401  (sys.path: this checkout's package, not the one installed)


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, summed by name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), comm)
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def sample(out: Path) -> None:
    while True:
        (out / "threads.tmp").write_text(json.dumps({"at": time.monotonic(), "cpu": thread_cpu()}))
        os.replace(out / "threads.tmp", out / "threads.json")
        time.sleep(0.5)


def profile_threads(out: Path, names: set[str]) -> None:
    """Run each thread named in ``names`` under a cProfile of its own, dumped to OUT_DIR/<name>.prof when it ends."""
    plain_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        if self.name not in names:
            plain_run(self)
            return
        profile = cProfile.Profile()
        try:
            profile.runcall(plain_run, self)
        finally:
            profile.dump_stats(str(out / f"{self.name}.prof"))

    threading.Thread.run = run  # type: ignore[method-assign]


def main() -> None:
    out = Path(sys.argv[1])
    if os.environ.get("MW_PROFILE_THREADS"):
        profile_threads(out, set(os.environ["MW_PROFILE_THREADS"].split(",")))
    sys.argv = ["marshal-workers", *sys.argv[2:]]
    threading.Thread(target=sample, args=(out,), name="profile-sampler", daemon=True).start()
    from marshal_workers.cli import main as serve

    if os.environ.get("MW_PROFILE_OFF"):
        try:
            serve()
        except SystemExit:
            pass
        return
    profile = cProfile.Profile()
    try:
        profile.runcall(serve)
    except SystemExit:
        pass
    finally:
        profile.dump_stats(str(out / "loop.prof"))


if __name__ == "__main__":
    main()
