"""Smoke test of the fold benchmark's log builder, so the benchmark cannot silently rot.

tests/benchmarks/bench_fold.py is a script, not a package module: it is loaded from its path.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections import Counter
from pathlib import Path

import pytest

from marshal_workers.errors import DecodeError
from marshal_workers.protocol import codec

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fold.py"
N = 5_000


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fold", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def log(bench):
    # Incidents scaled down so a short log holds them all: one short pause (release_group) at ~3,000
    # records, restarts and crashes every ~1,000.
    return bench.build_log(N, seed=1, release_group_every=3_000, restart_every=1_000, crash_every=1_500, pause_ms=1_000)


def decoded(log) -> tuple[list[tuple[codec.Record, int, int]], int]:
    records, garbage = [], 0
    for value, at, source in zip(log.values, log.times, log.sources):
        try:
            records.append((codec.decode(value), at, source))
        except DecodeError:
            garbage += 1
    return records, garbage


def test_log_is_realistic(bench, log) -> None:
    assert len(log.values) == len(log.times) == len(log.sources) == N
    assert all(type(value) is bytes for value in log.values)
    assert log.times == sorted(log.times)
    records, garbage = decoded(log)

    kinds = Counter(type(record).__name__ for record, _, _ in records)
    # The log of release 0.1.0 (one record per partition heartbeat or claim, no checkpoints): the heaviest to fold.
    newer = {"Heartbeats", "MessageClaims", "Checkpoint", "Control", "PauseTopic", "ReleasePartition"}
    newer |= {cls.__name__ for cls in (*codec.RANGE_RECORD_TYPES, *codec.MESSAGE_RECORD_TYPES)}
    assert set(kinds) == {cls.__name__ for cls in codec.RECORD_TYPES} - newer, kinds
    assert kinds.most_common(1)[0][0] == "Heartbeat"  # mostly heartbeats (a short log is heavy on claim rushes)
    assert 0 < garbage == log.garbage

    groups = Counter(record.group for record, _, _ in records)
    assert len(groups) >= 3
    assert groups[bench.BUSY_GROUP] > 0.7 * N

    # Every record sits on its topic's coordination partition; release_group sits on all of them.
    for record, _, source in records:
        if isinstance(record, codec.ReleaseGroup):
            continue
        assert source == codec.coordination_partition(record.topic, bench.COORDINATION_PARTITIONS)
    pause_sources = {source for record, _, source in records if isinstance(record, codec.ReleaseGroup)}
    assert pause_sources == set(range(bench.COORDINATION_PARTITIONS))

    # Claims race: some partition is claimed by several clients within a few ms.
    claims: dict[tuple[str, str, int], list[tuple[int, str]]] = {}
    for record, at, _ in records:
        if isinstance(record, codec.Claim):
            claims.setdefault((record.group, record.topic, record.partition), []).append((at, record.client))
    assert any(
        b_at - a_at <= 100 and a_client != b_client
        for seen in claims.values()
        for (a_at, a_client), (b_at, b_client) in itertools.pairwise(seen)
    )

    # Restarts: some client shows up with more than one instance.
    instances: dict[tuple[str, str], set[str]] = {}
    for record, _, _ in records:
        instances.setdefault((record.group, record.client), set()).add(record.instance)
    assert any(len(seen) > 1 for seen in instances.values())


def test_fold_of_log(bench, log) -> None:
    state = bench.decode_and_fold(log)
    stats = state.stats
    assert stats.garbage == log.garbage > 0
    assert stats.misrouted == 0
    assert stats.other_groups > 0
    assert 0 < stats.accepted < stats.applied
    assert any(partition.owner is not None for partition in state.partitions.values())
    assert bench.parse_only(log.values) > 0  # some garbage is not even JSON


def test_log_is_deterministic(bench) -> None:
    assert bench.build_log(500, seed=7).values == bench.build_log(500, seed=7).values
