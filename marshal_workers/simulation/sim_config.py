"""What one simulation runs: the fleet, its settings, the faults, the bounds its invariants hold it to."""

from __future__ import annotations

from dataclasses import dataclass, field

from marshal_workers.simulation.faults import Fault
from marshal_workers.simulation.sim_log import Latency


@dataclass(frozen=True)
class SimConfig:
    partitions: int = 16  # spread over ``topics`` topics
    members: int = 4
    heartbeat_s: float = 2.0
    duration_s: float = 60.0
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    balance: str = "fair"
    max_partitions: int = 0
    topics: int = 1
    coordination_partitions: int = 1
    produce_rate: float = 5.0  # messages/s into every partition
    handler_rate: float = 50.0  # messages/s a worker handles
    latency: Latency = field(default_factory=Latency)  # of a coordination write
    read_lag_s: tuple[float, float] = (0.001, 0.02)  # each member's read lag is drawn from this range
    tick_s: float = 0.1  # a pass of a member's loop (the supervisor's TICK_S)
    # Calibration (docs/simulation.md): the members' first passes are spread over this many seconds (real
    # supervisors launched together start claiming over 0.05 to 0.56 s: imports, connections, reading the log);
    # and a claim won for a partition with no position in the log costs its member this long (drawn from 0.5x to
    # 1.5x) before the worker starts and the first heartbeat: the supervisor looks the committed and reset
    # offsets up in Kafka, its loop waiting.  The defaults leave both out.
    start_spread_s: float = 0.1
    position_lookup_s: float = 0.0
    start_delay_s: float = 0.02  # from a claim won to its worker handling messages (the fork)
    stop_delay_s: float = 0.05  # from a worker asked to stop to its exit (the message in hand)
    write_timeout_s: float = 10.0
    sick_cooldown_s: float = 60.0
    behind_cycles: int = 5
    own_bound_hb: float = 10.0  # after the last fault, every partition owned and fresh within this many HB
    balance_bound_hb: float = 30.0  # and balanced (largest minus smallest share at most 1) within this many
    checkpoint_interval_s: float = 0.0  # members write checkpoints this often (0: none; a real fleet's default: 60)
    order_bound_hb: float = 2.0  # an order is obeyed within this many HB of its member reading it
    # Shared and at-most-once topics (docs/simulation.md): the first ``shared_topics`` topics are shared (range
    # leases), the last ``amo_topics`` at most once (whole: batch claims; shared: leases with ``amo``).
    shared_topics: int = 0
    amo_topics: int = 0
    shared_workers: int = 2  # per member and shared topic
    pending_timeout_s: float = 6.0  # a shared handler's pending timeout: how long a range lease lasts
    range_size: int = 100  # offsets of a range claim before any measurement (then adaptive: range_sizing.py)
    batch_size: int = 500  # at most once: most messages per batch claim

    @property
    def heartbeat_ms(self) -> int:
        return round(self.heartbeat_s * 1000)

    def partition_counts(self) -> dict[str, int]:
        """Topics ``t0``, ``t1``... with the partitions spread over them as evenly as they go."""
        base, rest = divmod(self.partitions, self.topics)
        return {f"t{i}": base + (1 if i < rest else 0) for i in range(self.topics) if base + (1 if i < rest else 0)}

    def _kinds(self) -> tuple[list[str], list[str]]:
        names = list(self.partition_counts())
        return names[: self.shared_topics], names[len(names) - self.amo_topics :] if self.amo_topics else []

    def shared_counts(self) -> dict[str, int]:
        """The shared topics (range leases) and their partitions."""
        shared, _ = self._kinds()
        return {t: c for t, c in self.partition_counts().items() if t in shared}

    def whole_counts(self) -> dict[str, int]:
        """The topics claimed whole, and their partitions."""
        shared, _ = self._kinds()
        return {t: c for t, c in self.partition_counts().items() if t not in shared}

    def amo_topic_names(self) -> frozenset[str]:
        """The at-most-once topics, whole or shared."""
        return frozenset(self._kinds()[1])

    def amo_whole_topics(self) -> frozenset[str]:
        """The at-most-once topics claimed whole (batch claims)."""
        shared, amo = self._kinds()
        return frozenset(t for t in amo if t not in shared)
