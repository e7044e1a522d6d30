"""Remote control: a supervisor obeys an operator's orders read from the coordination log (release 0.5.0).

``marshal-workers admin drain|resume|shutdown|pause --topic|release`` write records (codec.Control,
codec.PauseTopic, codec.ReleasePartition) that every member folds.  The fold (world_state.py) refuses the
claims they forbid, so no member can take what an operator holds back, whatever it does.  This part of the
supervisor reads the orders about itself and obeys them: it hands over what it may no longer hold cleanly,
at the exact offsets, as on SIGTERM, and stops claiming what it may not claim.

:func:`orders_for` is pure (a world state and times in); :class:`RemoteControl` is the supervisor's part.
"""

from __future__ import annotations

from dataclasses import dataclass

from marshal_workers.protocol.world_state import Owner, WorldState
from marshal_workers.runtime.supervisor.assignments import Key, Phase, SupervisorState


@dataclass(frozen=True)
class Orders:
    """What the operators' records ask of one supervisor at a given time."""

    drained: bool = False  # release everything, claim nothing (admin drain, until admin resume)
    shutdown: bool = False  # stop as on SIGTERM (admin shutdown)
    paused_topics: frozenset[str] = frozenset()  # neither hold nor claim these topics (admin pause --topic)
    release: frozenset[Key] = frozenset()  # hand these partitions over (admin release)

    def give_up(self, key: Key) -> str | None:
        """Why the partition ``key`` must be handed over, or None if it may be kept."""
        if self.drained:
            return "drain"
        if key[0] in self.paused_topics:
            return "pause"
        if key in self.release:
            return "release"
        return None


def orders_for(world: WorldState, me: Owner, started_ms: int, now_ms: int) -> Orders:
    """The orders for the supervisor ``me``, started at ``started_ms`` (a shutdown ordered before it is old news)."""
    shutdown_at = world.shutdown_ordered(me.client)
    release = frozenset(key for key, state in world.partitions.items() if state.release_requested and state.owner == me)
    return Orders(
        drained=world.is_drained(me.client),
        shutdown=shutdown_at is not None and shutdown_at > started_ms,
        paused_topics=frozenset(world.paused_topics(now_ms)),
        release=release,
    )


class RemoteControl(SupervisorState):
    """The Supervisor's part that obeys operators (a mixin: the state is the supervisor's)."""

    drained: bool
    started_ms: int

    def _obey_operators(self) -> None:
        if self.phase is not Phase.RUNNING:
            return
        coordinator = self._require_coordinator()
        me, now_ms = self._me(), coordinator.now_ms()
        orders = coordinator.read(lambda world: orders_for(world, me, self.started_ms, now_ms))
        if orders.shutdown:
            self.log.info("shutdown ordered by an operator: releasing every partition after its worker finishes")
            self._begin_graceful_stop()
            return
        if orders.drained != self.drained:
            self.drained = orders.drained
            if orders.drained:
                self.log.info("drained by an operator: releasing everything, claiming nothing until resumed")
            else:
                self.log.info("resumed by an operator: claiming again")
        self.shared.held_back = set(self.shared.topics) if orders.drained else set(orders.paused_topics)
        for assignment in list(self.assignments.values()):
            reason = orders.give_up(assignment.key)
            if reason is None or assignment.handing_over or assignment.lost:
                continue
            self.log.info(
                "%s[%d]: handing it over (ordered by an operator: %s)", assignment.topic, assignment.partition, reason
            )
            assignment.ordered = reason
            self._give_back(assignment)
