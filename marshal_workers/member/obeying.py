"""What a member does about an operator's orders, when and in what order (docs/operations.md).

:class:`Obeying` looks every HB/2 (with the heartbeat, before it), while the member runs: ``orders_for``
(protocol/orders.py) reads from the fold what the operators ask of it, and :func:`obey` carries it out, for a
supervisor (runtime/supervisor/remote_control.py), a simulated member (simulation/member.py) and an HTTP server's
served topic (http/served_topic.py, which calls ``obey`` on its own look) alike: a shutdown is a graceful stop and
nothing else; otherwise the member is drained or not, leases no more ranges of the shared topics held back (every
one when drained, else the paused ones), and hands over every partition an order gives up, unless it is already on
its way out (handed over or lost).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Generic, Protocol, TypeVar

from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.orders import Key, Orders, orders_for
from marshal_workers.protocol.world_state import WorldState


class Held(Protocol):
    """What obeying needs of a partition the member holds."""

    @property
    def key(self) -> Key: ...

    handing_over: bool
    lost: bool


H = TypeVar("H", bound=Held)
T = TypeVar("T")
H_contra = TypeVar("H_contra", bound=Held, contravariant=True)  # a protocol takes held partitions, never gives them


class Obedient(Protocol[H_contra]):
    """The member that carries the orders out."""

    def shut_down(self) -> None:
        """Stop as on SIGTERM: every partition released after its worker finishes."""
        ...

    def drain(self, drained: bool) -> None:
        """Claim nothing (and balance nothing) while ``drained``."""
        ...

    def hold_back(self, topics: set[str]) -> None:
        """Lease no more ranges of these shared topics; the others again."""
        ...

    def hand_over(self, held: H_contra, reason: str) -> None:
        """Stop ``held``'s worker and release the partition for another member (``reason``: the order)."""
        ...


def obey(orders: Orders, shared_topics: Collection[str], held: Iterable[H], member: Obedient[H]) -> None:
    """Carry ``orders`` out: ``shared_topics`` are the member's shared topics, ``held`` its partitions."""
    if orders.shutdown:
        member.shut_down()
        return
    member.drain(orders.drained)
    member.hold_back(set(shared_topics) if orders.drained else set(orders.paused_topics))
    for partition in list(held):
        reason = orders.give_up(partition.key)
        if reason is None or partition.handing_over or partition.lost:
            continue
        member.hand_over(partition, reason)


class OrdersShell(Protocol[H]):
    """What :class:`Obeying` needs of the member around it: its fold, its clock, its partitions, and the member
    that carries the orders out (:class:`Obedient`)."""

    def read(self, query: Callable[[WorldState], T]) -> T: ...

    def running(self) -> bool:
        """Not stopping: a stopping member reads no more orders."""
        ...

    def now_ms(self) -> int:
        """The wall clock it compares with the fold's record times (a pause's end)."""
        ...

    def holding(self) -> Iterable[H]:
        """The partitions it holds."""
        ...

    def shut_down(self) -> None: ...

    def drain(self, drained: bool) -> None: ...

    def hold_back(self, topics: set[str]) -> None: ...

    def hand_over(self, held: H, reason: str) -> None: ...


class Obeying(Generic[H]):
    """One member's looks at the orders about it, every HB/2."""

    def __init__(
        self, me: MemberId, started_ms: int, look_every_s: float, shared_topics: Collection[str], shell: OrdersShell[H]
    ) -> None:
        """``started_ms``: the member's wall clock at its start (an order to shut down before it is not for
        it); ``look_every_s``: HB/2; ``shared_topics``: its shared topics (a drain holds them all back)."""
        self.me = me
        self.started_ms = started_ms
        self.look_every_s = look_every_s
        self.shared_topics = set(shared_topics)
        self.shell = shell
        self._next_look = 0.0  # on the caller's monotonic clock

    def step(self, now: float) -> None:
        """Read the orders about us, if a look is due, and obey them (a stopping member reads none)."""
        if now < self._next_look:
            return
        self._next_look = now + self.look_every_s
        shell = self.shell
        if not shell.running():
            return
        me, started_ms, now_ms = self.me, self.started_ms, shell.now_ms()
        orders = shell.read(lambda world: orders_for(world, me, started_ms, now_ms))
        obey(orders, self.shared_topics, shell.holding(), shell)
