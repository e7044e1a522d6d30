"""Judging a nemesis run from what a user sees: the produced messages, the handled ones, the faults.

Pure functions over plain data (no Kafka, no processes), unit-tested in
test_ledger.py.  Times are wall-clock seconds (``time.time()``), the clock
of the sink lines and of the fault log, both written on this host.

* Losses (at most once): messages delivered to Kafka that no handler ever
  saw.  On a partition they come as runs of consecutive offsets; each run
  must be explained by unclean faults that overlap it in time, at most one
  claimed batch per partition per fault.
* Duplicates (at least once): a message handled more than once.  Each
  repeat must follow an unclean fault: a clean hand-over repeats nothing.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fleet import SinkLine as Handled  # one line of the sink: a message a handler saw


@dataclass(frozen=True)
class FaultWindow:
    """A fault as it happened: from its first signal to its end (a kill has start == end)."""

    kind: str
    unclean: bool
    start: float
    end: float
    target: str = ""

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and self.end >= start


@dataclass(frozen=True)
class LossRun:
    """Consecutive offsets of one partition that were never handled."""

    partition: int
    first: int
    last: int
    after: float  # when the message before the run was handled (-inf: none was)
    before: float  # when the message after the run was handled (+inf: none was)

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Repeat:
    """A message handled again: its first handling and this one."""

    partition: int
    offset: int
    first_at: float
    again_at: float


def by_offset(handled: Iterable[Handled]) -> dict[tuple[int, int], list[Handled]]:
    """Every handling of each (partition, offset), in the order they happened."""
    found: dict[tuple[int, int], list[Handled]] = collections.defaultdict(list)
    for line in sorted(handled, key=lambda h: h.at):
        found[(line.partition, line.offset)].append(line)
    return found


def loss_runs(delivered: Iterable[tuple[int, int]], handled: Sequence[Handled]) -> list[LossRun]:
    """The delivered (partition, offset) pairs that were never handled, as runs per partition."""
    seen = by_offset(handled)
    per_partition: dict[int, list[int]] = collections.defaultdict(list)
    for partition, offset in delivered:
        per_partition[partition].append(offset)
    runs = []
    for partition, offsets in sorted(per_partition.items()):
        offsets.sort()
        run: list[int] = []
        for i, offset in enumerate(offsets):
            if (partition, offset) in seen:
                continue
            if run and offsets[i - 1] != run[-1]:  # a handled offset lies between: close the run
                runs.append(_run(partition, run, offsets, seen))
                run = []
            run.append(offset)
        if run:
            runs.append(_run(partition, run, offsets, seen))
    return runs


def _run(partition: int, run: list[int], offsets: list[int], seen: dict[tuple[int, int], list[Handled]]) -> LossRun:
    index = offsets.index(run[0])
    before_run = offsets[index - 1] if index > 0 else None
    after_index = index + len(run)
    after_run = offsets[after_index] if after_index < len(offsets) else None
    after = seen[(partition, before_run)][0].at if before_run is not None else -math.inf
    before = seen[(partition, after_run)][0].at if after_run is not None else math.inf
    return LossRun(partition, run[0], run[-1], after, before)


def repeats(handled: Sequence[Handled]) -> list[Repeat]:
    """Every handling of a message after its first."""
    found = []
    for (partition, offset), lines in by_offset(handled).items():
        for again in lines[1:]:
            found.append(Repeat(partition, offset, lines[0].at, again.at))
    return sorted(found, key=lambda r: (r.partition, r.offset, r.again_at))


def unexplained_losses(
    runs: Sequence[LossRun],
    faults: Sequence[FaultWindow],
    batch_size: int,
    slack: float,
    units: Callable[[FaultWindow], int] = lambda fault: 1,
    holes: bool = False,
) -> list[str]:
    """Loss runs that the unclean faults cannot explain.  Each fault may account for ``units(fault)`` claimed
    batches (``batch_size`` consecutive offsets each) per partition: one for a whole partition's worker, more
    for shared workers (every range a stricken supervisor's workers held); and only a fault that overlaps the
    run in time.  With ``holes`` (calls in flight together, lanes), one claimed batch may leave several runs
    with handled messages between them: runs that fit in one batch's offsets count as one.

    A run lies between the handling of the message before it (``after``) and of the one after it
    (``before``); the fault that lost it happened in that span, give or take ``slack`` seconds (a frozen
    supervisor's workers go on until the lease lapses).  Faults are matched earliest-first per partition.
    """
    problems = []
    unclean = sorted((f for f in faults if f.unclean), key=lambda f: f.start)
    for partition in sorted({run.partition for run in runs}):
        left = [units(fault) for fault in unclean]  # batches each fault may still explain on this partition
        mine = sorted((r for r in runs if r.partition == partition), key=lambda r: r.first)
        for group in _claimed_spans(mine, batch_size) if holes else [[run] for run in mine]:
            first, last = group[0].first, group[-1].last
            after, before = min(r.after for r in group), max(r.before for r in group)
            needed = math.ceil((last - first + 1) / batch_size)
            found = 0
            for i, fault in enumerate(unclean):
                if found < needed and left[i] and fault.overlaps(after - slack, before + slack):
                    taken = min(left[i], needed - found)
                    left[i] -= taken
                    found += taken
            if found < needed:
                lost = sum(r.size for r in group)
                problems.append(
                    f"partition {partition}: offsets {first}..{last} ({lost} messages) were lost, which needs "
                    f"{needed} claimed batch(es) of {batch_size} lost to unclean faults, but the unused faults that "
                    f"overlap that time explain only {found}"
                )
    return problems


def _claimed_spans(runs: Sequence[LossRun], batch_size: int) -> list[list[LossRun]]:
    """Runs of one partition (by offset) grouped into spans of at most ``batch_size`` offsets, each of which one
    claimed batch could have left (a run longer than a batch is a span of its own)."""
    spans: list[list[LossRun]] = []
    for run in runs:
        if spans and run.last < spans[-1][0].first + batch_size:
            spans[-1].append(run)
        else:
            spans.append([run])
    return spans


def unexplained_repeats(found: Sequence[Repeat], faults: Sequence[FaultWindow], slack: float) -> list[str]:
    """Repeats with no unclean fault between the first handling and the repeat (give or take ``slack``)."""
    unclean = [f for f in faults if f.unclean]
    return [
        f"partition {r.partition} offset {r.offset}: handled at {r.first_at:.3f} and again at {r.again_at:.3f} "
        "with no unclean fault in between"
        for r in found
        if not any(f.overlaps(r.first_at - slack, r.again_at) for f in unclean)
    ]


def out_of_key_order(handled: Sequence[Handled], key_of: Callable[[str], str]) -> list[str]:
    """Messages a worker handled before an earlier message of the same key and partition (``handled`` in the
    order the lines were written; ``key_of`` gives a message's key from its value).  Each worker process
    handles a key in offset order; a new worker (another pid) may start over, lower, after a fault."""
    last: dict[tuple[int, int, str], int] = {}
    problems = []
    for line in handled:
        key = (line.pid, line.partition, key_of(line.value))
        if key in last and line.offset <= last[key]:
            problems.append(
                f"partition {line.partition} key {key[2]}: worker {line.pid} handled offset {line.offset} after "
                f"offset {last[key]}"
            )
        last[key] = max(last.get(key, -1), line.offset)
    return problems


def merged(windows: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``windows`` (start, end) sorted, those that overlap or touch made one."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def unavailable_s(windows: Iterable[tuple[float, float]], start: float, end: float, recovery: float) -> float:
    """Seconds of ``start..end`` during which the broker was unavailable: inside one of ``windows`` (frozen by
    the nemesis, or seen stalled by its canary) or within ``recovery`` after one.  Overlapping windows count once."""
    clipped = ((max(w_start, start), min(w_end + recovery, end)) for w_start, w_end in windows)
    return sum(high - low for low, high in merged(window for window in clipped if window[1] > window[0]))


def broker_stalls(
    stalls: Iterable[tuple[float, float]], freezes: Sequence[tuple[float, float]], lease: float, grace: float
) -> list[FaultWindow]:
    """The broker's own stalls that count as unclean faults: the canary's stalled records, merged where they
    overlap, less every injected freeze up to ``grace`` after it (that fault is counted already), where what
    is left lasts longer than a lease (a supervisor's workers stop; a claim may land after its worker gave up).
    A broker that stays stalled well after a freeze ends has a second outage of its own."""
    pieces = merged(stalls)
    for f_start, f_end in sorted(freezes):
        cut = (f_start, f_end + grace)
        pieces = [
            piece
            for start, end in pieces
            for piece in ((start, min(end, cut[0])), (max(start, cut[1]), end))
            if piece[1] > piece[0]
        ]
    return [FaultWindow("broker_stall", True, start, end, "broker") for start, end in pieces if end - start > lease]
