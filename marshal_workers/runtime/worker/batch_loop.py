"""A partition worker's loop for batch handlers, and for at most once: fetch a batch (AMO: claim it through the
supervisor first), handle it, record progress past it."""

from __future__ import annotations

import time
from typing import Any

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.handlers.app import FetchedMessage, HandlerSpec, Mode
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.worker.admission import Admission
from marshal_workers.runtime.worker.failures import Failures, Outcome, exit_for
from marshal_workers.runtime.worker.instrumentation import LatencySampling
from marshal_workers.runtime.worker.link import SupervisorLink


class BatchLoop:
    """Runs one partition's messages a batch at a time until asked to stop."""

    def __init__(
        self, link: SupervisorLink, failures: Failures, admission: Admission, sampling: LatencySampling
    ) -> None:
        self.link, self.failures, self.admission, self.sampling = link, failures, admission, sampling

    def run(self) -> WorkerExit:
        link, admission, fields = self.link, self.admission, self.link.fields
        plain = self.sampling.plain
        at_most_once = plain.mode is Mode.AMO
        while not link.stopping:
            records = link.fetch(link.fetch_size(plain.batch_size))
            handler = self.sampling.handler_for(records)
            if link.stopping:
                break  # fetched, not begun: the next owner gets them
            if not records or not link.wait_for_lease():
                continue
            end = records[-1].offset() + 1
            fresh, old, passed = admission.split(records)
            # The batch's tokens before its claim: stopped while waiting, nothing is claimed or begun.
            if admission.throttle is not None and fresh and not admission.take_tokens(len(fresh)):
                break
            if at_most_once:
                refused = link.claim_batch(end)
                if refused is not None:
                    return refused
                # Claimed: whatever happens now, these messages are never handled again.  A claim answered
                # late (our supervisor was frozen) may come after another owner took over: the lease says.
                if not link.wait_for_lease():
                    return WorkerExit.STOPPED
            if old:
                self.failures.too_old(handler, old)
                fields[Field.PROCESSED] += len(old)
            fields[Field.PROCESSED] += passed
            outcome = Outcome.DONE
            if fresh:
                outcome = self._handle(handler, fresh) if handler.batch else self._handle_each(handler, fresh)
            if outcome is not Outcome.DONE:
                return exit_for(outcome)
            if handler.batch:
                fields[Field.PROCESSED] += len(fresh)
            link.outbox.flush()  # what the handlers sent (app.send), before progress past their inputs
            fields[Field.NEXT_OFFSET] = end
            link.count_handled(len(records))
        return WorkerExit.STOPPED

    def _handle(self, handler: HandlerSpec, records: list[Any]) -> Outcome:
        """Call the handler on the batch; recover from a failure by the policy."""
        try:
            handler.call(records)
            return Outcome.DONE
        except Exception as exc:  # noqa: BLE001 - a handler is user code: any error goes to the retry policy
            return self.failures.recover(handler, records, exc)

    def _handle_each(self, handler: HandlerSpec, records: list[Any]) -> Outcome:
        """At most once, one message per call: handle every message of a claimed batch, stopping or not (a
        clean stop finishes the claim).  As lean as the one-call loop: one call per message, housekeeping when
        due."""
        link = self.link
        fields, function, wrap, now = link.fields, handler.function, FetchedMessage, time.monotonic
        topic, partition = link.spec.topic, link.spec.partition
        handling_end = int(Field.HANDLING_END)
        handled = 0
        try:
            for record in records:
                if now() >= link.next_housekeeping:
                    link.housekeeping()
                offset = record.offset()
                fields[handling_end] = offset + 1  # a call in flight (the batch's end moves NEXT_OFFSET)
                try:
                    function(wrap(record, 1, topic, partition, offset, record.value()))
                except Exception as exc:  # noqa: BLE001 - a handler is user code: any error goes to the retry policy
                    outcome = self.failures.recover(handler, [record], exc)
                    if outcome is not Outcome.DONE:
                        return outcome
                handled += 1
            return Outcome.DONE
        finally:
            fields[Field.PROCESSED] += handled
