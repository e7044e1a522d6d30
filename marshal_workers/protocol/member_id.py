"""Who a member is in the coordination log: its client id and its instance (docs/protocol.md, the common fields).

Every record names its writer by ``client`` (the host's or container's id, stable across restarts) and
``instance`` (random per process start).  The fold keeps the pair as a partition's owner
(world_view.PartitionState.owner) and as a range lease's holder (range_leases.Lease.holder); a member passes its
own as ``me``.  One type for all of them: an owner, a holder and a writer are the same member.
"""

from __future__ import annotations

from typing import NamedTuple


class MemberId(NamedTuple):
    """One start of one member: ``client`` (stable across restarts) and ``instance`` (random per process start)."""

    client: str
    instance: str
