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

    @property
    def heartbeat_ms(self) -> int:
        return round(self.heartbeat_s * 1000)

    def partition_counts(self) -> dict[str, int]:
        """Topics ``t0``, ``t1``... with the partitions spread over them as evenly as they go."""
        base, rest = divmod(self.partitions, self.topics)
        return {f"t{i}": base + (1 if i < rest else 0) for i in range(self.topics) if base + (1 if i < rest else 0)}
