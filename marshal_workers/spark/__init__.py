"""marshal-workers on Apache Spark: replay handlers over a topic's history, audit a group's coordination log.

Installed with the ``spark`` extra (``pip install 'marshal-workers[spark]'``,
Java 17 or newer on the machine).  No Kafka connector jar is needed: Spark
tasks read their offset ranges with confluent-kafka (split_reader), so the
same application runs on ``local[*]`` or on a cluster master unchanged.

    planner       pure: (topic, partition, start, end) ranges -> splits of at most N offsets
    ranges        --from/--to (earliest, latest, an offset, a time) -> checked offset ranges
    split_reader  one split's records, read in a task with its own consumer
    session       the SparkSession, set up for this (local IP, workers' python, UI off)
    replay        run an App's handler over the splits, at least once per split
    ownership     pure: what the fold of one coordination partition says about owners
    audit         read, decode and fold a group's coordination log; tables and figures
"""

from __future__ import annotations

import importlib.util

from marshal_workers.errors import SparkUnavailableError

INSTALL_HINT = "pip install 'marshal-workers[spark]'"


def _pyspark_installed() -> bool:
    # find_spec, not import: pyspark takes a while to import, and only the Spark-side modules need it.
    try:
        return importlib.util.find_spec("pyspark") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["pyspark"] is None (import blocked)
        return False


if not _pyspark_installed():
    raise SparkUnavailableError(f"marshal_workers.spark needs pyspark, which is not installed: {INSTALL_HINT}")
