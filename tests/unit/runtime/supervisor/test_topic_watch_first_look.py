"""A supervisor's first look at its topics takes the cluster's metadata its coordinator has just asked for, and asks
again only where a handler's topic is not in it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from marshal_workers.core.config import Settings
from marshal_workers.errors import UnknownTopicError
from marshal_workers.handlers.app import App
from marshal_workers.runtime.supervisor.assignments import Table
from marshal_workers.runtime.supervisor.topic_watch import TopicWatch


def metadata(**topics: int) -> SimpleNamespace:
    return SimpleNamespace(
        topics={name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(n))) for name, n in topics.items()}
    )


class Admin:
    """Answers ``list_topics`` with ``answer``, counting the requests."""

    def __init__(self, answer: SimpleNamespace) -> None:
        self.answer, self.asked = answer, 0

    def list_topics(self, timeout: float) -> SimpleNamespace:
        self.asked += 1
        return self.answer


def watch(admin: Admin) -> TopicWatch:
    app = App(group="g")
    app.handler("orders", on_error="release")(lambda msg: None)
    return TopicWatch(
        Table(),
        app,
        Settings(group="g", coordination_topic="__marshal"),
        admin=admin,  # type: ignore[arg-type]
        coordination_partitions=8,
        log=logging.getLogger("test"),
        fail=lambda code: None,
    )


def test_the_metadata_the_coordinator_asked_for_saves_a_request() -> None:
    admin = Admin(metadata(orders=6))
    topics = watch(admin)
    topics.first_look(metadata(__marshal=8, orders=3))
    assert admin.asked == 0
    assert topics.table.partition_counts == {"orders": 3}


def test_a_handler_topic_missing_from_it_is_asked_for_again() -> None:
    admin = Admin(metadata(__marshal=8, orders=6))  # made since the coordinator asked
    topics = watch(admin)
    topics.first_look(metadata(__marshal=8))
    assert admin.asked == 1
    assert topics.table.partition_counts == {"orders": 6}


def test_a_topic_missing_from_both_answers_is_an_error_that_says_what_to_do() -> None:
    topics = watch(Admin(metadata(__marshal=8)))
    with pytest.raises(UnknownTopicError, match="marshal-workers topics create"):
        topics.first_look(metadata(__marshal=8))
