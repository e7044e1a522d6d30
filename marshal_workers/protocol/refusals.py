"""Why the fold refused a record, for people: ``marshal-workers log`` shows it after each refused record.

The fold (world_state.py) gives verdicts only and never asks why; the admin commands do, right after folding
the record, from the state it left (a refused record changes nothing of the partition it is about).  The
reasons restate the rules of docs/protocol.md and docs/shared-partitions.md.
"""

from __future__ import annotations

from typing import Any

from marshal_workers.protocol.codec import (
    AckMessages,
    AckRanges,
    CancelMessages,
    CancelRanges,
    Checkpoint,
    Claim,
    ClaimMessages,
    ClaimRanges,
    Control,
    DeliverMessages,
    Heartbeats,
    MessageClaims,
    ProgressRanges,
    Record,
    ReleaseGroup,
    ReleasePartition,
    RenewRanges,
)
from marshal_workers.protocol.world_state import Verdicts, WorldState


def refusals(state: WorldState, record: Record, at: int, source: int, verdict: bool | Verdicts) -> list[str]:
    """Why the fold refused ``record``, or the refused entries of a record about several partitions: [] if it
    accepted it all.  Ask right after ``state.apply(record, at, source)`` gave ``verdict``: a refused record (or
    entry) leaves the partition it is about as it was, so its state still shows why.  For people (``log``);
    the fold itself never calls this."""
    if isinstance(verdict, Verdicts):
        if all(verdict):
            return []
    elif verdict:
        return []
    if record.group != state.group:
        return ["ignored: another group"]
    kind = type(record)
    if kind is Checkpoint:
        return ["ignored: a checkpoint of another coordination partition"]
    if kind is Control:
        return [f"ignored: {record.target} was not drained"]  # type: ignore[union-attr]  # a resume; the rest pass
    if kind is not ReleaseGroup and not state.routed_here(record.topic, source):  # type: ignore[union-attr]
        return ["ignored: not on its topic's coordination partition"]
    if kind is ReleasePartition:
        return ["ignored: the partition has no owner to ask"]
    if kind is Heartbeats:
        entries: list[Any] = record.heartbeats()  # type: ignore[union-attr]
    elif kind is MessageClaims:
        entries = record.claim_messages()  # type: ignore[union-attr]
    elif kind in (ClaimRanges, RenewRanges, AckRanges, CancelRanges, ProgressRanges):
        # Ignored: mypy does not narrow by type(record); a multi-entry record's verdict is Verdicts (its rules say so).
        refused = [e for e, ok in zip(record.ranges, verdict, strict=True) if not ok]  # type: ignore[union-attr, arg-type]
        why = "by the lease rules"
        if state.paused_at(source, at) is not None and kind in (ClaimRanges, RenewRanges):
            why = "the group is paused"
        elif isinstance(record, ClaimRanges) and state.held_back(record.client, record.topic, source, at):
            why = _held_back_reason(state, record.client, record.topic, source)
        return [f"refused [{e.partition}]{e.offset}..{e.end - 1}: {why}" for e in refused]
    elif kind in (DeliverMessages, AckMessages, CancelMessages):
        why = (
            "not in a live lease of its writer, or pending with a client"
            if kind is DeliverMessages
            else "not pending (never handed out, its pending timeout passed, or acked already)"
        )
        return [
            f"refused [{e.partition}]{e.offset}: {why}"
            for e, ok in zip(record.messages, verdict, strict=True)  # type: ignore[union-attr, arg-type]
            if not ok
        ]
    else:
        return [_refusal(state, record, at, source)]
    several = len(entries) > 1
    return [
        f"[{entry.partition}] {_refusal(state, entry, at, source)}" if several else _refusal(state, entry, at, source)
        for entry, ok in zip(entries, verdict, strict=True)  # type: ignore[arg-type]  # Verdicts, as above
        if not ok
    ]


def _refusal(state: WorldState, record: Record, at: int, source: int) -> str:
    """Why the fold refused a record about one partition (Claim, Heartbeat, Release, ClaimMessages)."""
    found = state.get(record.topic, record.partition)  # type: ignore[union-attr]
    owner = None if found is None else found.owner
    pause = state.paused_at(source, at)
    if isinstance(record, Claim):
        if pause is not None:
            return f"refused: the group is paused for {pause.until - at} ms more (by {pause.client})"
        if state.held_back(record.client, record.topic, source, at):
            return f"refused: {_held_back_reason(state, record.client, record.topic, source)}"
        if found is None or owner is None:
            return "refused"
        return f"refused: owned by {owner.client}/{owner.instance}, heard from {at - found.last_ts} ms before"
    if found is None or owner is None:
        return "(ignored: not the owner; it has none)"
    if owner.client != record.client or owner.instance != record.instance:
        return f"(ignored: not the owner; the owner is {owner.client}/{owner.instance})"
    if isinstance(record, ClaimMessages):
        if pause is not None:
            return f"refused: the group is paused for {pause.until - at} ms more (by {pause.client})"
        if state.topic_paused(record.topic, at):
            return f"refused: topic {record.topic} is paused (admin pause --topic)"
        return f"refused: the claim had lapsed (the owner was silent for {at - found.last_ts} ms, over 2 HB)"
    return "refused"


def _held_back_reason(state: WorldState, client: str, topic: str, source: int) -> str:
    controls = state.controls.get(source)
    if controls is not None and client in controls.drained:
        return f"client {client} is drained (admin drain)"
    return f"topic {topic} is paused (admin pause --topic)"
