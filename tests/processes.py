"""Finding the processes a test or benchmark started, through /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


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
