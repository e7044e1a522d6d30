"""The pipe messages (marshal_workers.runtime.messages): each crosses a real pipe as what it was sent as."""

from __future__ import annotations

import multiprocessing

import pytest

from marshal_workers.member.at_most_once import ClaimAnswer
from marshal_workers.runtime.messages import (
    Abandoned,
    ClaimBatch,
    ClaimVerdict,
    Outcomes,
    RangeLeased,
    Renewed,
    Returned,
    Settled,
    Started,
    Stop,
)

MESSAGES = [
    ClaimBatch(500),
    *(ClaimVerdict(answer) for answer in ClaimAnswer),
    Outcomes({"errors": {"ValueError": 2}, "retries": 1, "ignored": 0, "rejected": 0, "too_old": 0, "other_group": 3}),
    RangeLeased(3, 100, 200, 123_456, 2),
    Renewed(3, 100, 133_456),
    Stop(),
    Started(3, 100),
    Settled(3, 100, 180, (101, 150), (120,), 77, 999),
    Settled(3, 100, 200, (), (), 100, None),
    Abandoned(3, 100, 200),
    Returned(3, 200, 300),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_crosses_the_pipe_whole(message: object) -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    try:
        ours.send(message)
        received = theirs.recv()
        assert type(received) is type(message) and received == message
    finally:
        ours.close()
        theirs.close()


def test_a_verdict_carries_the_answer_the_worker_acts_on() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    with ours, theirs:
        ours.send(ClaimVerdict(ClaimAnswer.UNCONFIRMED))
        assert theirs.recv().answer is ClaimAnswer.UNCONFIRMED
