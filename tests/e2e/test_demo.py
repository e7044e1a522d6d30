"""``marshal-workers demo``: the README's main-job command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from marshal_workers.core.exit_codes import ExitCode


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def test_demo_runs_the_example_under_two_supervisors_and_shuts_down_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARSHAL_WORKERS_")}
    result = subprocess.run(
        [sys.executable, "-m", "marshal_workers", "demo", "--duration", "8", "--rate", "500", "--partitions", "4"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    broker = re.search(r"demo: broker (127\.0\.0\.1:\d+)", result.stdout)
    assert broker, result.stdout
    frames = result.stdout.split("marshal-workers demo   topic orders")
    last = frames[-1]
    owners = set(re.findall(r"^\d+\s+(demo-\d)/", last, re.MULTILINE))
    assert owners, f"the live view shows the owner of each partition:\n{last}"
    assert len(re.findall(r"^\d+\s+demo-\d/\S+\s+fresh", last, re.MULTILINE)) == 4
    summary = re.search(r"produced (\d+) messages, handled (\d+)", result.stdout)
    assert summary and 0 < int(summary.group(2)) <= int(summary.group(1))
    assert "Supervisor exit codes: [0, 0]" in result.stdout
    # Its broker lived in memory: the demo must not promise that a next run resumes where this one stopped.
    assert "the next demo starts afresh" in result.stdout and "next run resumes" not in result.stdout
    assert processes_mentioning(broker.group(1)) == [], "the demo leaves no broker or supervisor behind"
