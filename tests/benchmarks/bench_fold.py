"""Benchmark: how fast does a reader decode and fold the coordination log?

    /work/venv/bin/python tests/benchmarks/bench_fold.py [--records 1000000] [--seed 1] [--runs 3]

A realistic coordination log (docs/protocol.md) is built in memory
first, outside the timed part: one busy group and two smaller ones (~10% of
the records), ~8 clients per group with a stable instance each (plus restarts
and crashes, which bring new instances), several topics of 16-64 partitions,
HB = 5000 ms and the clock advancing ~1 ms per record.  Most records are
heartbeats; the rest are claim races (several clients claiming one free
partition at once), releases, claim_messages on an at-most-once topic, a
release_group every ~200k records (one copy per coordination partition) and
~0.1% garbage values.  Every record is routed to its coordination partition by
md5, as a real writer would.

Then, on one core, best of ``--runs``:

a. ceiling: ``orjson.loads`` of every value (what parsing alone costs);
b. decode + fold: ``codec.decode`` and ``WorldState.apply`` of every value into
   a fresh state of the busy group (what a reader really does).

For attribution it also times ``codec.decode`` alone (the rest of b is the
fold).  Targets: b >= 300,000 records/s and b/a >= 0.5.  A miss prints FAIL but the
exit status stays 0: this is a benchmark, not a test.  The log builder is
smoke-tested by tests/unit/protocol/test_bench_fold_smoke.py so it cannot silently rot.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):  # run as a script from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import codec
from marshal_workers.protocol.world_state import WorldState

HB_MS = 5000
COORDINATION_PARTITIONS = 8
BUSY_GROUP = "billing.invoices"
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

T = TypeVar("T")

TARGET_RECORDS_PER_S = 300_000
TARGET_RATIO = 0.5

# (group, share of the record stream, clients, [(topic, partitions, at-most-once)])
GROUPS: tuple[tuple[str, float, int, tuple[tuple[str, int, bool], ...]], ...] = (
    (
        BUSY_GROUP,
        0.93,
        8,
        (("orders", 32, False), ("invoices", 64, False), ("payments", 16, True), ("refunds", 24, False)),
    ),
    ("search.indexer", 0.04, 6, (("documents", 48, False),)),
    ("mail.sender", 0.03, 4, (("outbox", 16, True), ("bounces", 16, False))),
)

# Per-event probabilities of a running (unpaused) group.
P_GARBAGE = 0.001
P_RELEASE = 0.022  # health monitor gives a slow partition up: it becomes free and is raced for
P_ZOMBIE = 0.01  # of heartbeats: sent by someone who is not the owner (rejected by the fold)
P_CLAIM_MESSAGES = 0.5  # of events on an owned at-most-once partition
PAUSE_MS = 2 * HB_MS  # how long a release_group pauses the busy group


@dataclass
class Log:
    """The coordination log as a reader gets it: raw values, record times, coordination partitions."""

    values: list[bytes] = field(default_factory=list)
    times: list[int] = field(default_factory=list)  # the record time the fold uses (LogAppendTime)
    sources: list[int] = field(default_factory=list)  # the coordination partition each value was read from
    kinds: Counter[str] = field(default_factory=Counter)  # record type, or "garbage"
    groups: Counter[str] = field(default_factory=Counter)  # group of each record (garbage excluded)
    events: Counter[str] = field(default_factory=Counter)  # claim races, restarts, crashes, pauses

    @property
    def garbage(self) -> int:
        return self.kinds["garbage"]

    def __len__(self) -> int:
        return len(self.values)


class _IndexedSet:
    """A set with O(1) add, remove and uniform random choice."""

    __slots__ = ("index", "items")

    def __init__(self) -> None:
        self.items: list[tuple[str, int]] = []
        self.index: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: tuple[str, int]) -> bool:
        return item in self.index

    def add(self, item: tuple[str, int]) -> None:
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)

    def discard(self, item: tuple[str, int]) -> None:
        i = self.index.pop(item, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.index[last] = i

    def choice(self, rng: random.Random) -> tuple[str, int]:
        return self.items[int(rng.random() * len(self.items))]


Key = tuple[str, int]


class _GroupSim:
    """What the members of one group do, and what the log makes of it (a rough mirror of the fold)."""

    def __init__(self, name: str, share: float, n_clients: int, topics, rng: random.Random, new_instance) -> None:
        self.name = name
        self.share = share
        self.keys: list[Key] = [(topic, p) for topic, n, _ in topics for p in range(n)]
        self.amo_topics = {topic for topic, _, amo in topics if amo}
        self.clients = [f"{name.split('.')[0]}-worker-{i + 1:02d}.prod" for i in range(n_clients)]
        self.instances = [new_instance() for _ in range(n_clients)]
        self.alive_at = [0] * n_clients  # a crashed client comes back (new instance) at this time
        self.owner: dict[Key, tuple[int, str]] = {}  # key -> (client index, instance)
        self.last_ts: dict[Key, int] = {}
        self.offset: dict[Key, int] = {key: rng.randrange(0, 5_000_000) for key in self.keys}
        self.amo_offset: dict[Key, int] = {}
        self.owned = _IndexedSet()  # owned by a live current instance: these heartbeat
        self.free = _IndexedSet()  # claimable and nobody racing for it yet
        self.dying: dict[Key, int] = {}  # owner crashed: claimable once stale
        for key in self.keys:
            self.free.add(key)
        self.paused_until = 0
        self.operator = ("ops-console.prod", new_instance())

    def alive(self, ci: int, now: int) -> bool:
        return now >= self.alive_at[ci]

    def claimable(self, key: Key, ci: int, instance: str, at: int) -> bool:
        if at < self.paused_until:
            return False
        owner = self.owner.get(key)
        return (
            owner is None
            or at - self.last_ts[key] > 2 * HB_MS
            or (owner[0] == ci and owner[1] != instance)  # fast reclaim
        )


class _Builder:
    def __init__(
        self, n: int, seed: int, release_group_every: int, restart_every: int, crash_every: int, pause_ms: int
    ) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.log = Log()
        self.now = T0_MS
        self.groups = [
            _GroupSim(name, share, clients, topics, self.rng, self._new_instance)
            for name, share, clients, topics in GROUPS
        ]
        self.busy = self.groups[0]
        self.pending: deque[Callable[[], None]] = deque()
        self.route = {
            topic: codec.coordination_partition(topic, COORDINATION_PARTITIONS)
            for g in self.groups
            for topic, _ in g.keys
        }
        self.release_group_every = release_group_every
        self.restart_every = restart_every
        self.crash_every = crash_every
        self.pause_ms = pause_ms

    def _new_instance(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    # ------------------------------------------------------------ emitting

    def _emit(self, value: bytes, source: int, kind: str, group: str | None) -> None:
        log = self.log
        log.values.append(value)
        log.times.append(self.now)
        log.sources.append(source)
        log.kinds[kind] += 1
        if group is not None:
            log.groups[group] += 1
        self.now += int(self.rng.random() * 3)  # 0, 1 or 2 ms: ~1 ms per record

    def _ts(self) -> int:
        return self.now - int(self.rng.random() * 4)  # sender's clock: a few ms before the broker stamps it

    def _partition_record(
        self, cls, g: _GroupSim, ci: int, instance: str, key: Key, client: str | None = None, **extra
    ) -> None:
        record = cls(
            v=1,
            ts=self._ts(),
            group=g.name,
            client=g.clients[ci] if client is None else client,
            instance=instance,
            topic=key[0],
            partition=key[1],
            **extra,
        )
        self._emit(codec.encode(record), self.route[key[0]], record.__struct_config__.tag, g.name)

    # ------------------------------------------------------------ events that the fold judges

    def _claim(self, g: _GroupSim, key: Key, ci: int, instance: str) -> None:
        won = g.claimable(key, ci, instance, self.now)
        self._partition_record(codec.Claim, g, ci, instance, key)
        if won:
            g.dying.pop(key, None)
            g.owner[key] = (ci, instance)
            g.last_ts[key] = self.now
            g.free.discard(key)
            if g.alive(ci, self.now) and g.instances[ci] == instance:
                g.owned.add(key)
            else:  # the claimer crashed or restarted while its claim was in flight: it will go stale
                g.owned.discard(key)
                g.dying[key] = self.now + 2 * HB_MS + 1
        elif key not in g.owner and self.now >= g.paused_until:
            g.free.add(key)  # nobody won (cannot happen unpaused, kept for safety)

    def _heartbeat(self, g: _GroupSim, key: Key) -> None:
        ci, instance = g.owner[key]
        if self.rng.random() < P_ZOMBIE:  # a lost racer or an old instance that missed the news
            other = int(self.rng.random() * len(g.clients))
            zombie_instance = g.instances[other] if other != ci else self._new_instance()
            self._partition_record(codec.Heartbeat, g, other, zombie_instance, key, offset=g.offset[key])
            return
        if key[0] in g.amo_topics and self.rng.random() < P_CLAIM_MESSAGES:
            batch_end = max(g.offset[key], g.amo_offset.get(key, 0)) + 1 + int(self.rng.random() * 100)
            g.amo_offset[key] = batch_end
            self._partition_record(codec.ClaimMessages, g, ci, instance, key, offset=batch_end)
            g.offset[key] = batch_end  # processed by the next heartbeat
        else:
            g.offset[key] += int(self.rng.random() * 50)
            self._partition_record(codec.Heartbeat, g, ci, instance, key, offset=g.offset[key])
        g.last_ts[key] = self.now

    def _release(self, g: _GroupSim, key: Key) -> None:
        ci, instance = g.owner.pop(key)
        g.owned.discard(key)
        self._partition_record(codec.Release, g, ci, instance, key, offset=g.offset[key])
        g.free.add(key)

    def _claim_race(self, g: _GroupSim) -> None:
        key = g.free.choice(self.rng)
        g.free.discard(key)  # raced for now; whoever wins owns it
        live = [ci for ci in range(len(g.clients)) if g.alive(ci, self.now)]
        racers = self.rng.sample(live, min(len(live), self.rng.choice((1, 2, 2, 3, 3, 4))))
        self.log.events["claim races" if len(racers) > 1 else "uncontested claims"] += 1
        for ci in racers:
            instance = g.instances[ci]
            self.pending.append(lambda g=g, key=key, ci=ci, instance=instance: self._claim(g, key, ci, instance))

    # ------------------------------------------------------------ scheduled incidents

    def _release_group(self) -> None:
        g = self.busy
        self.log.events["release_group"] += 1
        g.paused_until = self.now + self.pause_ms
        client, instance = g.operator
        for source in range(COORDINATION_PARTITIONS):
            record = codec.ReleaseGroup(
                v=1, ts=self._ts(), group=g.name, client=client, instance=instance, expires=g.paused_until
            )
            self._emit(codec.encode(record), source, "release_group", g.name)
        former = list(g.owner.items())
        g.owner.clear()
        g.dying.clear()
        g.owned = _IndexedSet()
        g.free = _IndexedSet()
        for key in g.keys:
            g.free.add(key)
        # The operator rewinds a few partitions while the group is paused (accepted: same client).
        for key in self.rng.sample(g.keys, 4):
            offset = max(0, g.offset[key] - int(self.rng.random() * 10_000))
            g.offset[key] = offset
            g.amo_offset.pop(key, None)
            self.pending.append(
                lambda key=key, offset=offset: self._partition_record(
                    codec.Release, g, 0, instance, key, client=client, offset=offset
                )
            )
        # Stragglers that had not folded the pause yet: a heartbeat and a claim, both rejected.
        for key, (ci, inst) in self.rng.sample(former, min(3, len(former))):
            self.pending.append(
                lambda key=key, ci=ci, inst=inst: self._partition_record(
                    codec.Heartbeat, g, ci, inst, key, offset=g.offset[key]
                )
            )
        key = g.keys[int(self.rng.random() * len(g.keys))]
        ci = int(self.rng.random() * len(g.clients))
        self.pending.append(lambda: self._claim(g, key, ci, g.instances[ci]))

    def _pick_group(self) -> _GroupSim:
        r = self.rng.random()
        for g in self.groups:
            r -= g.share
            if r < 0:
                return g
        return self.groups[-1]

    def _restart(self) -> None:
        """A deploy: a client restarts (new instance) and takes its partitions back at once."""
        g = self._pick_group()
        ci = int(self.rng.random() * len(g.clients))
        if not g.alive(ci, self.now):
            return
        self.log.events["restarts"] += 1
        old = g.instances[ci]
        g.instances[ci] = new = self._new_instance()
        mine = [key for key, (c, inst) in g.owner.items() if c == ci and inst == old]
        for key in mine:
            g.owned.discard(key)  # the old process is gone: no more heartbeats from it
            self.pending.append(lambda key=key: self._claim(g, key, ci, new))
        for key in mine[:2]:  # the old process's last words, folded after the reclaim: rejected
            self.pending.append(
                lambda key=key: self._partition_record(codec.Heartbeat, g, ci, old, key, offset=g.offset[key])
            )

    def _crash(self) -> None:
        """A host dies (no release); others take its partitions once they go stale; it comes back later."""
        g = self._pick_group()
        ci = int(self.rng.random() * len(g.clients))
        if not g.alive(ci, self.now):
            return
        self.log.events["crashes"] += 1
        g.alive_at[ci] = self.now + 4 * HB_MS
        g.instances[ci] = self._new_instance()  # the instance it will come back with
        for key, (c, _) in g.owner.items():
            if c == ci:
                g.owned.discard(key)
                g.dying[key] = g.last_ts[key] + 2 * HB_MS + 1 + int(self.rng.random() * 500)

    def _expire_dying(self, g: _GroupSim) -> None:
        for key in [key for key, stale_at in g.dying.items() if self.now >= stale_at]:
            del g.dying[key]
            g.free.add(key)

    # ------------------------------------------------------------ garbage

    def _garbage(self) -> None:
        rng = self.rng
        g = self._pick_group()
        key = g.keys[int(rng.random() * len(g.keys))]
        source = self.route[key[0]]
        good = {
            "v": 1,
            "type": "heartbeat",
            "ts": self._ts(),
            "group": g.name,
            "client": g.clients[0],
            "instance": g.instances[0],
            "topic": key[0],
            "partition": key[1],
            "offset": g.offset[key],
        }
        kind = rng.randrange(9)
        if kind == 0:
            value = rng.randbytes(rng.randrange(1, 200))  # random bytes
            source = rng.randrange(COORDINATION_PARTITIONS)
        elif kind == 1:
            value = orjson.dumps(good)[: rng.randrange(1, 60)]  # truncated JSON
        elif kind == 2:
            value = b"{'v': 1, 'type': 'heartbeat'}"  # not JSON
        elif kind == 3:
            value = orjson.dumps({**good, "partition": str(key[1])})  # wrong type
        elif kind == 4:
            value = orjson.dumps({**good, "offset": -1})  # out of range
        elif kind == 5:
            value = orjson.dumps({**good, "v": 2})  # unknown version
        elif kind == 6:
            value = orjson.dumps({**good, "type": "steal"})  # unknown type
        elif kind == 7:
            bad = dict(good)
            del bad["instance"]  # missing field
            value = orjson.dumps(bad)
        else:
            value = rng.choice((b"null", b"[]", b"42", b'"heartbeat"', b""))  # not an object
        self._emit(value, source, "garbage", None)

    # ------------------------------------------------------------ main loop

    def build(self) -> Log:
        rng = self.rng
        log = self.log
        n = self.n
        next_release_group = self.release_group_every
        next_restart = self.restart_every // 2
        next_crash = self.crash_every
        while len(log.values) < n:
            i = len(log.values)
            if i >= next_release_group:
                next_release_group += int(self.release_group_every * (0.9 + 0.2 * rng.random()))
                self._release_group()
                continue
            if i >= next_restart:
                next_restart += int(self.restart_every * (0.5 + rng.random()))
                self._restart()
            if i >= next_crash:
                next_crash += int(self.crash_every * (0.5 + rng.random()))
                self._crash()
            if i % 64 == 0:
                for g in self.groups:
                    if g.dying:
                        self._expire_dying(g)
            if self.pending and rng.random() < 0.6:
                self.pending.popleft()()
                continue
            if rng.random() < P_GARBAGE:
                self._garbage()
                continue
            g = self._pick_group()
            if self.now < g.paused_until:  # a paused group is quiet; the others go on
                g = self.groups[1 + int(rng.random() * (len(self.groups) - 1))]
            r = rng.random()
            n_free = len(g.free)
            p_claim = min(0.5, 0.01 + 0.003 * n_free) if n_free else 0.0
            if r < p_claim:
                self._claim_race(g)
                self.pending.popleft()()  # the first racer writes now
            elif r < p_claim + P_RELEASE and g.owned:
                self._release(g, g.owned.choice(rng))
            elif g.owned:
                self._heartbeat(g, g.owned.choice(rng))
            else:
                self._garbage()  # nothing owned yet and nothing free: cannot happen in practice
        del log.values[n:], log.times[n:], log.sources[n:]  # a release_group may overshoot by a few copies
        return log


def build_log(
    n: int,
    seed: int = 1,
    *,
    release_group_every: int = 200_000,
    restart_every: int = 50_000,
    crash_every: int = 150_000,
    pause_ms: int = PAUSE_MS,
) -> Log:
    """A realistic coordination log of ``n`` records (deterministic for a seed).

    The ``*_every`` intervals count records; ``pause_ms`` is how long each release_group pauses the
    busy group (short logs, as in the smoke test, need shorter intervals to hold every kind of event).
    """
    return _Builder(n, seed, release_group_every, restart_every, crash_every, pause_ms).build()


# ---------------------------------------------------------------- the measured loops


def parse_only(values: list[bytes]) -> int:
    """The ceiling: orjson.loads of every value; returns how many failed to parse."""
    loads = orjson.loads
    error = orjson.JSONDecodeError
    failed = 0
    for value in values:
        try:
            loads(value)
        except error:
            failed += 1
    return failed


def decode_only(values: list[bytes]) -> int:
    """For attribution only: codec.decode of every value, no fold; returns the garbage count."""
    decode = codec.decode
    garbage = 0
    for value in values:
        try:
            decode(value)
        except DecodeError:
            garbage += 1
    return garbage


def decode_and_fold(log: Log, group: str = BUSY_GROUP) -> WorldState:
    """What a reader does: decode every value and fold it into a fresh world state of ``group``."""
    state = WorldState(group, HB_MS, COORDINATION_PARTITIONS)
    stats = state.stats
    apply = state.apply
    decode = codec.decode
    for value, at, source in zip(log.values, log.times, log.sources):
        try:
            record = decode(value)
        except DecodeError:
            stats.garbage += 1
            continue
        apply(record, at, source)
    return state


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds one call of ``fn`` takes (after a full collection), and its result."""
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# ---------------------------------------------------------------- report


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model", "Processor"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def pin_to_one_core(cpu: int | None) -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    available = sorted(os.sched_getaffinity(0))
    target = available[-1] if cpu is None else cpu
    try:
        os.sched_setaffinity(0, {target})
    except OSError as exc:
        return f"not pinned ({exc})"
    return f"pinned to CPU {target} of {len(available)} available"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="log length (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the log (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each loop; the best counts (default 3)")
    parser.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last available one)")
    args = parser.parse_args(argv)

    pinned = pin_to_one_core(args.cpu)
    print("marshal-workers: coordination log decode + fold benchmark")
    print(f"  python   {platform.python_implementation()} {platform.python_version()} ({platform.python_compiler()})")
    print(f"  cpu      {cpu_model()}; {pinned}")
    print(f"  libs     orjson {orjson.__version__}, msgspec {codec.msgspec.__version__}")

    start = time.perf_counter()
    log = build_log(args.records, args.seed)
    built_s = time.perf_counter() - start
    n = len(log)
    size_mb = sum(map(len, log.values)) / 1e6
    span_s = (log.times[-1] - log.times[0]) / 1000
    print(
        f"\nlog: {n:,} records, {size_mb:.1f} MB of values, {span_s:,.0f} s of log time, seed {args.seed}, "
        f"HB {HB_MS} ms, {COORDINATION_PARTITIONS} coordination partitions (built in {built_s:.1f} s, not timed)"
    )
    kinds = ", ".join(f"{kind} {count:,} ({count / n:.2%})" for kind, count in log.kinds.most_common())
    print(f"  types    {kinds}")
    groups = ", ".join(f"{group} {count / n:.1%}" for group, count in log.groups.most_common())
    print(f"  groups   {groups}")
    events = ", ".join(f"{name} {count:,}" for name, count in sorted(log.events.items()))
    print(f"  events   {events}")

    parse_times: list[float] = []
    decode_times: list[float] = []
    fold_times: list[float] = []
    state: WorldState | None = None
    parse_failed = 0
    for _ in range(max(1, args.runs)):  # interleaved, so a slow phase of the machine hits both alike
        t, parse_failed = timed(lambda: parse_only(log.values))
        parse_times.append(t)
        t, _ = timed(lambda: decode_only(log.values))
        decode_times.append(t)
        t, state = timed(lambda: decode_and_fold(log))
        fold_times.append(t)
    assert state is not None
    parse_rate = n / min(parse_times)
    fold_rate = n / min(fold_times)
    ratio = fold_rate / parse_rate

    def runs(times: list[float]) -> str:
        return " ".join(f"{t:.3f}" for t in times)

    print(f"\n{'measurement (one core)':<34}{'best s':>8}{'records/s':>13}   runs (s)")
    print(f"{'a. ceiling: orjson.loads':<34}{min(parse_times):>8.3f}{parse_rate:>13,.0f}   {runs(parse_times)}")
    print(f"{'b. codec.decode + WorldState.apply':<34}{min(fold_times):>8.3f}{fold_rate:>13,.0f}   {runs(fold_times)}")
    print(f"{'ratio b/a':<34}{'':>8}{ratio:>13.2f}")
    decode_s = min(decode_times)
    fold_only_s = max(0.0, min(fold_times) - decode_s)
    print(f"{'(info) codec.decode alone':<34}{decode_s:>8.3f}{n / decode_s:>13,.0f}   {runs(decode_times)}")
    print(f"{'(info) so WorldState.apply ~':<34}{fold_only_s:>8.3f}{n / max(fold_only_s, 1e-9):>13,.0f}   (b - decode)")

    s = state.stats
    owned = sum(1 for p in state.partitions.values() if p.owner is not None)
    accepted_share = s.accepted / max(s.applied, 1)
    print(
        f"\nfold of {BUSY_GROUP}: applied {s.applied:,}, accepted {s.accepted:,} ({accepted_share:.1%}), "
        f"other groups {s.other_groups:,}, misrouted {s.misrouted:,}, garbage {s.garbage:,}"
    )
    print(f"  final state: {len(state.partitions)} partitions ({owned} owned), paused until {state.paused_until()}")
    print(f"  garbage: {log.garbage:,} generated, {s.garbage:,} rejected by decode, {parse_failed:,} not even JSON")

    ok_rate = fold_rate >= TARGET_RECORDS_PER_S
    ok_ratio = ratio >= TARGET_RATIO
    verdict_rate = "PASS" if ok_rate else "FAIL"
    print(f"\ntarget decode+fold >= {TARGET_RECORDS_PER_S:,} records/s: {verdict_rate} ({fold_rate:,.0f})")
    print(f"target ratio b/a >= {TARGET_RATIO}: {'PASS' if ok_ratio else 'FAIL'} ({ratio:.2f})")
    print(f"RESULT: {'PASS' if ok_rate and ok_ratio else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
