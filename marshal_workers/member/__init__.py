"""The member core: a member's decisions about the coordination log and their order, written once.

A supervisor (runtime/supervisor/) and a simulated member (simulation/) drive the same objects: they feed them
the folded world, the verdicts of their writes, their workers' reports and ``now``, and carry out what comes back
(records to write, workers to tell).  Nothing here reads a clock, opens a socket or starts a process
(docs/architecture.md, "The member core").
"""
