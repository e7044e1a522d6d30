"""Exit codes by name.

ExitCode: the marshal-workers command's (scripts and supervisors of supervisors use them).
WorkerExit: a worker's, telling its supervisor what to do next.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2  # click's own code for bad options
    CONFIG_ERROR = 3
    KAFKA_UNAVAILABLE = 4
    COORDINATION_ERROR = 5
    UNKNOWN_TOPIC = 6
    EMBEDDED_BROKER_ERROR = 7
    APP_LOAD_ERROR = 8  # MODULE:APP cannot be imported or is not an App
    NO_HANDLERS = 9  # the App registered no handler
    WORKER_BOOT_ERROR = 10  # workers cannot start (an on_worker_start hook failed): not retried in a loop
    UNKNOWN_GROUP = 11  # admin commands: the group has no record in the coordination log
    BAD_RANGE = 12  # replay: --from/--to do not fit the topic's log; nothing was started
    SPARK_UNAVAILABLE = 13  # pyspark is not installed (pip install 'marshal-workers[spark]') or Spark cannot start
    SPARK_JOB_FAILED = 14  # a Spark job failed: a split could not be read, or a handler failed after its retries
    NOT_YET_OBEYED = 15  # admin drain/shutdown/pause --topic/release: written, but still held after --wait
    INVARIANT_BROKEN = 16  # simulate: a simulated fleet broke an invariant (the report says which, and the seed)
    TOPIC_NOT_CREATED = 17  # topics create: the cluster refused to create a topic (the others were created)
    STARTUP_FAILED = 18  # run: an on_startup hook of the app failed; nothing was claimed


class WorkerExit(enum.IntEnum):
    """Exit codes that tell the supervisor what to do next."""

    STOPPED = 0  # asked to stop: release at the slot's next offset
    BOOT_ERROR = 3  # could not start (a hook failed): every worker would, so the supervisor stops
    RELEASE = 4  # on_error="release": release the partition at the failing message
    LOST = 5  # the partition is not ours any more: nothing to release
    SUPERVISOR_GONE = 6  # the supervisor died: exit without a word
    RECYCLE = 7  # a lifecycle limit (messages, memory) was reached: start a fresh worker at once
    SEND_FAILED = 8  # a message sent by a handler (app.send) was not confirmed: a crash, progress stays before it
