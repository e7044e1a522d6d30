"""The benchmark scripts are not collected by pytest, so a rename in the package could break them
unseen: each must at least import and print its help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("bench_*.py") if p.name != "bench_app.py"))
def test_a_benchmark_script_imports_and_shows_its_help(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
