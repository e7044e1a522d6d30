"""A simulated member's at-most-once batch claims, as runtime/supervisor/message_claims.py writes them.

A worker of an at-most-once whole partition claims the end of its next batch before it handles it
(runtime/worker/lane_runner.py ``_fill_claimed``): the batch is what has arrived, up to ``batch_size`` messages.
The member writes every claim asked for since its last write in one go (group commit: while one write is in
flight, the claims asked meanwhile wait for it); an accepted claim moves the worker's claimed end on and extends
its lease (``claiming.lease_until``), a refused one means the partition is not ours (the worker stops), one not
confirmed is asked again.  The fold's ``claim_messages`` rules decide, in every member's ``WorldState``.
A worker handles nothing at or past its claimed end; a new owner resumes at ``max(offset, amo_offset)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from marshal_workers.protocol import codec
from marshal_workers.protocol.claim_batching import ClaimBatching
from marshal_workers.protocol.claiming import Key, lease_until
from marshal_workers.protocol.member_id import MemberId as Owner
from marshal_workers.protocol.world_state import WorldState, per_entry
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.sim_config import SimConfig

_MAX_CLAIMS_PER_RECORD = 4096  # codec.MAX_BEATS


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
    world: WorldState
    me: Owner
    frozen: bool

    def common(self) -> dict[str, Any]: ...

    def write(self, records: list[codec.Record], on_verdicts: Callable[[list[Any]], None],
              on_failure: Callable[[], None], within: float | None = None) -> None: ...  # fmt: skip

    def lose(self, assignment: Any) -> None: ...

    def progress(self, assignment: Any, now: float) -> int: ...


class AmoBatchClaims:
    """The batch claims of one member's at-most-once partitions (group commit)."""

    def __init__(self, env: AmoEnvironment, member: AmoWriter, topics: frozenset[str]) -> None:
        self.env = env
        self.member = member
        self.topics = topics
        self.claims: ClaimBatching[tuple[AmoAssignment, int]] = ClaimBatching()  # as message_claims.py holds them
        self.writes = 0
        self.refused = 0
        self.unconfirmed = 0

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
                self.claims.ask((assignment, end))
        self._write_held()

    def release_offset(self, assignment: AmoAssignment) -> int:
        """Where the next owner resumes: never before a claimed end (partition_claims._position)."""
        return max(int(assignment.offset), assignment.claimed_end)

    def _write_held(self) -> None:
        taken = self.claims.take()
        asked = [(a, end) for a, end in taken if not a.lost]
        for assignment, _ in taken:
            if assignment.lost:
                assignment.claim_asked = False  # not ours: refused without asking the log
        if not asked:
            return
        written_ms = self.env.clock.now_ms  # before the write: the lease errs short
        chunks: list[list[int]] = []
        by_topic: dict[str, list[int]] = {}
        for i, (assignment, _) in enumerate(asked):
            by_topic.setdefault(assignment.key[0], []).append(i)
        for indices in by_topic.values():
            chunks.extend(indices[i : i + _MAX_CLAIMS_PER_RECORD] for i in range(0, len(indices), _MAX_CLAIMS_PER_RECORD))
        common = self.member.common()
        records: list[codec.Record] = [
            codec.MessageClaims(**common, topic=asked[chunk[0]][0].key[0],
                                claims=tuple(codec.MessageClaim(partition=asked[i][0].key[1], offset=asked[i][1])
                                             for i in chunk))
            for chunk in chunks
        ]  # fmt: skip
        self.claims.writing()
        self.writes += 1

        def decided(verdicts: list[Any]) -> None:
            accepted = [False] * len(asked)
            for chunk, verdict in zip(chunks, verdicts):
                for i, ok in zip(chunk, per_entry(verdict, len(chunk))):
                    accepted[i] = ok
            self._after(asked, accepted, written_ms)

        # Fail fast (within an HB), as the supervisor does: a worker waits on this, and asks again.
        self.member.write(records, decided, lambda: self._failed(asked), within=self.env.config.heartbeat_s)

    def _after(self, asked: list[tuple[AmoAssignment, int]], accepted: list[bool], written_ms: int) -> None:
        for (assignment, end), ok in zip(asked, accepted):
            assignment.claim_asked = False
            if ok:
                assignment.claimed_end = max(assignment.claimed_end, end)
                lease = lease_until(written_ms, self.env.config.heartbeat_ms)
                assignment.lease_until_ms = max(assignment.lease_until_ms, lease)
            elif not assignment.lost:
                self.refused += 1
                owner = self.member.world.owner(*assignment.key)
                if owner != self.member.me:
                    self.member.lose(assignment)  # not ours: the worker stops
                # else: our lease had lapsed in the log; the worker asks again
        self._decided()

    def _failed(self, asked: list[tuple[AmoAssignment, int]]) -> None:
        for assignment, _ in asked:
            self.unconfirmed += 1
            assignment.claim_asked = False  # asked again (the log keeps the highest claim)
        self._decided()

    def _decided(self) -> None:
        self.claims.decided()
        self._write_held()
