"""Faults to inject, written ``KIND@T[:ARGS]`` (``crash@60s:members=40``, ``freeze@30s:member=3,for=5s``).

Members are numbered from 0 in the order they joined.  A fault names members with ``member=N`` (one),
``members=N`` (that many, drawn from the live ones by the run's seeded random source) or neither (one, drawn).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marshal_workers.core.durations import parse_duration
from marshal_workers.errors import ConfigError

# kind -> what it does (``--help`` lists these) and the arguments it takes
FAULT_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "crash": (
        (
            "members die at once (workers too); each restarts as a new instance of the same client after "
            "`for` (default 5s; `for=never`: stays dead)"
        ),
        ("member", "members", "for"),
    ),
    "freeze": (
        "members stop (loop, reads, writes, workers) and thaw after `for` (default 3*HB: past the lease)",
        ("member", "members", "for"),
    ),
    "lose-writes": ("members' coordination writes are lost for `for` (default 2*HB)", ("member", "members", "for")),
    "stall-reads": ("members read nothing of the log for `for` (default 2*HB)", ("member", "members", "for")),
    "skew": (
        (
            "members' wall clocks are off by `by` (default 3s; negative: behind): the `ts` of their records, "
            "which the fold ignores (it uses the broker's record time), so nothing else may change; with "
            "`of=clock` also the clock their decisions compare with record times (what is stale, who is live)"
        ),
        ("member", "members", "by", "of"),
    ),
    "deaf": (
        (
            "members can write but not read, for `for` (default 3*HB: past the lease): their heartbeats land and "
            "keep their partitions owned in everyone else's view, but they learn no verdict, so their workers "
            "stop when the lease runs out and nothing is handled until they hear again"
        ),
        ("member", "members", "for"),
    ),
    "stall-log": (
        (
            "coordination partition `partition` (default 0) stalls for everyone for `for` (default 2*HB): "
            "nothing is appended to it until then (writes wait, and fail after the write timeout)"
        ),
        ("partition", "for"),
    ),
    "join": ("`members` new members (default 1) start at once", ("members",)),
    "leave": ("members stop gracefully: their workers stop and their partitions are released", ("member", "members")),
    "slow": (
        (
            "members' handlers slow to `rate` messages/s (default 0.1), below the partitions' produce rate, "
            "for `for` (default 30s; `for=never`: to the end): the health monitor must hand their partitions over"
        ),
        ("member", "members", "rate", "for"),
    ),
    "order": (
        (
            "an operator's order (simulation/operator.py), ACTION first: `release` (`partition`, `topic`; or one "
            "drawn from `member`'s), `drain`/`shutdown`/`resume` (`member`), `pause` (`topic`, `for`, default "
            "5*HB), `resume` (`topic`): the members must obey it within 2 HB of reading it"
        ),
        ("member", "topic", "partition", "for"),
    ),
}
ORDER_ACTIONS = ("release", "drain", "resume", "shutdown", "pause")


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float  # virtual seconds
    args: dict[str, str] = field(default_factory=dict)

    def duration(self, default: float) -> float | None:
        """``for``: seconds, or None for ``never`` / to the end of the run."""
        given = self.args.get("for")
        if given == "never":
            return None
        return default if given is None else parse_duration(given)

    def count(self, default: int = 1) -> int:
        return int(self.args.get("members", default))

    @property
    def member(self) -> int | None:
        given = self.args.get("member")
        return None if given is None else int(given)

    def seconds(self, name: str, default: float) -> float:
        given = self.args.get(name)
        if given is None:
            return default
        negative = given.startswith("-")
        value = parse_duration(given.lstrip("-"))
        return -value if negative else value

    def number(self, name: str, default: float) -> float:
        given = self.args.get(name)
        return default if given is None else float(given)

    @property
    def action(self) -> str | None:
        """An order's action (``order@30s:release,...``); None for the other kinds."""
        return self.args.get("action")

    def __str__(self) -> str:
        args = ",".join(v if k == "action" else f"{k}={v}" for k, v in self.args.items())
        return f"{self.kind}@{self.at:g}s" + (f":{args}" if args else "")


def _time(when: str) -> float:
    """A fault's time: a duration, or zero (the start)."""
    if when.strip() in ("0", "0s", "0ms"):
        return 0.0
    return parse_duration(when)


def parse_fault(text: str) -> Fault:
    """``KIND@T[:ARGS]``; ARGS is ``name=value`` pairs separated by commas."""
    head, _, rest = text.partition(":")
    kind, at_sign, when = head.partition("@")
    if kind not in FAULT_KINDS or not at_sign:
        raise ConfigError(f"--fault {text!r}: write KIND@T[:ARGS] with KIND one of {', '.join(FAULT_KINDS)}")
    try:
        at = _time(when)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"--fault {text!r}: {when!r} is not a time (30s, 2m, 1.5): {exc}") from None
    args: dict[str, str] = {}
    pairs = list(filter(None, rest.split(",")))
    if kind == "order":  # an order names its action first, bare: order@30s:release,partition=3
        if not pairs or pairs[0] not in ORDER_ACTIONS:
            raise ConfigError(
                f"--fault {text!r}: write order@T:ACTION[,ARGS] with ACTION one of {', '.join(ORDER_ACTIONS)}"
            )
        args["action"] = pairs.pop(0)
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or name not in FAULT_KINDS[kind][1]:
            allowed = ", ".join(FAULT_KINDS[kind][1])
            raise ConfigError(f"--fault {text!r}: {kind} takes {allowed} (name=value, comma-separated), not {pair!r}")
        args[name] = value
    if args.get("of", "records") not in ("records", "clock"):
        raise ConfigError(f"--fault {text!r}: of=records (the ts field only, the default) or of=clock (decisions too)")
    if args.get("for") == "never" and kind not in ("crash", "slow"):
        raise ConfigError(f"--fault {text!r}: for=never is for crash and slow only; give {kind} a duration (5s)")
    fault = Fault(kind, at, args)
    try:
        if int(args.get("partition", 0)) < 0:
            raise ValueError("partition must be 0 or more")
        fault.count(), fault.member, fault.number("rate", 0.0), fault.seconds("by", 0.0), fault.duration(0.0)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"--fault {text!r}: {exc}") from None
    return fault
