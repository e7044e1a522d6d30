"""Imported first by the benchmark scripts: puts the checkout's package, this folder (bench_app, bench_run)
and tests/ (processes.py) on sys.path, so a script runs from a checkout without installing."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # tests/benchmarks
ROOT = HERE.parents[1]  # the checkout

for _path in (str(HERE.parent), str(HERE), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
