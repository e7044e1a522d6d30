"""A partition worker's loop at least once, one message per call: handle, then record progress; the heartbeat
carries it.

The hot path: per message a check of a flag (the alarm, alarm.py), a store before the call (a call in flight, for
the supervisor's health monitor and the call's age in ``status``), the message (FetchedMessage: its topic, partition,
offset and value as plain attributes), the call, a store after it.  The lease, housekeeping and a stop are looked at when
the alarm says so; retries and dead letters only after a failure (failures.py).
"""

from __future__ import annotations

from marshal_workers.core.exit_codes import WorkerExit
from marshal_workers.handlers.app import FetchedMessage
from marshal_workers.runtime.channel import Field
from marshal_workers.runtime.worker.admission import Admission, Admit
from marshal_workers.runtime.worker.alarm import Alarm
from marshal_workers.runtime.worker.failures import Failures, Outcome, exit_for
from marshal_workers.runtime.worker.instrumentation import LatencySampling
from marshal_workers.runtime.worker.link import SupervisorLink


class OneCallLoop:
    """Runs one partition's messages one call at a time, at least once, until asked to stop."""

    def __init__(
        self,
        link: SupervisorLink,
        failures: Failures,
        admission: Admission,
        sampling: LatencySampling,
        alarm: Alarm | None = None,
    ) -> None:
        self.link, self.failures, self.admission, self.sampling = link, failures, admission, sampling
        self.alarm = alarm if alarm is not None else Alarm()  # the next look at the lease and housekeeping
        link.watch_with(self.alarm)  # a stop raises it

    def run(self) -> WorkerExit:
        """Progress is stored after each message, unless the handlers sent messages (app.send) not yet flushed: then
        it waits (``unreported``) until the outbox is flushed, once for the fetch, or before looking up from it."""
        link, admission = self.link, self.admission
        fields, next_offset, processed = link.fields, int(Field.NEXT_OFFSET), int(Field.PROCESSED)
        handling_end = int(Field.HANDLING_END)
        wrap, outbox = FetchedMessage, link.outbox
        topic, partition = link.spec.topic, link.spec.partition
        due = self.alarm.due
        plain = self.sampling.plain
        while not link.stopping:
            records = link.fetch(link.fetch_size(plain.batch_size))
            if admission.max_age_ms and records:
                records = admission.drop_old_run(plain, records)
            handler = self.sampling.handler_for(records)
            function = handler.function
            handled = unreported = 0
            limited = admission.limited or bool(link.not_ours)  # or a message for another group in this fetch
            self._set_check_at()
            for record in records:
                # The lease's end, housekeeping or a stop (SIGTERM raises it too): the alarm says when to look.
                if due[0]:
                    if unreported:
                        unreported = link.report_sent(unreported)
                    if link.stopping:
                        break
                    link.housekeeping()
                    if not link.lease_holds():
                        break
                    self._set_check_at()
                    if link.stopping:
                        break
                if limited:
                    admitted = admission.admit(handler, record)
                    if admitted is Admit.STOP:
                        break  # asked to stop while waiting for the rate limit: this message is not begun
                    if admitted is Admit.PASS:  # done: progress moves past it once what was sent is flushed
                        if outbox.pending:
                            unreported = record.offset() + 1
                        else:
                            fields[next_offset] = record.offset() + 1
                        handled += 1
                        continue
                # The hot path: a store before the call (a call in flight: the supervisor's health monitor), the
                # call, a store after it.  Retries and dead letters only after a failure.
                offset = record.offset()
                end = offset + 1
                fields[handling_end] = end
                try:
                    function(wrap(record, 1, topic, partition, offset, record.value()))
                except Exception as exc:  # noqa: BLE001 - a handler is user code: any error goes to the retry policy
                    outcome = self.failures.recover(handler, [record], exc)
                    if outcome is not Outcome.DONE:
                        if unreported:
                            link.report_sent(unreported)
                        fields[processed] += handled
                        return exit_for(outcome)
                if outbox.pending:
                    unreported = end
                else:
                    fields[next_offset] = end
                handled += 1
            if unreported:
                link.report_sent(unreported)
            fields[processed] += handled
            link.count_handled(handled)
        return WorkerExit.STOPPED

    def _set_check_at(self) -> None:
        """When the loop next looks up from its messages: the lease's end or housekeeping, now if stopping."""
        if self.link.stopping:
            self.alarm.raise_now()
        else:
            self.alarm.set(self.link.next_look())
