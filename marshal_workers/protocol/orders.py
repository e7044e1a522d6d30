"""What an operator's orders ask of one member: pure, over the fold.

``marshal-workers admin drain|resume|shutdown|pause --topic|release`` write records (codec.Control,
codec.PauseTopic, codec.ReleasePartition) that every member folds.  :func:`orders_for` reads the orders about
one member from its fold; the supervisor's component that obeys them (runtime/supervisor/remote_control.py),
the HTTP service (http/served_topic.py) and the simulator (simulation/operator.py) all ask it.
"""

from __future__ import annotations

from dataclasses import dataclass

from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState

Key = tuple[str, int]


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


def orders_for(world: WorldState, me: MemberId, started_ms: int, now_ms: int) -> Orders:
    """The orders for the supervisor ``me``, started at ``started_ms`` (a shutdown ordered before it is old news)."""
    shutdown_at = world.shutdown_ordered(me.client)
    return Orders(
        drained=world.is_drained(me.client),
        shutdown=shutdown_at is not None and shutdown_at > started_ms,
        paused_topics=frozenset(world.paused_topics(now_ms)),
        release=world.release_requests(me),
    )
