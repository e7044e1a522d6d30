"""A simulated member's at-most-once workers: the batch claims they ask for, through the member core.

A worker of an at-most-once whole partition claims the end of its next batch before it handles it
(runtime/worker/lane_runner.py ``_fill_claimed``): the batch is what has arrived, up to ``batch_size`` messages.
What the member writes for those claims and what the verdicts mean is the member core's ``BatchClaims``
(member/at_most_once.py), the object a supervisor's message claims (runtime/supervisor/message_claims.py) drive
too: group commit, an accepted claim moving the worker's claimed end on and extending its lease, a claim not
confirmed asked again.  This is its shell and the simulated workers around it: a refused claim means the partition
is not ours, unless our lease had lapsed in the log (then the worker asks again), as a real worker's exit makes
the worker pool decide (worker_pool.py ``_after_lost_claim``).  The fold's ``claim_messages`` rules decide, in
every member's ``WorldState``.  A worker handles nothing at or past its claimed end; a new owner resumes at
``max(offset, amo_offset)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from marshal_workers.member.at_most_once import BatchClaims, ClaimAnswer
from marshal_workers.member.shell import OnFailure, OnVerdicts
from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import Key
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.sim_config import SimConfig


class AmoAssignment(Protocol):
    key: Key
    offset: float
    worker_up_at: float
    lease_until_ms: int
    stopping_at: float | None
    lost: bool
    claimed_end: int
    claim_asked: bool


class AmoEnvironment(Protocol):
    clock: VirtualClock
    config: SimConfig

    def high_watermark(self, key: Key, now: float) -> int: ...


class AmoWriter(Protocol):
    frozen: bool

    def fields(self) -> dict[str, Any]: ...

    def lease_clock_ms(self) -> int: ...

    def submit_within(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None: ...

    def refused(self, assignment: Any) -> None: ...

    def progress(self, assignment: Any, now: float) -> int: ...


class AmoBatchClaims:
    """The batch claims of one member's at-most-once partitions, and the shell of its ``BatchClaims``."""

    def __init__(self, env: AmoEnvironment, member: AmoWriter, topics: frozenset[str]) -> None:
        self.env = env
        self.member = member
        self.topics = topics
        self.core: BatchClaims[AmoAssignment] = BatchClaims(self, env.config.heartbeat_s)

    def is_amo(self, key: Key) -> bool:
        return key[0] in self.topics

    def step(self, now: float, assignments: Iterable[AmoAssignment]) -> None:
        """Workers at the end of their batch ask for the next one; the claims asked go out in one write (after
        ``assignments`` is read: it may be the member's own table)."""
        if not self.topics:
            return  # no at-most-once topic: nothing to claim (the common case costs nothing)
        for assignment in assignments:
            if not self.is_amo(assignment.key) or assignment.claim_asked or assignment.lost:
                continue
            if assignment.stopping_at is not None or assignment.worker_up_at > now or self.member.frozen:
                continue
            self.member.progress(assignment, now)  # where its worker stands now
            if int(assignment.offset) < assignment.claimed_end:
                continue  # the batch in hand is not finished
            start = max(int(assignment.offset), assignment.claimed_end)
            end = min(start + self.env.config.batch_size, self.env.high_watermark(assignment.key, now))
            if end > start:
                assignment.claim_asked = True
                self.core.ask(assignment, end)
        self.core.step()

    # ------------------------------------------------ the shell BatchClaims drives

    def fields(self) -> dict[str, Any]:
        return self.member.fields()

    def lease_clock_ms(self) -> int:
        return self.member.lease_clock_ms()

    def submit(
        self, what: str, records: list[codec.Record], on_verdicts: OnVerdicts, on_failure: OnFailure, within: float
    ) -> None:
        self.member.submit_within(what, records, on_verdicts, on_failure, within)

    def current(self, assignment: AmoAssignment, worker: object) -> bool:
        return True  # a simulated worker is never replaced

    def answer(self, assignment: AmoAssignment, worker: object, answer: ClaimAnswer) -> None:
        assignment.claim_asked = False  # claimed, or it asks again
        if answer is ClaimAnswer.REFUSED and not assignment.lost:
            self.member.refused(assignment)
