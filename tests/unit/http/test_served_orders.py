"""A served topic obeys operators' orders as a supervisor does (member/obeying.py, through served_orders.py): drained,
or its topic paused, it claims nothing until resumed; a shutdown stops it as SIGTERM does, once."""

from __future__ import annotations

from marshal_workers.core.config import Settings
from marshal_workers.http.served_orders import ServedOrders
from marshal_workers.http.served_topic import ServedTopic, ServeOptions
from marshal_workers.member.obeying import obey
from marshal_workers.protocol.orders import Orders


def served() -> ServedTopic:
    return ServedTopic(Settings(group="g", brokers="127.0.0.1:1"), ServeOptions(topic="t"))


def test_drained_or_its_topic_paused_it_holds_back_until_resumed() -> None:
    topic = served()
    for orders, held_back in [
        (Orders(drained=True), True),
        (Orders(), False),
        (Orders(paused_topics=frozenset({"t"})), True),
        (Orders(paused_topics=frozenset({"other"})), False),
    ]:
        obey(orders, (topic.topic,), (), ServedOrders(topic))
        assert topic.held_back is held_back and not topic.stopping, orders


def test_a_shutdown_stops_it_as_sigterm_does_once_however_often_it_is_read() -> None:
    topic = served()
    told: list[str] = []
    topic.on_shutdown_order = lambda: told.append("shutdown")
    for _ in range(3):  # the order stays in the log: the serve loop reads it again and again
        obey(Orders(shutdown=True), (topic.topic,), (), ServedOrders(topic))
    assert topic.stopping and told == ["shutdown"]
