"""Group commit of at-most-once batch claims: while one claim write is in flight, the claims asked meanwhile wait
for it, then go together in the next write.

The member core's batch claims (member/at_most_once.py), which the supervisor and the simulator drive, hold their
claims here: under load that is one write for most of the workers' claims instead of one each.  The caller writes
and answers the workers.
"""

from __future__ import annotations

from typing import Generic, TypeVar

Claim = TypeVar("Claim")


class ClaimBatching(Generic[Claim]):
    """The claims asked and not written yet, and whether a claim write is in flight."""

    def __init__(self) -> None:
        self.held: list[Claim] = []
        self.in_flight = False

    def ask(self, claim: Claim) -> None:
        self.held.append(claim)

    def take(self) -> list[Claim]:
        """The claims to write now: every one held, unless a write is in flight (then none: they wait for it)."""
        if self.in_flight:
            return []
        taken, self.held = self.held, []
        return taken

    def writing(self) -> None:
        """A write of claims taken is in flight: the next claims wait for its verdicts."""
        self.in_flight = True

    def decided(self) -> None:
        """The write in flight is decided (or failed): the next one may go."""
        self.in_flight = False
