"""A deterministic simulator of a fleet over the package's own claiming policy and fold (docs/simulation.md).

Members run the real ``ClaimingPolicy`` (protocol/claiming.py) and fold the real codec's bytes with the real
``WorldState`` (protocol/world_state.py), on a simulated coordination log and a virtual clock: no Kafka, no
processes, no threads, no wall clock.  One seed gives one trace, byte for byte.
"""
