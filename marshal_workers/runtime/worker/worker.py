"""A worker: one process, one partition, the application's handler.

Forked by the fork server with the application preloaded.  It owns its Kafka
consumer (assigned to its partition, never a group member), checks the lease
before each message or batch, and reports progress through its slot.  It
never writes to the coordination topic: AMO claims go through the supervisor.

This module is the process's shell: it loads the app, opens the consumer,
builds the worker's link to its supervisor (link.py) and its account of
failed messages (failures.py), and hands both to the loop the handler needs:
one_call_loop.py (at least once, one message per call), batch_loop.py
(batches, and at most once) or lane_runner.py (concurrency).
"""

from __future__ import annotations

import logging
import os
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import TopicPartition

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.core.logs import ContextLog, partition_log
from marshal_workers.errors import SendError
from marshal_workers.handlers.app import App, Mode, effective_time_limits
from marshal_workers.handlers.hooks import Hooks, run_hooks
from marshal_workers.kafka import client_profiles
from marshal_workers.kafka.guarded_consumer import GuardedConsumer
from marshal_workers.kafka.outbox import Outbox
from marshal_workers.runtime.channel import Field, Slot, WorkerSpec
from marshal_workers.runtime.worker.admission import Admission
from marshal_workers.runtime.worker.batch_loop import BatchLoop
from marshal_workers.runtime.worker.failures import Failures, Outcome, exit_for, give_up_error
from marshal_workers.runtime.worker.instrumentation import LatencySampling, instrumented_handlers
from marshal_workers.runtime.worker.lane_runner import LaneRunner
from marshal_workers.runtime.worker.link import SupervisorGone, SupervisorLink
from marshal_workers.runtime.worker.one_call_loop import OneCallLoop
from marshal_workers.runtime.worker.process import (
    REAL_EDGES,
    ProcessEdges,
    TakenUp,
    exit_process,
    finish_worker,
    send_failed,
    take_up_handler,
)
from marshal_workers.runtime.worker.stack_dumps import worker_heading

_log = logging.getLogger(__name__)


def worker_main(spec: WorkerSpec, slot_array: Any, connection: Connection, rate_bucket: Any = None) -> None:
    """Entry point in the worker process (the target of the fork server's Process).  ``rate_bucket``: the
    handler's shared token bucket (rate_limits.py), if it has a rate_limit."""
    exit_process(Worker(spec, Slot(slot_array), connection, rate_bucket).run())


class Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        slot: Slot,
        connection: Connection,
        rate_bucket: Any = None,
        edges: ProcessEdges = REAL_EDGES,
    ) -> None:
        self.spec = spec
        self._edges = edges
        self.rate_bucket = rate_bucket
        self.slot = slot
        self.hooks = Hooks()  # the app's, once it is loaded
        self._partition_hooks_due = False
        self.log: ContextLog = partition_log(_log, spec.group, spec.topic, spec.partition)
        self._dlq = edges.dead_letters(spec.settings)
        self.outbox = Outbox(spec.settings)  # app.send's producer: flushed before progress is reported
        self.link = SupervisorLink(spec, slot, connection, self.log, self.outbox)

    # ------------------------------------------------------------ lifecycle

    def run(self) -> WorkerExit:
        self._init_process()
        try:
            app = self._edges.load(self.spec.app_path)
            taken = take_up_handler(app, self.spec.topic, self.outbox, self.rate_bucket, self.spec.settings)
            self.hooks = app.hooks
            handler = taken.handler
            # Skipping what a previous owner did out of order takes the lanes, whatever the concurrency.
            on_lanes = handler.runs_on_lanes or bool(self.spec.skip)
            if on_lanes:
                effective_time_limits(handler, self.spec.settings)  # refuses a soft limit past the hard one
                sampling = LatencySampling(handler)
            else:
                sampling = LatencySampling(*instrumented_handlers(handler, self.spec.settings, self.slot))
            for hook in app.worker_start_hooks:
                hook()
        except Exception:
            self.log.exception("worker cannot start")
            return WorkerExit.BOOT_ERROR
        run_hooks(app.hooks.on_partition_claimed, self.spec.topic, self.spec.partition)
        self._partition_hooks_due = True  # on_partition_released runs as the worker stops
        try:
            self.link.consumer = self._open_consumer()
            self.log.info(
                "worker started at offset %d (%s%s)",
                self.spec.start_offset,
                handler.mode.value,
                f", concurrency {handler.concurrency}" if on_lanes else "",
            )
            code = self._consume(taken, sampling, on_lanes)
            if code is WorkerExit.STOPPED and self.link.recycle_reason is not None:
                self.log.info("worker restarts: %s", self.link.recycle_reason)
                return WorkerExit.RECYCLE
            return code
        except SupervisorGone:
            return WorkerExit.SUPERVISOR_GONE
        except SendError as exc:
            return send_failed(self.log, exc)
        finally:
            self._finish(app)

    def _consume(self, taken: TakenUp, sampling: LatencySampling, on_lanes: bool) -> WorkerExit:
        """The loop the handler needs, given the worker's link and its account of failures."""
        link, handler = self.link, sampling.plain
        failures = Failures(link, self._dlq, self.hooks, taken.max_age_ms)
        if on_lanes:
            return LaneRunner(link, failures, handler, taken.throttle, taken.max_age_ms).run()
        give_up_on = self.spec.give_up_on
        if give_up_on is not None:
            error = give_up_error(self.spec.give_up_reason, self.spec.settings.crash_limit, handler)
            outcome = failures.give_up_on(handler, give_up_on[1], error)
            if outcome is None:
                return WorkerExit.STOPPED
            if outcome is not Outcome.DONE:
                return exit_for(outcome)  # on_error="release" (or dlq_limit): released at them, as the lanes do
        admission = Admission(link, failures, taken.throttle, taken.max_age_ms)
        if handler.mode is Mode.ALO and not handler.batch:
            return OneCallLoop(link, failures, admission, sampling).run()
        return BatchLoop(link, failures, admission, sampling).run()

    def _init_process(self) -> None:
        self._edges.start(self.spec.settings, self._stack_dump_heading, self.link.request_stop)
        # Until start_process we ignored SIGTERM (as the fork server does): a stop asked for meanwhile is in the slot.
        self.link.check_stop_flag()
        self.link.set_title(self.spec.start_offset)

    def _stack_dump_heading(self) -> str:
        spec = self.spec
        return worker_heading(
            os.getpid(), spec.group, spec.topic, spec.partition, f"at offset {self.slot.get(Field.NEXT_OFFSET)}"
        )

    def _finish(self, app: App | None) -> None:
        if self._partition_hooks_due:
            run_hooks(self.hooks.on_partition_released, self.spec.topic, self.spec.partition)
        self.link.send_outcomes()
        finish_worker(app, self.log, self._dlq, self.link.consumer, self.outbox)

    def _open_consumer(self) -> GuardedConsumer:
        """The worker's reader of its partition, placed at its start offset."""
        spec = self.spec
        consumer = self._edges.consumer(
            client_profiles.worker_consumer(spec.settings),
            f"worker of {spec.group} {spec.topic}[{spec.partition}]",
            spec.settings.heartbeat_interval,
            on_stall=lambda stalls: self.slot.set(Field.FETCH_STALLS, stalls),
        )
        consumer.assign([TopicPartition(spec.topic, spec.partition, spec.start_offset)])
        consumer.read_without_gaps_if_the_broker_skips(spec.settings.connect_timeout)
        return consumer
