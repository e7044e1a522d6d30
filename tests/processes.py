"""The processes a test or benchmark starts: the environment they start with, the CLI's one-shot commands, and
finding them again through /proc (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

CLI = [sys.executable, "-m", "marshal_workers"]


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment for a process a test starts, then ``env``: without the settings (MARSHAL_WORKERS_*) and the
    test switches (MW_*) of the shell that runs the suite, which would configure it behind the test's back."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("MARSHAL_WORKERS_", "MW_"))}
    return inherited | dict(env or {})


def run_command(
    command: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a one-shot command to its end (in ``child_environment(env)``), its output captured as text."""
    return subprocess.run(
        list(command),
        check=False,
        capture_output=True,
        text=True,
        env=child_environment(env),
        timeout=timeout,
        cwd=cwd,
    )


def group_command(verb: str, *args: str, brokers: str, group: str, coordination_topic: str) -> list[str]:
    """``marshal-workers VERB ARGS`` on one group: its brokers, group and coordination topic, given last (so that
    ``args`` may begin with a subcommand: ``group_command("admin", "pause", ...)``)."""
    return [*CLI, verb, *args, "--brokers", brokers, "--group", group, "--coordination-topic", coordination_topic]


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``marshal-workers ARGS`` to its end, as :func:`run_command` runs it."""
    return run_command([*CLI, *args], env, timeout, cwd)


def process_group(pgid: int) -> list[int]:
    """The pids of every process in process group ``pgid`` (a supervisor started in its own session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return found


def pid_gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie (which handles nothing) not yet reaped."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def titled(text: str) -> list[int]:
    """The pids, other than ours, whose command line (a process title, for ours) contains ``text``."""
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if pid != os.getpid() and text in cmdline(pid)]


def group_gone(pgid: int) -> bool:
    """Every process of a supervisor's group (its fork server, its workers) has exited."""
    return all(pid_gone(pid) for pid in process_group(pgid))


def cmdline(pid: int) -> str:
    """A process's command line as one string (its title, for our processes); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
