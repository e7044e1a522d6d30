"""An operator in a simulation: the orders ``marshal-workers admin`` writes, the members obeying them, and the
invariant that they do.

``--fault order@T:ACTION[,ARGS]`` writes, at ``T``, the record ``admin`` writes for that order (codec.Control to
every coordination partition for ``drain``/``resume``/``shutdown``, codec.PauseTopic for ``pause``/``resume
--topic``, codec.ReleasePartition for ``release``), with the real codec, into the simulated log.  Every member
folds it like any record, and obeys it with the member core a real supervisor's component for orders
(runtime/supervisor/remote_control.py) drives (member/obeying.py: ``Obeying``; simulation/member.py drives it
too): every HB/2 before its heartbeat it reads its orders from its fold (protocol/orders.py: ``orders_for``) and
obeys them: a shutdown is a graceful stop, a drain stops claiming and balancing, the shared topics held back lease
no more ranges, and every partition an order gives up is handed over as balance does.

**Orders obeyed**: from the moment a member whose partition an order gives up has folded the order, the
partition is no longer its own and fresh in the oracle's fold within ``order_bound_hb`` HB (default 2: HB/2 to
look, a worker's stop and the release's write; a release lost on the way leaves the partition stale HB after
its last heartbeat).  The safety invariants (one live owner, nothing skipped) are checked as for any run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from marshal_workers.protocol import codec
from marshal_workers.protocol.claiming import Key
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.world_state import WorldState
from marshal_workers.simulation.clock import VirtualClock
from marshal_workers.simulation.faults import Fault
from marshal_workers.simulation.invariants import Violations
from marshal_workers.simulation.member import SimMember
from marshal_workers.simulation.sim_config import SimConfig
from marshal_workers.simulation.sim_log import EPOCH_MS, Entry, SimulatedLog, SimWrite

ORDER_RECORDS = (codec.Control, codec.PauseTopic, codec.ReleasePartition)


class Fleet(Protocol):
    """What the operator needs of the simulation around it."""

    clock: VirtualClock
    log: SimulatedLog
    config: SimConfig
    violations: Violations
    keys: list[Key]

    @property
    def oracle(self) -> WorldState: ...

    def members(self) -> list[SimMember]: ...


@dataclass
class Watch:
    """A partition an order gives up, and the member it was asked of."""

    key: Key
    owner: MemberId
    read_at: float | None = None  # when that member had folded the order


@dataclass
class Order:
    """One order written: when it landed, what it gives up, how long obeying took."""

    fault: Fault
    landed_at: float | None = None
    entry: Entry | None = None
    watches: list[Watch] = field(default_factory=list)
    asked: int = 0  # partitions it gives up
    obeyed_after: float = 0.0  # the longest from landing until a watched partition was given up
    broken: bool = False


class Operator:
    """Writes the orders of a run's ``order`` faults, makes members obey them, and checks they do."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        config = fleet.config
        self.rng = random.Random(f"{config.seed}/operator")
        self.me = MemberId("operator", f"{self.rng.getrandbits(64):016x}")
        self.writer_id = id(self)  # only a key for write order in the log
        self.orders: list[Order] = []
        self._landing: dict[int, Order] = {}  # id() of a SimWrite -> its order (membership only, never iterated)
        self._watching = False
        self.bound_s = config.order_bound_hb * config.heartbeat_s

    # ------------------------------------------------------------- writing

    def end(self, fault: Fault) -> float:
        """When an order's effect ends, for the bounds after the last fault: a topic pause lasts ``for``."""
        if fault.action == "pause":
            return fault.at + self._pause_s(fault)
        return fault.at

    def _pause_s(self, fault: Fault) -> float:
        return fault.duration(5 * self.fleet.config.heartbeat_s) or 5 * self.fleet.config.heartbeat_s

    def inject(self, fault: Fault) -> None:
        """Write the order's record(s) now, as ``marshal-workers admin`` does."""
        fleet = self.fleet
        now = fleet.clock.now
        common: dict[str, Any] = {
            "v": codec.VERSION,
            "ts": EPOCH_MS + fleet.clock.now_ms,
            "group": "sim",
            "client": self.me.client,
            "instance": self.me.instance,
        }
        action = fault.action
        records: list[codec.Record]
        partitions: list[int] | None = None
        if action in ("drain", "shutdown") or (action == "resume" and "topic" not in fault.args):
            client = self._client(fault)
            if client is None:
                return
            count = len(fleet.log.partitions)
            records = [codec.Control(**common, target=client, action=action)] * count  # type: ignore[arg-type]  # one of its actions: checked above
            partitions = list(range(count))  # a record about no topic goes to every coordination partition
        elif action in ("pause", "resume"):
            topic = fault.args.get("topic", fleet.keys[0][0])
            expires = 0 if action == "resume" else EPOCH_MS + round((now + self._pause_s(fault)) * 1000)
            records = [codec.PauseTopic(**common, topic=topic, expires=expires)]
        else:
            key = self._release_key(fault)
            if key is None:
                return
            records = [codec.ReleasePartition(**common, topic=key[0], partition=key[1])]
        order = Order(fault)
        self.orders.append(order)
        write = SimWrite(self, records, deadline=now + fleet.config.write_timeout_s)
        self._landing[id(write)] = order
        fleet.log.submit(self.writer_id, write, lost=False, partitions=partitions)

    def _client(self, fault: Fault) -> str | None:
        """The client an order names (``member=N``), or one drawn from the running members."""
        members = [m for m in self.fleet.members() if m.running()]
        if fault.member is not None:
            return f"host-{fault.member:04d}"
        return self.rng.choice(members).me.client if members else None

    def _release_key(self, fault: Fault) -> Key | None:
        """The partition a release names, or one drawn from those ``member`` (or anyone) owns."""
        fleet = self.fleet
        if "partition" in fault.args:
            return (fault.args.get("topic", fleet.keys[0][0]), int(fault.args["partition"]))
        owned = [
            key
            for key in fleet.keys
            if (owner := fleet.oracle.owner(*key)) is not None
            and (fault.member is None or owner.client == f"host-{fault.member:04d}")
        ]
        return self.rng.choice(owned) if owned else None

    # ------------------------------------------------------------- landing

    def appended(self, entry: Entry) -> None:
        """An order's record landed (the oracle has folded it): watch what it gives up (its first copy only)."""
        origin = entry.origin
        order = None if origin is None else self._landing.pop(id(origin), None)
        if order is None:
            return
        fleet = self.fleet
        order.landed_at, order.entry = fleet.clock.now, entry
        record = entry.record
        oracle = fleet.oracle
        if isinstance(record, codec.Control) and record.action in ("drain", "shutdown"):
            order.watches = [
                Watch(key, owner)
                for key in fleet.keys
                if (owner := oracle.owner(*key)) is not None and owner.client == record.target
            ]
        elif isinstance(record, codec.PauseTopic) and record.expires > entry.at:
            order.watches = [
                Watch(key, owner)
                for key in fleet.keys
                if key[0] == record.topic and (owner := oracle.owner(*key)) is not None
            ]
        elif isinstance(record, codec.ReleasePartition):
            state = oracle.get(record.topic, record.partition)
            if state is not None and state.release_requested and state.owner is not None:
                order.watches = [Watch((record.topic, record.partition), state.owner)]
        order.asked = len(order.watches)
        if order.watches and not self._watching:
            self._watching = True
            fleet.clock.after(0.0, self._watch)

    def _watch(self) -> None:
        """Every HB/10 while an order is not yet obeyed: has it been, within its bound?"""
        fleet = self.fleet
        now, now_ms, hb_ms = fleet.clock.now, EPOCH_MS + fleet.clock.now_ms, fleet.config.heartbeat_ms
        members = {m.me: m for m in fleet.members() if m.alive}
        open_watches = 0
        for order in self.orders:
            entry = order.entry
            if entry is None or not order.watches:
                continue
            left = []
            for watch in order.watches:
                state = fleet.oracle.get(*watch.key)
                given_up = state is None or state.owner != watch.owner or now_ms - state.last_ts >= hb_ms
                member = members.get(watch.owner)
                if given_up or member is None:  # given up, or its member is gone (its lease lapses)
                    order.obeyed_after = max(order.obeyed_after, now - (order.landed_at or now))
                    continue
                if watch.read_at is None and member.read_at[entry.partition] > entry.offset:
                    watch.read_at = now
                if watch.read_at is not None and now - watch.read_at > self.bound_s:
                    order.broken = True
                    fleet.violations.add(
                        "orders obeyed",
                        now,
                        f"{watch.key[0]}[{watch.key[1]}] still held by {watch.owner.client}/"
                        f"{watch.owner.instance} {now - watch.read_at:.1f}s after it read "
                        f"{order.fault} (bound {self.bound_s:g}s)",
                    )
                    continue
                left.append(watch)
            order.watches = left
            open_watches += len(left)
        if open_watches:
            fleet.clock.after(fleet.config.heartbeat_s / 10, self._watch)
        else:
            self._watching = False

    # ------------------------------------------------------------- figures

    def report(self) -> list[dict[str, Any]]:
        """Per order: when it landed, and how long until every partition it gives up was given up."""
        return [
            {
                "order": str(order.fault),
                "landed_s": None if order.landed_at is None else round(order.landed_at, 3),
                "partitions": order.asked,
                "obeyed_after_s": None if order.broken or order.watches else round(order.obeyed_after, 3),
            }
            for order in self.orders
        ]
