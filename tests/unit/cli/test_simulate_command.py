"""``marshal-workers simulate``: --help lists every fault kind, a bad --fault says what to write, a sweep runs
seeds and says none broke."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from marshal_workers.cli import main
from marshal_workers.errors import ConfigError
from marshal_workers.simulation.faults import FAULT_KINDS, parse_fault


def test_help_lists_every_fault_kind() -> None:
    result = CliRunner().invoke(main, ["simulate", "--help"])
    assert result.exit_code == 0
    for kind in FAULT_KINDS:
        assert f"  {kind}: " in result.output, kind


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("quake@10s", "KIND one of crash"),
        ("crash@soon", "is not a time"),
        ("crash@10s:when=3", "crash takes member"),
        ("freeze@10s:for=forever", "duration"),
    ],
)
def test_a_bad_fault_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_fault(text)
    result = CliRunner().invoke(main, ["simulate", "--duration", "5s", "--fault", text])
    assert result.exit_code == 3 and says in result.output


def test_faults_read_back_as_written() -> None:
    assert str(parse_fault("freeze@30s:member=3,for=5s")) == "freeze@30s:member=3,for=5s"
    assert parse_fault("crash@0s:members=40").count() == 40 and parse_fault("skew@1m:by=-3s").seconds("by", 0) == -3


def test_a_sweep_runs_every_seed_and_reports_none_broken() -> None:
    args = [
        "simulate",
        "--partitions",
        "8",
        "--members",
        "3",
        "--duration",
        "30s",
        "--seeds",
        "3",
        "--json",
        "--fault",
        "crash@5s:members=1",
        "--fault",
        "freeze@8s:for=6s",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    swept = json.loads(result.output)
    assert (swept["runs"], swept["broken"], swept["first_broken"]) == (3, 0, [])


def test_a_run_prints_its_figures() -> None:
    result = CliRunner().invoke(main, ["simulate", "--partitions", "8", "--members", "2", "--duration", "20s"])
    assert result.exit_code == 0, result.output
    assert "every partition owned after" in result.output and "every invariant held" in result.output
