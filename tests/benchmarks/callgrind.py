"""Instructions counted by valgrind's callgrind for one run of a benchmark's inner process.

Wall-clock and CPU-second ratios on this shared 2-core machine move by 10-40 % from one run to the next;
instruction counts do not: callgrind counts the same program's instructions the same way whatever else the
machine is doing.  Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from checkout import ROOT  # and the checkout on sys.path


def instructions(script: str, arguments: list[str], env: dict[str, str] | None = None) -> int:
    """The instructions valgrind counted for ``python script arguments...``."""
    with tempfile.TemporaryDirectory() as scratch:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch}/out", sys.executable, script,
                   *arguments]  # fmt: skip
        environment = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=environment)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or not found:
            raise RuntimeError(f"valgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return int(found.group(1))
