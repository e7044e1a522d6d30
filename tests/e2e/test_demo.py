"""``marshal-workers demo``: the README's main-job command."""

from __future__ import annotations

import re
from pathlib import Path

from processes import cmdline, run_cli, titled

from marshal_workers.core.exit_codes import ExitCode


def test_demo_runs_the_example_under_two_supervisors_and_shuts_down_cleanly(tmp_path: Path) -> None:
    result = run_cli("demo", "--duration", "8", "--rate", "500", "--partitions", "4", timeout=120, cwd=tmp_path)
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
    left = {pid: cmdline(pid) for pid in titled(broker.group(1))}
    assert left == {}, "the demo leaves no broker or supervisor behind"
