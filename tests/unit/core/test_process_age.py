"""process_age: how long ago a process started, the part of a start-up no clock of its own can see."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from marshal_workers.core.process_age import process_age


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="only Linux's /proc says when a process started")
def test_a_process_knows_how_long_ago_it_started() -> None:
    # A child that sleeps 0.5 s before asking: its age covers that sleep and its interpreter's start, and is far
    # from the age of this (older) test process.
    code = (
        "import time; time.sleep(0.5); from marshal_workers.core.process_age import process_age; print(process_age())"
    )
    began = time.monotonic()
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    lived = time.monotonic() - began
    age = float(child.stdout)
    assert 0.5 - 0.02 <= age <= lived + 0.02  # the clock ticks of /proc: 10 ms
    own = process_age()
    assert own is not None and own > age
