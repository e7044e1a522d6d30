"""Group commit of batch claims: what is asked while a write is in flight waits for it, then goes in one write."""

from __future__ import annotations

from marshal_workers.protocol.claim_batching import ClaimBatching


def test_claims_asked_while_a_write_is_in_flight_go_together_in_the_next() -> None:
    claims: ClaimBatching[int] = ClaimBatching()
    claims.ask(1)
    assert claims.take() == [1]
    claims.writing()
    claims.ask(2)
    claims.ask(3)
    assert claims.take() == [], "in flight: they wait"
    claims.decided()
    assert claims.take() == [2, 3]
    assert claims.take() == []
