"""The one interface of the supervisor's components, and the loop's order of them.

A component is a plain object whose dependencies (the coordinator and the
writes in flight, the settings, the app, the Table of assignments, callbacks
into the supervisor) are given to its constructor.  The supervisor's loop
(supervisor.py) treats every component the same way:

* ``waitables()``: what the loop's wait should wake up for on its behalf
  (workers' pipes and exit sentinels, the coordinator's release events); what
  the wait found readable is ``Table.ready`` during the steps that follow;
* ``step(now)``: its share of one pass of the loop, ``now`` being the pass's
  monotonic time (so components whose work falls due together, like the
  heartbeat and the operators' orders, stay in step);
* ``begin_stop()``: a graceful stop began (the Table's phase is STOPPING);
* ``stopped()``: nothing of its own is left in flight, so the supervisor may exit.

No component reads or writes another's private members: what one needs of
another is a public method, or a callback given to its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.kafka.in_flight import InFlightWrites
from marshal_workers.runtime.supervisor.assignments import Table
from marshal_workers.runtime.supervisor.shared_pool import SharedPool


class Component(Protocol):
    def waitables(self) -> list[object]: ...

    def step(self, now: float) -> None: ...

    def begin_stop(self) -> None: ...

    def stopped(self) -> bool: ...


class WriteVerdicts:
    """The coordination writes in flight, as a component: each pass runs the callbacks of those decided
    (InFlightWrites.collect), so what other components wrote earlier in the pass is answered without waiting."""

    def __init__(self, writes: InFlightWrites) -> None:
        self.writes = writes

    def waitables(self) -> list[object]:
        return []  # the coordinator's own folds wake the loop (Supervisor._wait_for_events)

    def step(self, now: float) -> None:
        self.writes.collect()

    def begin_stop(self) -> None:
        """Nothing: verdicts keep coming while the others stop."""

    def stopped(self) -> bool:
        return True  # the components that wait on a write say so themselves


class SharedPoolStep:
    """The shared pool (shared_pool.py) as a component; a shared worker that cannot start stops the supervisor."""

    def __init__(self, pool: SharedPool, table: Table, fail: Callable[[int], None]) -> None:
        self.pool = pool
        self.table = table
        self._fail = fail

    def waitables(self) -> list[object]:
        return self.pool.waitables()

    def step(self, now: float) -> None:
        self.pool.step()
        if self.pool.boot_failed and self.table.running:
            self._fail(ExitCode.WORKER_BOOT_ERROR)

    def begin_stop(self) -> None:
        self.pool.begin_stop()

    def stopped(self) -> bool:
        return self.pool.stopped()
