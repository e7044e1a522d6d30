"""free_port (embedded_broker.py): a port for a server about to start, out of reach of outgoing connections."""

from __future__ import annotations

import socket

import pytest

from marshal_workers.kafka import embedded_broker
from marshal_workers.kafka.embedded_broker import PICK_PORTS_FROM, _ephemeral_ports_low, free_port


def test_the_port_is_free_and_below_the_ports_outgoing_connections_take() -> None:
    ports = {free_port() for _ in range(20)}
    assert all(PICK_PORTS_FROM <= port < _ephemeral_ports_low() for port in ports)
    assert len(ports) > 1, "picked at random: parallel test runs rarely pick the same"
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.pop()))  # nothing holds it


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        held = taken.getsockname()[1]
        other = free_port()
        picks = iter([held, held, other])
        monkeypatch.setattr(embedded_broker.random, "randrange", lambda *_: next(picks))
        assert free_port() == other
