"""The invariants and figures of shared (range-lease) and at-most-once topics, from the oracle's fold and the
simulated workers (docs/simulation.md, "Shared and at-most-once topics").

* **one live holder (ranges)**: when a member takes a lease (its claim's verdict) or the oracle's fold accepts a
  range claim, no other lease a simulated worker holds on an offset of it may be usable (before its deadline);
* **at most once**: an at-most-once topic's offset (whole or shared) is never handled twice;
* **nothing marked done unhandled**: an ``ack_ranges`` or ``progress_ranges`` entry the fold accepts on an
  at-least-once topic marks done only offsets a worker handled, and the partition's low-water mark never passes
  an offset no worker handled.
"""

from __future__ import annotations

from typing import Any

from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import Key
from marshal_workers.protocol.worker_supply import PoolLease
from marshal_workers.protocol.world_state import WorldState, per_entry
from marshal_workers.simulation.handled_runs import HandledRuns
from marshal_workers.simulation.invariants import Violations
from marshal_workers.simulation.sim_config import SimConfig

_RANGE_RECORDS = (codec.ClaimRanges, codec.RenewRanges, codec.AckRanges, codec.ProgressRanges, codec.CancelRanges)


class RangeOracle:
    def __init__(self, config: SimConfig, violations: Violations) -> None:
        self.config = config
        self.violations = violations
        self.amo = config.amo_topic_names()
        self.amo_whole = config.amo_whole_topics()
        self.shared = frozenset(config.shared_counts())
        self.handled = HandledRuns()
        self.leases: dict[Key, list[tuple[object, PoolLease]]] = {}
        self.range_records = 0
        self.message_claim_records = 0
        self.repeats = 0  # at least once: offsets handled again (after a lapse, a crash)
        self.amo_repeats = 0
        self.active = bool(self.shared or self.amo)

    def tracks(self, key: Key) -> bool:
        return key[0] in self.amo_whole

    # ------------------------------------------------------------ workers

    def worker_handled(self, key: Key, start: int, end: int, now: float) -> None:
        """A worker (whole or shared) handled ``[start, end)`` of ``key``."""
        again = self.handled.add(key, start, end)
        if not again:
            return
        if key[0] in self.amo:
            self.amo_repeats += again
            self.violations.add(
                "at most once",
                now,
                f"{key[0]}[{key[1]}]: {again} offset(s) of {start}..{end - 1} handled a second time",
            )
        else:
            self.repeats += again

    def lease_taken(self, owner: object, topic: str, leased: PoolLease, now: float, now_ms: int) -> None:
        key = (topic, leased.partition)
        self._check_overlap(key, leased.start, leased.end, now, now_ms, "taken by a worker")
        self.leases.setdefault(key, []).append((owner, leased))

    def lease_dropped(self, owner: object, topic: str, leased: PoolLease) -> None:
        key = (topic, leased.partition)
        self.leases[key] = [(o, held) for o, held in self.leases.get(key, []) if held is not leased]

    def _check_overlap(self, key: Key, start: int, end: int, now: float, now_ms: int, how: str) -> None:
        for _, held in self.leases.get(key, []):
            if held.start < end and start < held.end and now_ms < held.deadline_ms:
                self.violations.add(
                    "one live holder (ranges)",
                    now,
                    f"{key[0]}[{key[1]}] {start}..{end - 1} {how} while a worker's lease on "
                    f"{held.start}..{held.end - 1} runs {held.deadline_ms - now_ms} ms more",
                )
                return

    # ------------------------------------------------------------- the log

    def appended(self, record: Any, verdict: Any, world: WorldState, now: float, now_ms: int) -> None:
        """A record the oracle's fold just folded, with its verdict."""
        if not self.active:
            return
        kind = type(record)
        if kind is codec.MessageClaims:
            self.message_claim_records += 1
            return
        if kind not in _RANGE_RECORDS:
            return
        self.range_records += 1
        topic = record.topic
        verdicts = per_entry(verdict, len(record.ranges))
        if kind is codec.ClaimRanges:
            for entry, ok in zip(record.ranges, verdicts):
                if ok:
                    self._check_overlap(
                        (topic, entry.partition), entry.offset, entry.end, now, now_ms, "claimed in the log"
                    )
        elif kind in (codec.AckRanges, codec.ProgressRanges) and topic not in self.amo:
            for entry, ok in zip(record.ranges, verdicts):
                if ok:
                    self._check_done(world, (topic, entry.partition), entry.offset, entry.end, entry.failed, now)

    def _check_done(
        self, world: WorldState, key: Key, start: int, end: int, failed: tuple[int, ...], now: float
    ) -> None:
        at = start
        for offset in [*sorted(o for o in failed if start <= o < end), end]:
            if not self.handled.covered(key, at, offset):
                first = self.handled.missing(key, at, offset)
                self.violations.add(
                    "nothing marked done unhandled",
                    now,
                    f"{key[0]}[{key[1]}]: offsets {start}..{end - 1} marked done; {first} was never handled",
                )
                return
            at = offset + 1
        shared = world.shared_partition(*key)
        if shared is not None and shared.low is not None and not self.handled.covered(key, 0, shared.low):
            self.violations.add(
                "nothing marked done unhandled",
                now,
                f"{key[0]}[{key[1]}]: the low-water mark is {shared.low}; "
                f"{self.handled.missing(key, 0, shared.low)} was never handled",
            )

    # ------------------------------------------------------------ figures

    def figures(self, world: WorldState, duration: float) -> dict[str, Any]:
        """The shared and at-most-once figures of a run (empty if it has neither)."""
        if not (self.shared or self.amo):
            return {}
        lost = 0
        for (topic, _), state in world.shared.items():
            if topic in self.amo:
                lost += state.lost
        for key, whole in world.partitions.items():
            if key[0] in self.amo_whole and whole.resume_offset is not None:
                lost += whole.resume_offset - self.handled.count_below(key, whole.resume_offset)
        low = {f"{t}[{p}]": s.low for (t, p), s in sorted(world.shared.items()) if s.low is not None}
        return {
            "range_records": self.range_records,
            "range_records_per_s": round(self.range_records / duration, 3),
            "message_claim_records": self.message_claim_records,
            "message_claim_records_per_s": round(self.message_claim_records / duration, 3),
            "repeats": self.repeats,
            "amo_repeats": self.amo_repeats,
            "amo_lost_offsets": lost,
            "low_water_marks": low,
        }
