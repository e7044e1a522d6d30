"""The options of ``marshal-workers run``: every one is documented, and bad values are refused with a hint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from marshal_workers.cli import main
from marshal_workers.cli.running import run
from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def documented_run_options() -> set[str]:
    """The options in the first column of the table under "## `run` options" in docs/operations.md."""
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("## `run` options", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(--[a-z0-9-]+)", section, re.MULTILINE))


def test_every_option_of_run_is_documented_and_nothing_else() -> None:
    options = {opt for param in run.params for opt in param.opts if opt.startswith("--")}
    documented = documented_run_options()
    assert options - documented == set(), f"run options missing from {OPERATIONS.name}"
    assert documented - options == set(), f"{OPERATIONS.name} documents options run does not have"


def test_a_memory_limit_without_a_unit_under_1mb_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "memory_limit_app.py").write_text(
        "from marshal_workers import App\napp = App(group='g')\n@app.handler('t')\ndef handle(msg): pass\n"
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "memory_limit_app:app", "--max-memory-per-worker", "512"])
    assert result.exit_code == ExitCode.CONFIG_ERROR, result.output
    assert "512 is 512 bytes" in result.output and "did you mean 512MB?" in result.output


@pytest.mark.parametrize(
    ("flag", "expected"), [([], True), (["--no-release-if-behind"], False), (["--release-if-behind"], True)]
)
def test_release_if_behind_is_a_run_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], expected: bool
) -> None:
    (tmp_path / "behind_app.py").write_text(
        "from marshal_workers import App\napp = App(group='g')\n@app.handler('t')\ndef handle(msg): pass\n"
    )
    monkeypatch.chdir(tmp_path)
    seen = []

    class Supervisor:  # what run would start, with the settings it gets
        def __init__(self, app: object, app_path: str, settings: Settings) -> None:
            seen.append(settings)
            self.restart_requested = False

        def run(self) -> int:
            return 0

    monkeypatch.setattr("marshal_workers.runtime.supervisor.supervisor.Supervisor", Supervisor)
    result = CliRunner().invoke(main, ["run", "behind_app:app", *flag], env={"MARSHAL_WORKERS_RELEASE_IF_BEHIND": None})
    assert result.exit_code == 0, result.output
    assert [s.release_if_behind for s in seen] == [expected]
