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


def cmdline(pid: int) -> str:
    """A process's command line as one string (its title, for our processes); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
