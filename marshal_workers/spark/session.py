"""The SparkSession that replay and audit run on: ``local[*]`` by default, any master URL otherwise.

On a local master the driver sets up what Spark's Python workers need on this
machine: the loopback address (no guessing of a network interface), this very
Python (the one with marshal-workers and the application installed), and the
current directory on their import path (as ``run`` imports MODULE:APP).  On a
cluster (spark://, yarn, k8s://) the executors' Python, marshal-workers and
the application are the cluster's business (spark-submit --py-files, an
image, spark.executorEnv.*), so nothing is set for them.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marshal_workers.errors import ConfigError, SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
_LOCAL = re.compile(r"^local(?:\[(?P<threads>\d+|\*)(?:,\d+)?\])?$")
_LOG4J = Path(__file__).with_name("log4j2.properties")
# Our --log-level -> Spark's: Spark's warnings are mostly noise for a command's user.
_SPARK_LEVELS = {"debug": "INFO", "info": "ERROR", "warning": "ERROR", "error": "ERROR"}


def is_local(master: str) -> bool:
    return master.startswith("local")


def local_threads(master: str) -> int | None:
    """The task slots of a local master (``local`` 1, ``local[N]`` N, ``local[*]`` the CPUs), else None."""
    match = _LOCAL.match(master)
    if match is None:
        return None
    threads = match.group("threads")
    if threads is None:
        return 1
    return (os.cpu_count() or 1) if threads == "*" else int(threads)


def session_config(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our defaults, then the user's ``--spark-conf`` settings, which win."""
    config = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # The driver's JVM heap; Spark refuses to start below ~450m. Only takes effect when we launch the JVM.
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}",
    }
    threads = local_threads(master)
    if threads is not None:
        # 200 shuffle partitions (the default) is 200 tasks per shuffle for 2 cores to schedule.
        config["spark.sql.shuffle.partitions"] = str(max(2, threads))
    config.update(conf or {})
    return config


def prepare_environment(master: str, environ: dict[str, str] | Any = os.environ) -> None:
    """For a local master: the environment that the JVM, and the Python workers it starts, inherit."""
    if not is_local(master):
        return
    environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if os.getcwd() not in paths:
        environ["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])


def start_session(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    app_name: str = "marshal-workers",
    log_level: str = "info",
) -> SparkSession:
    """A new SparkSession (and JVM); stop it with stop_session()."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        raise SparkUnavailableError("a SparkSession is already running in this process: pass that one instead")
    prepare_environment(master)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed gateway connection otherwise
    # pyspark logs every failed query with its JVM stack trace; the commands report the failure in one line.
    logging.getLogger("DataFrameQueryContextLogger").setLevel(
        logging.DEBUG if log_level == "debug" else logging.CRITICAL
    )
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_config(master, conf).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - pyspark raises PySparkRuntimeError(JAVA_GATEWAY_EXITED), Py4JJavaError, ...
        raise SparkUnavailableError(
            f"Spark did not start on master {master!r}: {str(exc).strip().splitlines()[0]}. Spark needs Java 17 or "
            "newer (java on PATH, or JAVA_HOME); a cluster master must be reachable from here"
        ) from None
    spark.sparkContext.setLogLevel(_SPARK_LEVELS.get(log_level, "ERROR"))
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the session and the JVM that pyspark launched for it, so nothing outlives the command or the test."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()  # the JVM exits when its stdin closes
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    SparkContext._gateway = None
    SparkContext._jvm = None


@contextmanager
def spark_session(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    app_name: str = "marshal-workers",
    log_level: str = "info",
) -> Iterator[SparkSession]:
    spark = start_session(master, conf, app_name, log_level)
    try:
        yield spark
    finally:
        stop_session(spark)


def parse_spark_conf(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options -> a dict; a pair without ``=`` is a usage mistake."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--spark-conf {pair!r}: expected KEY=VALUE, e.g. spark.executor.memory=4g")
        conf[key.strip()] = value.strip()
    return conf
