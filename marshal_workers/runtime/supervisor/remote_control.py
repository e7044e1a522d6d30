"""Remote control: a supervisor obeys an operator's orders read from the coordination log.

``marshal-workers admin drain|resume|shutdown|pause --topic|release`` write records (codec.Control,
codec.PauseTopic, codec.ReleasePartition) that every member folds.  The fold (world_state.py) refuses the
claims they forbid, so no member can take what an operator holds back, whatever it does.  This part of the
supervisor reads the orders about itself and obeys them: it hands over what it may no longer hold cleanly,
at the exact offsets, as on SIGTERM, and stops claiming what it may not claim.

:func:`orders_for` is pure (a world state and times in; protocol/orders.py), and so is when a member reads them
and what it does about them (member/obeying.py's :class:`Obeying`); the simulator drives both too.
:class:`RemoteControl` is the supervisor's component around them, and their shell.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from marshal_workers.core.config import Settings
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.member.obeying import Obeying
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
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
        hand_over: Callable[[Assignment, str], None],
        drain: Callable[[bool], None],
        shut_down: Callable[[], None],
        hold_back_shared: Callable[[set[str]], None],
        shared_topics: Collection[str] = (),
    ) -> None:
        """``started_ms``: coordinator time at our start (an order to shut down before it is not for us);
        ``hand_over``: hand a partition over on an order, ``drain``: claim nothing while drained (both the
        partition claims', partition_claims.py); ``shut_down``: stop as on SIGTERM; ``hold_back_shared``: the
        shared topics to lease no more ranges of (shared_pool.py)."""
        self.table = table
        self.coordinator = coordinator
        self.log = log
        self._hand_over = hand_over
        self._drain = drain
        self._shut_down = shut_down
        self._hold_back_shared = hold_back_shared
        me = MemberId(coordinator.client, coordinator.instance)
        self.obeying = Obeying(me, started_ms, settings.heartbeat_interval / 2, shared_topics, self)

    def waitables(self) -> list[object]:
        return []

    def step(self, now: float) -> None:
        self.obeying.step(now)

    def begin_stop(self) -> None:
        """Nothing: a stopping supervisor reads no more orders."""

    def stopped(self) -> bool:
        return True

    # ------------------------------------------------- the core's shell

    def read(self, query: Callable[[WorldState], Any]) -> Any:
        return self.coordinator.read(query)

    def running(self) -> bool:
        return self.table.running

    def now_ms(self) -> int:
        return self.coordinator.now_ms()

    def holding(self) -> Iterable[Assignment]:
        return self.table.assignments.values()

    def shut_down(self) -> None:
        self.log.info("shutdown ordered by an operator: releasing every partition after its worker finishes")
        self._shut_down()

    def drain(self, drained: bool) -> None:
        self._drain(drained)

    def hold_back(self, topics: set[str]) -> None:
        self._hold_back_shared(topics)

    def hand_over(self, assignment: Assignment, reason: str) -> None:
        self._hand_over(assignment, reason)
