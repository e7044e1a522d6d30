"""When a member writes checkpoints (protocol/checkpoint_schedule.py): one look per HB, only while running and
with checkpoints on, never a second write of a partition whose checkpoint is in flight."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.protocol.checkpoint_schedule import CheckpointSchedule


def everything_due(_partition: int) -> bool:
    return True


def test_it_looks_once_per_heartbeat_and_writes_what_is_due() -> None:
    schedule = CheckpointSchedule(look_every_s=2.0, interval_ms=60_000)
    assert schedule.to_write(10.0, True, 3, lambda p: p != 1) == [0, 2]
    for partition in (0, 2):
        schedule.settled(partition)
    assert schedule.to_write(11.9, True, 3, everything_due) == [], "the next look is one HB after the last"
    assert schedule.to_write(12.0, True, 3, everything_due) == [0, 1, 2]


def test_a_partition_whose_checkpoint_is_in_flight_is_not_written_again_until_settled() -> None:
    schedule = CheckpointSchedule(look_every_s=2.0, interval_ms=60_000)
    assert schedule.to_write(0.0, True, 2, everything_due) == [0, 1]
    schedule.settled(1)  # confirmed (or failed); 0 still in flight
    assert schedule.to_write(2.0, True, 2, everything_due) == [1]
    schedule.settled(0)
    assert schedule.to_write(4.0, True, 2, everything_due) == [0]


def test_nothing_is_written_while_stopping_or_with_checkpoints_off() -> None:
    asked: list[int] = []

    def due(partition: int) -> bool:
        asked.append(partition)
        return True

    assert CheckpointSchedule(2.0, 0).to_write(0.0, True, 2, due) == []
    assert CheckpointSchedule(2.0, 60_000).to_write(0.0, False, 2, due) == []
    assert asked == [], "the fold is not even asked"


@given(st.lists(st.tuples(st.floats(0, 100), st.booleans(), st.sets(st.integers(0, 3))), max_size=30))
def test_no_partition_is_ever_written_twice_at_once_nor_looked_at_twice_within_a_heartbeat(
    steps: list[tuple[float, bool, set[int]]],
) -> None:
    schedule = CheckpointSchedule(look_every_s=2.0, interval_ms=1000)
    in_flight: set[int] = set()
    last_look: float | None = None
    now = 0.0
    for advance, running, settle in steps:
        now += advance
        looked: list[float] = []

        def due(_partition: int, at: float = now, seen: list[float] = looked) -> bool:
            seen.append(at)
            return True

        chosen = schedule.to_write(now, running, 4, due)
        if looked:
            assert last_look is None or now - last_look >= 2.0
            last_look = now
        assert not in_flight & set(chosen), "a partition written again while its checkpoint is in flight"
        in_flight |= set(chosen)
        for partition in sorted(settle):
            schedule.settled(partition)
            in_flight.discard(partition)
