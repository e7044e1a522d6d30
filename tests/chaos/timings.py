"""How long a user of the fleet waits, in a nemesis run: for ``status`` after the heal, for a status answer that
shows the fleet settled, and for a (re)started supervisor to be up.

Pure functions over plain data (no Kafka, no processes), unit-tested in test_timings.py.  Times are wall-clock
seconds (``time.time()``), as the supervisors' text log lines are (local time, to the millisecond, on this host).

The ledger's ``complete_after_s`` says when the work was done; these say when a user could have seen it, and
what the machine made them wait for: a slow ``status`` is a slow answer to an operator, a slow start-up keeps a
restarted supervisor's partitions waiting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from fleet import StatusCall

# The text log format's asctime (marshal_workers/core/logs.py: TEXT_FORMAT), at the start of every line.
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# The start line's account of its start-up (supervisor_lines.StartUpTimes.text).
_IMPORTS = re.compile(r"interpreter and imports (\d+\.\d+)s")
_CPU = re.compile(r"; (\d+\.\d+) CPU-s\)")


@dataclass(frozen=True)
class StartUp:
    """One (re)start of a supervisor by the nemesis."""

    client: str
    started_at: float  # just before its process was spawned
    seconds: float | None  # until it logged its start line; None: it never did before it was killed or stopped
    broker_frozen_s: float = 0.0  # of those seconds, the broker frozen or stalled (or recovering): none can start
    imports_s: float | None = None  # of those seconds, the interpreter and imports, as its start line says
    cpu_s: float | None = None  # the CPU its process used until its start line, as that line says


def after_the_heal(calls: Iterable[StatusCall], healed_at: float) -> list[StatusCall]:
    """The status calls begun at or after the heal (those before it answered about a fleet under faults)."""
    return [call for call in calls if call.started >= healed_at]


def settled_seen_s(answers: Iterable[tuple[StatusCall, bool]], healed_at: float) -> float | None:
    """Seconds from the heal until the first status answer that showed the fleet settled came back (so its
    call's own time counts: a user sees nothing before the answer); None if no answer after the heal did.
    ``answers``: each status call and whether its answer showed every partition at its end."""
    seen = [
        call.answered_at for call, settled in answers if settled and not call.timed_out and call.started >= healed_at
    ]
    return max(0.0, min(seen) - healed_at) if seen else None


def start_line_at(log: str, client: str) -> float | None:
    """When supervisor ``client`` logged its first start line in ``log`` (supervisor_lines.start_line: "supervisor
    <client>/<instance> running ..."), as a wall-clock time; None if it logged none (or not in the text format)."""
    found = _start_line(log, client)
    return None if found is None else found[0]


def _start_line(log: str, client: str) -> tuple[float, str] | None:
    marker = re.compile(rf"\bsupervisor {re.escape(client)}/\S+ running ")
    for line in log.splitlines():
        stamp = _LOG_TIME.match(line)
        if stamp and marker.search(line):
            return datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line  # local time, as logged
    return None


def start_ups(client: str, log: bytes, starts: Sequence[tuple[float, int]]) -> list[StartUp]:
    """Each start of supervisor ``client`` timed by its log file, which every start appends to.  ``starts``: (its
    spawn time, the log's size then).  A start's lines run from its offset to the next start's, so a start line
    counts only for the process that wrote it."""
    ordered = sorted(starts, key=lambda start: (start[1], start[0]))
    found = []
    for i, (started_at, begin) in enumerate(ordered):
        end = ordered[i + 1][1] if i + 1 < len(ordered) else len(log)
        logged = _start_line(log[begin:end].decode(errors="replace"), client)
        if logged is None:
            found.append(StartUp(client, started_at, None))
            continue
        imports, cpu = _IMPORTS.search(logged[1]), _CPU.search(logged[1])
        found.append(
            StartUp(
                client,
                started_at,
                logged[0] - started_at,
                imports_s=float(imports[1]) if imports else None,
                cpu_s=float(cpu[1]) if cpu else None,
            )
        )
    return found


def slowest_call(calls: Sequence[StatusCall]) -> StatusCall | None:
    return max(calls, key=lambda call: call.seconds, default=None)


def slowest_start(found: Sequence[StartUp]) -> StartUp | None:
    timed = [start for start in found if start.seconds is not None]
    return max(timed, key=lambda start: start.seconds or 0.0, default=None)


def timings_line(calls: Sequence[StatusCall], settled_seen: float | None, found: Sequence[StartUp]) -> str:
    """The three figures on one line, e.g. 'status after the heal: 7 calls, slowest 1.3s; settled seen 2.4s after
    the heal; supervisor start-up: 9 starts, slowest 3.1s (s1)'."""
    slowest = slowest_call(calls)
    timed_out = sum(call.timed_out for call in calls)
    status = f"status after the heal: {len(calls)} calls, slowest " + (
        "-" if slowest is None else f"{slowest.seconds:.1f}s" + (" (timed out)" if slowest.timed_out else "")
    )
    if timed_out:
        status += f", {timed_out} timed out"
    settled = "NEVER" if settled_seen is None else f"{settled_seen:.1f}s after the heal"
    start = slowest_start(found)
    never = sum(start.seconds is None for start in found)
    started = f"supervisor start-up: {len(found) - never} starts, slowest " + (
        "-"
        if start is None
        else f"{start.seconds:.1f}s ({start.client}, broker frozen or stalled "
        f"{start.broker_frozen_s:.1f}s meanwhile{_imports_text(start)})"
    )
    up = slowest_start([s for s in found if s.broker_frozen_s == 0.0])
    if up is not None and up is not start:
        started += f", slowest with the broker up throughout {up.seconds:.1f}s ({up.client}{_imports_text(up)})"
    if never:
        started += f"; {never} killed or stopped before their start line"
    return f"{status}; settled seen {settled}; {started}"


def _imports_text(start: StartUp) -> str:
    imports = "" if start.imports_s is None else f", interpreter and imports {start.imports_s:.1f}s"
    return imports + ("" if start.cpu_s is None else f", {start.cpu_s:.2f} CPU-s")


def over_bounds(
    calls: Sequence[StatusCall], settled_seen: float | None, status_bound: float | None, settle_bound: float | None
) -> list[str]:
    """Problems for the long acceptance run: a post-heal status call slower than ``status_bound`` seconds (a timed-out
    one is), a fleet not seen settled within ``settle_bound`` seconds of the heal.  None: no bound."""
    problems = []
    slowest = slowest_call(calls)
    if status_bound is not None and slowest is not None and slowest.seconds > status_bound:
        problems.append(
            f"a status call after the heal took {slowest.seconds:.1f}s{' (timed out)' if slowest.timed_out else ''}, "
            f"over the bound of {status_bound:g}s ({sum(c.seconds > status_bound for c in calls)} of {len(calls)} did)"
        )
    if settle_bound is not None and (settled_seen is None or settled_seen > settle_bound):
        seen = "never" if settled_seen is None else f"only {settled_seen:.1f}s after the heal"
        problems.append(f"a status answer showed the fleet settled {seen}, over the bound of {settle_bound:g}s")
    return problems
