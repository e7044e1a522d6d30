"""The package's layers hold (docs/architecture.md): import-linter's contracts in pyproject.toml, run by the suite, so
an import that crosses a layer the wrong way, or closes a cycle, fails CI.  And the code and the docs cite only
pages of this repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the package in ``cwd``, every contract, no cache (a stale cache could hide a change)."""
    program = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_the_layers_and_their_contracts_hold() -> None:
    names = [contract["name"] for contract in CONTRACTS]
    assert len(names) >= 4, names  # the layers, the runtime's two sides, the pure protocol, no cycles
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(names)} kept, 0 broken." in result.stdout, result.stdout


def test_a_wrong_way_import_breaks_the_build(tmp_path: Path) -> None:
    """The contracts are not vacuous: the pure protocol importing a Kafka reader breaks two of them."""
    shutil.copytree(ROOT / "marshal_workers", tmp_path / "marshal_workers")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    balance = tmp_path / "marshal_workers" / "protocol" / "balance.py"
    balance.write_text(balance.read_text() + "\nfrom marshal_workers.kafka import committed_offsets  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "marshal_workers.protocol.balance -> marshal_workers.kafka.committed_offsets" in result.stdout, result.stdout
    broken = " ".join(result.stdout.split())  # import-linter wraps long names
    for contract in ("Layers: each imports only the layers below it", "The protocol is pure"):
        assert re.search(re.escape(contract) + r"(?:(?!KEPT).){0,120}? BROKEN", broken), result.stdout


OUTSIDE = re.compile(r"DESIGN\.md|KAFKA-CONSUME-SRV|MARSHAL-README|\.\./shared/")


def test_code_and_docs_cite_only_this_repositorys_pages() -> None:
    files = [
        *ROOT.glob("marshal_workers/**/*.py"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("examples/**/*.py"),
        ROOT / "README.md",
    ]
    citing = [
        str(path.relative_to(ROOT)) for path in files if path != Path(__file__) and OUTSIDE.search(path.read_text())
    ]
    assert citing == []


def test_test_files_have_names_of_their_own() -> None:
    """pytest imports test modules by their basename (rootdir conftest, no packages under tests/): two files of one
    name in different folders break the collection of the whole suite.  Name the newer one for what it tests."""
    seen: dict[str, list[str]] = {}
    for folder in ("tests", "examples"):
        for path in sorted((ROOT / folder).rglob("test_*.py")):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert len(seen) > 100, sorted(seen)  # the walk found the suite
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
