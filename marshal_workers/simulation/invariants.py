"""The invariants a simulation checks, from the log as it grows and from samples of the fleet.

* **One live owner**: when the fold (the oracle's: every record in log order, so at every prefix) accepts a
  claim, no other member may hold a lease on that partition that has not run out: its worker could still
  handle messages while the new owner's does.
* **Nothing skipped**: a new owner resumes at or below the first offset no worker has handled (at least once).
* **Slow handlers handed over**: a member whose handler is slowed below its partitions' produce rate hands
  each of them over within (behind_cycles + 4) health cycles, while another member is live to take it.
* **Owned after faults**: once the last fault ended, every partition is owned and fresh within
  ``own_bound_hb`` heartbeat intervals.
* **Balanced after faults** (balance="fair"): once the last fault ended, every partition is held by a member
  of the fleet (live, not leaving, not frozen) and the largest and smallest shares differ by at most one
  within ``balance_bound_hb`` heartbeat intervals, and stay so.
"""

from __future__ import annotations

from dataclasses import dataclass

from marshal_workers.protocol.claiming import Key

MAX_KEPT = 20  # violations kept in full; the rest are counted


@dataclass(frozen=True)
class Violation:
    invariant: str
    at_s: float
    detail: str

    def as_json(self) -> dict[str, object]:
        return {"invariant": self.invariant, "at_s": round(self.at_s, 3), "detail": self.detail}


@dataclass
class Sample:
    """The fleet at one instant, as the oracle's fold sees it."""

    at: float
    owned: bool  # every partition owned and fresh
    spread: int | None  # largest minus smallest share among the fleet's members (None: no member)


class Violations:
    def __init__(self) -> None:
        self.kept: list[Violation] = []
        self.count = 0

    def add(self, invariant: str, at: float, detail: str) -> None:
        self.count += 1
        if len(self.kept) < MAX_KEPT:
            self.kept.append(Violation(invariant, at, detail))


def first_owned_at_or_after(samples: list[Sample], start: float) -> float | None:
    return next((s.at for s in samples if s.at >= start and s.owned), None)


def settled_since(samples: list[Sample], start: float, end: float, step: float) -> float | None:
    """When the fleet became balanced for good within [start, end): None if it is not at the end."""
    window = [s for s in samples if start <= s.at < end]
    if not window or window[-1].spread is None or window[-1].spread > 1:
        return None
    unbalanced = [s.at for s in window if s.spread is None or s.spread > 1]
    return start if not unbalanced else unbalanced[-1] + step


def recovered_at(samples: list[Sample], start: float, end: float) -> float | None:
    """When every partition was owned and fresh again after the first sample in [start, end) at which one was
    not (``start`` itself if none was not; None if they were not again before ``end``)."""
    window = [s for s in samples if start <= s.at < end]
    lost = next((i for i, s in enumerate(window) if not s.owned), None)
    if lost is None:
        return start if window else None
    return next((s.at for s in window[lost:] if s.owned), None)


def check_bounds(
    samples: list[Sample],
    faults_end: float,
    duration: float,
    hb: float,
    own_bound_hb: float,
    balance_bound_hb: float,
    step: float,
    violations: Violations,
    fair: bool,
) -> None:
    """Owned and (``fair``: balance="fair") balanced within their bounds after the last fault (only if the run
    lasts that long).  balance="greedy" promises no balance."""
    own_deadline = faults_end + own_bound_hb * hb
    if own_deadline <= duration:
        owned = first_owned_at_or_after(samples, faults_end)
        if owned is None or owned > own_deadline:
            violations.add(
                "owned after faults",
                own_deadline,
                f"not every partition owned and fresh within {own_bound_hb:g} HB of the last fault "
                f"(at {faults_end:g}s)",
            )
    balance_deadline = faults_end + balance_bound_hb * hb
    if fair and balance_deadline <= duration:
        settled = settled_since(samples, faults_end, duration + step, step)
        if settled is None or settled > balance_deadline:
            violations.add(
                "balanced after faults",
                balance_deadline,
                f"shares not within one of each other for good within {balance_bound_hb:g} HB of the "
                f"last fault (at {faults_end:g}s); settled at {settled}",
            )


class HandledPrefix:
    """Per partition, the first offset not handled by any worker (workers handle from where they resume)."""

    def __init__(self) -> None:
        self.prefix: dict[Key, int] = {}

    def resumed(self, key: Key, offset: int) -> bool:
        """May a worker resume at ``offset``?  Not above the first offset nobody handled."""
        return offset <= self.prefix.get(key, 0)

    def handled(self, key: Key, start: int, offset: int) -> None:
        if start <= self.prefix.get(key, 0) < offset:
            self.prefix[key] = offset
