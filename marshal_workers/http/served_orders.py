"""A served topic as operators' orders see it: what member/obeying.py's Obeying asks of the member it looks after.

``admin drain`` or ``admin pause --topic``: the server claims nothing and gives back what no client holds (acks are
still taken); ``admin shutdown``: it stops as on SIGTERM.  The orders a supervisor obeys, obeyed as it does, looked
at every ORDERS_INTERVAL_S: a served topic is a member with one shared topic and no whole partition.  A shutdown
ordered with a drain or pause leaves ``held_back`` as it was: stopping claims nothing and gives back what no client
holds already.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from marshal_workers.core.logs import ContextLog
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.member.obeying import Held
from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")


class Served(Protocol):
    """What of a ServedTopic (served_topic.py, which imports this module) the orders use."""

    held_back: bool  # set by hold_back

    @property
    def topic(self) -> str: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def log(self) -> ContextLog: ...

    @property
    def on_shutdown_order(self) -> Callable[[], object] | None: ...

    @property
    def coordinator(self) -> Coordinator: ...

    def begin_stop(self) -> None: ...


class ServedOrders:
    """member/obeying.py's OrdersShell for one ServedTopic."""

    def __init__(self, served: Served) -> None:
        self.served = served

    def read(self, query: Callable[[WorldState], T]) -> T:
        """``query`` answered by the coordination log's fold (the orders about this server)."""
        return self.served.coordinator.read(query)

    def running(self) -> bool:
        return not self.served.stopping

    def now_ms(self) -> int:
        return self.served.coordinator.now_ms()

    def holding(self) -> tuple[Held, ...]:
        return ()  # no whole partition: only ranges of its one shared topic

    def shut_down(self) -> None:
        served = self.served
        if served.stopping:
            return
        served.log.warning("%s: an operator ordered a shutdown (admin shutdown): stopping as on SIGTERM", served.topic)
        served.begin_stop()
        if served.on_shutdown_order is not None:
            served.on_shutdown_order()

    def drain(self, drained: bool) -> None:
        """Nothing more than hold_back: drained, this server holds its one topic back."""

    def hold_back(self, topics: set[str]) -> None:
        served = self.served
        held_back = served.topic in topics
        if held_back != served.held_back:
            served.log.warning(
                "%s: %s",
                served.topic,
                "drained or paused by an operator: claiming nothing, giving back what no client holds"
                if held_back
                else "resumed by an operator",
            )
            served.held_back = held_back

    def hand_over(self, held: Held, reason: str) -> None:
        """Never asked: a served topic's partitions are shared, leased in ranges, never held whole."""
