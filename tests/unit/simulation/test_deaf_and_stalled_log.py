"""The two faults of the coordination path itself: a member that can write but not read (deaf), and a
coordination partition that stalls for everyone (stall-log)."""

from __future__ import annotations

from sim_fleets import small

from marshal_workers.protocol.codec import coordination_partition
from marshal_workers.simulation.sim_log import EPOCH_MS
from marshal_workers.simulation.simulator import Simulation, simulate


def test_a_deaf_members_heartbeats_keep_its_partitions_but_its_workers_stop_at_the_lease() -> None:
    """Its heartbeats land (nobody takes its partitions), but it learns no verdict: its leases are not renewed, so
    its workers handle nothing from 1.5 HB after its last confirmed heartbeat until it hears again."""
    config = small("deaf@10s:member=0,for=10s", duration_s=60.0, seed=3)
    sim = Simulation(config)
    handled: dict[float, int] = {}

    def probe() -> None:
        member = sim.hosts[0].member
        assert member is not None
        handled[sim.clock.now] = sum(member.progress(a, sim.clock.now) for a in member.assignments.values())

    for at in (9.0, 14.0, 19.5, 30.0):
        sim.clock.at(at, probe)
    report = sim.run()
    assert report["violations"] == []
    assert report["phases"][1]["handovers"] == 0, "a deaf member's heartbeats land: its partitions stay its own"
    assert handled[14.0] > handled[9.0] > 0
    assert handled[19.5] == handled[14.0], "deaf past its lease: its workers handled nothing"
    assert handled[30.0] > handled[19.5], "hearing again, it renews its leases and carries on"


def test_a_stalled_coordination_partition_holds_every_record_and_the_fleet_recovers() -> None:
    """With one coordination partition, a stall of 5 s (past 2*HB) silences every member: once it ends, the
    records that waited land together, partitions whose owners look stale may change hands, and every
    partition is owned again within the bound."""
    report = simulate(small("stall-log@10s:for=5s", duration_s=60.0, seed=1))
    assert report["violations"] == []
    after = report["phases"][1]
    assert after["time_to_own_s"] is not None and after["time_to_own_s"] <= 10 * 2.0
    assert after["time_to_own_s"] >= 3.0, "nothing landed during the stall: heartbeats went stale"


def test_a_stall_of_one_coordination_partition_leaves_the_other_alone() -> None:
    """Two coordination partitions, topics t0 and t1 routed one to each: during a stall of one, only the
    partitions of the topic routed there go unheard; the fleet recovers with every invariant held."""
    for stalled in (0, 1):
        config = small(
            f"stall-log@10s:partition={stalled},for=5s", topics=2, coordination_partitions=2, duration_s=60.0, seed=2
        )
        sim = Simulation(config)
        unheard: dict[str, set[bool]] = {}

        def probe(sim: Simulation = sim, unheard: dict[str, set[bool]] = unheard) -> None:
            now_ms = EPOCH_MS + sim.clock.now_ms
            for (topic, _), state in sim.oracle.partitions.items():
                unheard.setdefault(topic, set()).add(now_ms - state.last_ts > 2000)

        sim.clock.at(14.0, probe)
        report = sim.run()
        assert report["violations"] == [], stalled
        assert {coordination_partition(t, 2) for t in ("t0", "t1")} == {0, 1}
        for topic in ("t0", "t1"):
            partition = coordination_partition(topic, 2)
            assert unheard[topic] == {partition == stalled}, (stalled, topic, unheard)
