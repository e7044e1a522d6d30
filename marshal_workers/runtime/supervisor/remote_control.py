"""Remote control: a supervisor obeys an operator's orders read from the coordination log.

``marshal-workers admin drain|resume|shutdown|pause --topic|release`` write records (codec.Control,
codec.PauseTopic, codec.ReleasePartition) that every member folds.  The fold (world_state.py) refuses the
claims they forbid, so no member can take what an operator holds back, whatever it does.  This part of the
supervisor reads the orders about itself and obeys them: it hands over what it may no longer hold cleanly,
at the exact offsets, as on SIGTERM, and stops claiming what it may not claim.

:func:`orders_for` is pure (a world state and times in; protocol/orders.py), and so is what a member does about
them (member/obeying.py's :func:`obey`); the simulator drives both too.  :class:`RemoteControl` is the supervisor's
component around them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.member.obeying import obey
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.orders import orders_for
from marshal_workers.runtime.supervisor.assignments import Assignment, Table


class RemoteControl:
    """The supervisor's component that obeys operators, every HB/2 before the heartbeat (component.py's interface)."""

    def __init__(
        self,
        table: Table,
        coordinator: Coordinator,
        settings: Settings,
        log: Any,
        started_ms: int,
        give_back: Callable[[Assignment], None],
        shut_down: Callable[[], None],
        hold_back_shared: Callable[[set[str]], None],
        shared_topics: Collection[str] = (),
    ) -> None:
        """``started_ms``: coordinator time at our start (an order to shut down before it is not for us);
        ``give_back``: hand a partition over (partition_claims.py); ``shut_down``: stop as on SIGTERM;
        ``hold_back_shared``: the shared topics to lease no more ranges of (shared_pool.py)."""
        self.table = table
        self.coordinator = coordinator
        self.hb_s = settings.heartbeat_interval
        self.log = log
        self.started_ms = started_ms
        self._give_back = give_back
        self._shut_down = shut_down
        self._hold_back_shared = hold_back_shared
        self._shared_topics = set(shared_topics)
        self._next_look = 0.0  # monotonic: when the orders are next read (with the heartbeat: every HB/2)

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        if now >= self._next_look:
            self._next_look = now + self.hb_s / 2
            self.obey_operators()

    def begin_stop(self) -> None:
        """Nothing: a stopping supervisor reads no more orders."""

    def stopped(self) -> bool:
        return True

    def obey_operators(self) -> None:
        """Read the orders about us from the fold and obey them: stop, stop claiming, hand partitions over."""
        if not self.table.running:
            return
        coordinator = self.coordinator
        me, now_ms = MemberId(coordinator.client, coordinator.instance), coordinator.now_ms()
        orders = coordinator.read(lambda world: orders_for(world, me, self.started_ms, now_ms))
        obey(orders, self._shared_topics, self.table.assignments.values(), self)

    # ------------------------------------------------- what obey() asks of us

    def shut_down(self) -> None:
        self.log.info("shutdown ordered by an operator: releasing every partition after its worker finishes")
        self._shut_down()

    def drain(self, drained: bool) -> None:
        if drained == self.table.drained:
            return
        self.table.drained = drained
        if drained:
            self.log.info("drained by an operator: releasing everything, claiming nothing until resumed")
        else:
            self.log.info("resumed by an operator: claiming again")

    def hold_back(self, topics: set[str]) -> None:
        self._hold_back_shared(topics)

    def hand_over(self, assignment: Assignment, reason: str) -> None:
        self.log.info("%s[%d]: handing it over (ordered by an operator: %s)", assignment.topic, assignment.partition, reason)
        assignment.ordered = reason
        self._give_back(assignment)
