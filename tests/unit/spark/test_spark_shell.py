"""The pure parts of the Spark shell: --from/--to parsing, session settings, job errors, the install hint."""

from __future__ import annotations

import importlib
import sys

import pytest

from marshal_workers.errors import ConfigError, MarshalWorkersError, OffsetRangeError, SparkUnavailableError
from marshal_workers.spark.jobs import task_error
from marshal_workers.spark.ranges import Bound, check_order, parse_bound
from marshal_workers.spark.session import local_threads, parse_spark_conf, prepare_environment, session_config


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("earliest", Bound("earliest")),
        ("LATEST", Bound("latest")),
        ("0", Bound("offset", 0)),
        ("1234", Bound("offset", 1234)),
        ("@1700000000000", Bound("time", 1_700_000_000_000)),
        ("2023-11-14T22:13:20", Bound("time", 1_700_000_000_000)),  # no zone: UTC
        ("2023-11-14T23:13:20+01:00", Bound("time", 1_700_000_000_000)),
    ],
)
def test_bounds_are_parsed(text: str, bound: Bound) -> None:
    assert parse_bound(text) == bound


@pytest.mark.parametrize("text", ["", "-5", "yesterday", "@", "@-1", "12 34"])
def test_a_bad_bound_says_what_is_expected(text: str) -> None:
    with pytest.raises(OffsetRangeError, match=r"--to .*expected earliest, latest, an offset"):
        parse_bound(text, "--to")


def test_ranges_that_run_backwards_are_refused_before_kafka_is_asked() -> None:
    check_order(Bound("offset", 5), Bound("offset", 5))
    check_order(Bound("time", 1), Bound("offset", 0))  # different kinds: only the log can tell
    for start, end in [(Bound("offset", 6), Bound("offset", 5)), (Bound("time", 2), Bound("time", 1))]:
        with pytest.raises(OffsetRangeError, match="is after --to"):
            check_order(start, end)
    with pytest.raises(OffsetRangeError):
        check_order(Bound("latest"), Bound("earliest"))


def test_session_settings() -> None:
    assert local_threads("local") == 1 and local_threads("local[2]") == 2 and local_threads("local[3,4]") == 3
    assert local_threads("local[*]") >= 1 and local_threads("spark://host:7077") is None
    config = session_config("local[2]", {"spark.driver.memory": "2g"})
    assert config["spark.ui.enabled"] == "false" and config["spark.ui.showConsoleProgress"] == "false"
    assert config["spark.sql.shuffle.partitions"] == "2"
    assert config["spark.driver.memory"] == "2g", "the user's settings win"
    assert "spark.sql.shuffle.partitions" not in session_config("yarn")


def test_a_local_master_gets_this_python_and_the_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    environ = {"PYTHONPATH": "/somewhere"}
    prepare_environment("local[2]", environ)
    assert environ["PYSPARK_PYTHON"] == sys.executable and environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert environ["PYTHONPATH"].split(":") == [str(tmp_path), "/somewhere"], "MODULE:APP imports from here"
    cluster: dict[str, str] = {}
    prepare_environment("spark://host:7077", cluster)
    assert cluster == {}, "executors elsewhere have their own python"


def test_spark_conf_pairs() -> None:
    assert parse_spark_conf(["spark.executor.memory=4g", "a.b = c=d"]) == {"spark.executor.memory": "4g", "a.b": "c=d"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_spark_conf(["spark.executor.memory"])


def test_a_failed_task_is_told_by_its_python_error() -> None:
    text = (
        "An error occurred while calling o52.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, "
        "most recent failure: Lost task 0.0 in stage 1.0 (TID 2) (127.0.0.1 executor driver): "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/replay.py", line 170, in replay_split\n'
        "    hook()\n"
        "marshal_workers.spark.split_reader.SplitReadError: reading t[0] 0..10 from b: no record after offset 4\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)\n"
        "Driver stacktrace:\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:1)\n"
        "Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        "ValueError: the retelling\n"
    )
    assert task_error(RuntimeError(text)) == "SplitReadError: reading t[0] 0..10 from b: no record after offset 4"
    assert task_error(RuntimeError("plain failure\nmore")) == "plain failure"


def test_without_pyspark_the_import_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "marshal_workers.spark" or n.startswith("marshal_workers.spark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspark", None)  # what an environment without pyspark looks like to imports
    with pytest.raises(ImportError, match=r"pip install 'marshal-workers\[spark\]'") as raised:
        importlib.import_module("marshal_workers.spark")
    assert isinstance(raised.value, SparkUnavailableError) and isinstance(raised.value, MarshalWorkersError)
