"""Acks and cancels of a served topic's messages (docs/http-service.md): their states, the checks, the answer.

An ack or a cancel goes in steps the HTTP handler awaits between (nothing here blocks): the messages' states
(waiting, up to LOG_LAG_GRACE_S, while some are not yet in our view of the log), the checks (:func:`settlement`),
the write (the group commit), the answer once the log has judged it.  A client may ack or cancel through any
server of the group: every server judges by the same fold, and the one holding the lease learns of it from
the log; what this server settled it applies to its own held ranges at once.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from marshal_workers.http.group_commit import GroupCommit, Kind
from marshal_workers.http.http_messages import BadRequest, MessageId
from marshal_workers.http.serve_counters import ServeCounters
from marshal_workers.http.served_lease import ServedLease, covering
from marshal_workers.kafka.coordination_writer import Coordinator
from marshal_workers.protocol import codec
from marshal_workers.protocol.range_leases import SharedPartition
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.runtime.channel import monotonic_ms

LOG_LAG_GRACE_S = 1.0  # how long an ack of a message our log view has not seen handed out waits for the log
# Messages cancelled through this server and not handed out since, remembered (the latest ones, at most this many)
# only to tell a client that cancels one again that it was cancelled: the log has the cancel as a deadline passed.
MAX_CANCELLED_KEPT = 100_000


@dataclass(frozen=True)
class Settlement:
    """An ack or cancel that passed the checks: the messages to write (pending ones) and those done already."""

    kind: Kind
    verb: str  # "acked" or "cancelled": the answer's key
    todo: list[MessageId]
    already: int


def log_may_lag(states: Sequence[str]) -> bool:
    """Another server handed a message out and wrote so before its client heard of it, but our view of the log
    may lag by a fetch or two: worth waiting (up to LOG_LAG_GRACE_S) before calling a message never handed out
    (or, handed out again, expired; or, cancelled through us, handed out again by its holder since)."""
    return any(state in ("unknown", "undelivered", "expired", "cancelled") for state in states)


def settlement(ids: Sequence[MessageId], states: Sequence[str], kind: Kind) -> Settlement:
    """What an ack (``kind`` ACK) or cancel (CANCEL) of ``ids`` writes; BadRequest 409 if any of them cannot be
    settled (then nothing is)."""
    verb = "acked" if kind is Kind.ACK else "cancelled"
    already = [m for m, state in zip(ids, states) if state == "done" or (state == "acked" and kind is Kind.ACK)]
    bad = [(m, state) for m, state in zip(ids, states) if state not in ("pending", "done", "acked")]
    bad += [(m, state) for m, state in zip(ids, states) if state in ("done", "acked") and kind is Kind.CANCEL]
    if bad:
        raise BadRequest(
            409,
            "not_pending",
            f"{len(bad)} of the messages cannot be {verb}: nothing was {verb}",
            messages=[_problem(m, state) for m, state in bad],
        )
    return Settlement(kind, verb, [m for m, state in zip(ids, states) if state == "pending"], len(already))


class Settlements:
    """One served topic's acks and cancels: the states of their messages, their writes and their answers.

    It shares the served topic's held ranges, their lock and its counters; ``coordinator`` and ``commit`` give the
    served topic's coordinator and group commit, which exist once it has started."""

    def __init__(
        self,
        ranges: dict[tuple[int, int], ServedLease],
        lock: threading.Lock,
        counters: ServeCounters,
        coordinator: Callable[[], Coordinator],
        commit: Callable[[], GroupCommit],
    ) -> None:
        self._ranges = ranges
        self._lock = lock
        self._counters = counters
        self._coordinator = coordinator
        self._commit = commit
        self._cancelled_here: collections.OrderedDict[MessageId, None] = collections.OrderedDict()  # under the lock

    def states(self, ids: Sequence[MessageId]) -> list[str]:
        """Each message's state (see _message_state), ``cancelled`` for one cancelled through this server."""
        states = self._states(ids)
        with self._lock:  # the log has a cancel as the pending deadline passed: say which it was where we know
            return [
                "cancelled" if state == "expired" and found in self._cancelled_here else state
                for found, state in zip(ids, states)
            ]

    def handed_out(self, found: MessageId) -> None:
        """``found`` is out with a client again: no longer one cancelled here.  Under the lock."""
        if self._cancelled_here:
            self._cancelled_here.pop(found, None)

    def write(self, settlement: Settlement) -> asyncio.Future[list[bool]]:
        """The settlement's record, in the next group commit: its verdicts (CoordinationWriteError if not
        confirmed in time)."""
        entries = [codec.MessageEntry(m.partition, m.offset) for m in settlement.todo]
        return self._commit().submit(settlement.kind, entries)

    def settled(self, settlement: Settlement, verdicts: Sequence[bool]) -> dict[str, Any]:
        """The answer (200's body) once the log judged the settlement; BadRequest 409 if it refused some."""
        todo, verb = settlement.todo, settlement.verb
        refused = [m for m, ok in zip(todo, verdicts) if not ok]
        self._apply_locally(todo, verdicts, verb)
        late: set[MessageId] = set()  # refused by the log because another server's ack of them came first
        if refused and verb == "acked":
            # Acked meanwhile through another server (our view had not seen it): done, as the client wants.
            late = {m for m, state in zip(refused, self._log_states(refused)) if state in ("acked", "done")}
            refused = [m for m in refused if m not in late]
        if refused:
            self._counters.refused += len(refused)
            raise BadRequest(
                409,
                "partly_refused",
                f"{len(refused)} of the messages were no longer pending when the "
                f"log got the request (their deadline or lease ended): the others were {verb}",
                messages=[_problem(m, "expired") for m in refused],
            )
        return {verb: len(todo) - len(late), "already": settlement.already + len(late)}

    def _states(self, ids: Sequence[MessageId]) -> list[str]:
        """Each message's state as the fold has it now; one we answered a read with and whose hand-out is queued
        (or in flight) in our group commit counts as pending: an ack or cancel of it is written after it.

        Messages this server handed out under a lease it holds, whose pending time it still counts, are pending
        without a look at the log (the usual ack: no wait for the log's lock).  The log still judges the record:
        one acked or cancelled meanwhile through another server is refused there, and answered as such."""
        if self._pending_here(ids, monotonic_ms()):
            return ["pending"] * len(ids)
        return self._log_states(ids)

    def _log_states(self, ids: Sequence[MessageId]) -> list[str]:
        """_states as the log has it (our hand-outs not written yet count as pending)."""
        coordinator = self._coordinator()
        wall = coordinator.now_ms()
        states = coordinator.read(lambda world: [_message_state(world, m, wall) for m in ids])
        if "undelivered" in states:
            with self._lock:
                for i, (found, state) in enumerate(zip(ids, states)):
                    held = covering(self._ranges, found.partition, found.offset) if state == "undelivered" else None
                    if held is not None and found.offset in held.unwritten:
                        states[i] = "pending"
        return states

    def _pending_here(self, ids: Sequence[MessageId], now: int) -> bool:
        """Every message is out with a client from this server, under a lease it holds, until after ``now``: our
        own pending time ends before the log's (it starts before the hand-out's record is written)."""
        with self._lock:
            for found in ids:
                held = covering(self._ranges, found.partition, found.offset)
                if (
                    held is None
                    or held.deadline_ms <= now
                    or found.offset in held.acked
                    or held.pending_until.get(found.offset, 0) <= now
                ):
                    return False
        return True

    def _apply_locally(self, ids: Sequence[MessageId], verdicts: Sequence[bool], verb: str) -> None:
        with self._lock:
            for found, accepted in zip(ids, verdicts):
                if not accepted:
                    continue
                if verb == "acked":
                    self._counters.acked += 1
                else:
                    self._counters.cancelled += 1
                    self._cancelled_here[found] = None
                    if len(self._cancelled_here) > MAX_CANCELLED_KEPT:
                        self._cancelled_here.popitem(last=False)
                held = covering(self._ranges, found.partition, found.offset)
                if held is None:
                    continue  # another server's: it learns from the log
                if verb == "acked":
                    held.acked.add(found.offset)
                    held.messages.pop(found.offset, None)
                else:
                    held.pending_until[found.offset] = 0
                    held.free_again(found.offset)


def _message_state(world: WorldState, found: MessageId, wall_ms: int) -> str:
    """One message as the fold has it at ``wall_ms``: done, acked (by a client; the lease still runs), pending,
    expired (handed out, deadline passed), undelivered (leased, never handed out) or unknown (no lease)."""
    shared: SharedPartition | None = world.shared_partition(found.topic, found.partition)
    if shared is None:
        return "unknown"
    if shared.is_done(found.offset):
        return "done"
    lease = shared.covering(found.offset, wall_ms)
    if lease is None:
        return "unknown"
    if found.offset in lease.acked:
        return "acked"
    handed = lease.handed.get(found.offset)
    if handed is None:
        return "undelivered"
    return "pending" if handed[0] > wall_ms else "expired"


_WHY = {
    "unknown": "this group never handed it out, or the lease it was handed out under has ended (it will be "
    "delivered again)",
    "undelivered": "it was never handed out",
    "expired": "its pending deadline passed: it may be handed to another client",
    "cancelled": "it was cancelled (given back through this server) and not handed out since",
    "done": "it is done already (acked, or dead-lettered)",
    "acked": "it is acked already",
}


def _problem(found: MessageId, state: str) -> dict[str, Any]:
    return {
        "topic": found.topic,
        "partition": found.partition,
        "offset": found.offset,
        "state": state,
        "why": _WHY.get(state, state),
    }
