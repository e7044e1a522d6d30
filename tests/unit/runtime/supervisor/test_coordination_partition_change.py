"""A supervisor stops when the coordination topic's partition count changes under it.

(Routing is md5(topic) mod that count, so members started before and after the change would write
about one topic to different logs.  Tansu cannot add partitions to a topic, so this is checked on
the supervisor's topic watch with the metadata it would read, not end to end.)
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.handlers.app import App
from marshal_workers.runtime.supervisor.assignments import Table
from marshal_workers.runtime.supervisor.topic_watch import TopicWatch


class Watch:
    """A supervisor's topic watch, started when the coordination topic had ``partitions``; its stops recorded."""

    def __init__(self, partitions: int) -> None:
        app = App(group="g")
        app.handler("orders")(lambda msg: None)
        self.table = Table()
        self.stopped_with: list[int] = []
        settings = Settings(group="g", coordination_topic="__marshal")
        self.watch = TopicWatch(
            self.table,
            app,
            settings,
            admin=None,
            coordination_partitions=partitions,  # type: ignore[arg-type]
            log=logging.getLogger("test"),
            fail=self.stopped_with.append,
        )

    def sees(self, metadata: SimpleNamespace) -> None:
        self.watch.apply(metadata)


def metadata(partitions: int) -> SimpleNamespace:
    coordination = SimpleNamespace(error=None, partitions=dict.fromkeys(range(partitions)))
    orders = SimpleNamespace(error=None, partitions=dict.fromkeys(range(3)))
    return SimpleNamespace(topics={"__marshal": coordination, "orders": orders})


def test_the_same_count_changes_nothing() -> None:
    watch = Watch(8)
    watch.sees(metadata(8))
    assert watch.stopped_with == []
    assert watch.table.partition_counts == {"orders": 3}


def test_a_new_count_stops_the_supervisor_with_the_coordination_exit_code() -> None:
    watch = Watch(8)
    watch.sees(metadata(12))
    assert watch.stopped_with == [ExitCode.COORDINATION_ERROR]


def test_a_coordination_topic_missing_from_the_metadata_is_not_a_change() -> None:
    watch = Watch(8)
    watch.sees(SimpleNamespace(topics={}))
    assert watch.stopped_with == []


def test_a_stopping_supervisor_is_not_stopped_again() -> None:
    watch = Watch(8)
    watch.table.phase = watch.table.phase.STOPPING
    watch.sees(metadata(12))
    assert watch.stopped_with == []
