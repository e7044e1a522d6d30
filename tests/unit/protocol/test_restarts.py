"""When a crashed worker is restarted, and when its partition is given up as sick."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from marshal_workers.protocol.restarts import RestartPolicy


def test_default_policy() -> None:
    policy = RestartPolicy()
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, None]


def test_first_crash_waits_first_delay_then_doubles() -> None:
    policy = RestartPolicy(limit=10, first_delay_s=0.25, max_delay_s=1000.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.25, 0.5, 1.0, 2.0, 4.0]


def test_delay_is_capped_at_max_delay() -> None:
    policy = RestartPolicy(limit=10, first_delay_s=1.0, max_delay_s=5.0)
    assert [policy.delay(n) for n in range(1, 10)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]


def test_partition_is_given_up_at_the_limit() -> None:
    policy = RestartPolicy(limit=3, first_delay_s=1.0, max_delay_s=30.0)
    assert policy.delay(2) == 2.0
    assert policy.delay(3) is None
    assert policy.delay(4) is None
    assert policy.delay(100) is None


def test_limit_one_gives_up_at_the_first_crash() -> None:
    assert RestartPolicy(limit=1).delay(1) is None


@pytest.mark.parametrize("crashes", [0, -1, -100])
def test_crash_count_below_one_is_refused(crashes: int) -> None:
    with pytest.raises(ValueError, match="crashes_in_a_row"):
        RestartPolicy().delay(crashes)


def test_very_high_limit_keeps_waiting_the_max_delay() -> None:
    # crash_limit has no upper bound; a large one means "keep restarting": after enough
    # crashes in a row the delay must stay at the cap instead of failing.
    policy = RestartPolicy(limit=1_000_000, first_delay_s=0.5, max_delay_s=30.0)
    assert policy.delay(2000) == 30.0


positive_seconds = st.floats(min_value=0.001, max_value=3600.0, allow_nan=False, allow_infinity=False)


@st.composite
def policies(draw: st.DrawFn) -> RestartPolicy:
    first = draw(positive_seconds)
    cap = draw(st.floats(min_value=first, max_value=7200.0, allow_nan=False, allow_infinity=False))
    return RestartPolicy(limit=draw(st.integers(1, 100_000)), first_delay_s=first, max_delay_s=cap)


@given(policy=policies(), crashes=st.integers(1, 5000))
@example(policy=RestartPolicy(limit=100_000), crashes=1100)
def test_delay_properties(policy: RestartPolicy, crashes: int) -> None:
    delay = policy.delay(crashes)
    assert (delay is None) == (crashes >= policy.limit)
    if delay is None:
        return
    assert policy.first_delay_s <= delay <= policy.max_delay_s
    if crashes > 1:
        previous = policy.delay(crashes - 1)
        assert previous is not None and previous <= delay
    if crashes == 1:
        assert delay == policy.first_delay_s
