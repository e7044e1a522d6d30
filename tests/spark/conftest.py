"""One local Spark session for the Spark tests (local[2], UI off, stopped at the end), and what they replay.

Every JVM they start starts with the client compiler only (QUICK_JVM_START).

Spark's Python workers inherit the environment the session starts with, so the test application's
settings (tests/spark/apps/replay_app.py) are fixed here, once, before the session starts.  The Spark tests
are two xdist groups (pytestmark: the audit, the rest), so under ``pytest -n`` at most two pytest workers start
Spark, not each of them, and the audit's long tests run beside the others.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from spark_support import APPS, ReplayApp

from marshal_workers.spark.session import start_session, stop_session

# The JVMs these tests start (the session's, and each command's) run jobs of a few seconds: the client compiler only
# and one GC thread halve the CPU they take to start and run them (113 -> 60 CPU-s for tests/spark on 2 cores), and
# change nothing Spark does.  The java launcher reads JDK_JAVA_OPTIONS; a user's own value is kept.
QUICK_JVM_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"


@pytest.fixture(scope="session", autouse=True)
def quick_jvm_start() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # gives back whatever was there, an empty value included
        if not os.environ.get("JDK_JAVA_OPTIONS"):
            patch.setenv("JDK_JAVA_OPTIONS", QUICK_JVM_START)
        yield


@pytest.fixture(scope="session")
def replay_app(tmp_path_factory: pytest.TempPathFactory) -> ReplayApp:
    return ReplayApp(prefix=f"spark-{uuid.uuid4().hex[:8]}", sink=tmp_path_factory.mktemp("replay-sink"))


@pytest.fixture(scope="session")
def spark(replay_app: ReplayApp) -> Iterator:
    names = ("MW_SPARK_TOPIC_PREFIX", "MW_SPARK_SINK_DIR", "PYTHONPATH", "PYSPARK_PYTHON", "SPARK_LOCAL_IP")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["MW_SPARK_TOPIC_PREFIX"] = replay_app.prefix
    os.environ["MW_SPARK_SINK_DIR"] = str(replay_app.sink)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(APPS), saved["PYTHONPATH"]) if p)
    session = start_session("local[2]", app_name="marshal-workers tests")
    try:
        yield session
    finally:
        stop_session(session)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
