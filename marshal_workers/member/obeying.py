"""What a member does about an operator's orders, in what order (docs/operations.md).

``orders_for`` (protocol/orders.py) reads from the fold what the operators ask of one member; :func:`obey` carries
it out, for a supervisor (runtime/supervisor/remote_control.py), a simulated member (simulation/operator.py) and
an HTTP server's served topic (http/served_topic.py) alike: a shutdown is a graceful stop and nothing else;
otherwise the member is drained or not, leases no more ranges of the shared topics held back (every one when
drained, else the paused ones), and hands over every partition an order gives up, unless it is already on its
way out (handed over or lost).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar

from marshal_workers.protocol.orders import Key, Orders


class Held(Protocol):
    """What obeying needs of a partition the member holds."""

    @property
    def key(self) -> Key: ...

    handing_over: bool
    lost: bool


H = TypeVar("H", bound=Held)
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
