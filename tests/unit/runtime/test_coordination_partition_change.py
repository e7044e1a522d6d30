"""A supervisor stops when the coordination topic's partition count changes under it.

(Routing is md5(topic) mod that count, so members started before and after the change would write
about one topic to different logs.  Tansu cannot add partitions to a topic, so this is checked on
the supervisor with the metadata it would read, not end to end.)
"""

from __future__ import annotations

from types import SimpleNamespace

from marshal_workers.core.config import Settings
from marshal_workers.core.exit_codes import ExitCode
from marshal_workers.handlers.app import App
from marshal_workers.runtime.supervisor.supervisor import Phase, Supervisor


def supervisor_started_with(partitions: int) -> Supervisor:
    app = App(group="g")
    app.handler("orders")(lambda msg: None)
    supervisor = Supervisor(app, "tests:app", Settings(group="g", coordination_topic="__marshal"))
    supervisor._coordinator = SimpleNamespace(partition_count=partitions)  # type: ignore[assignment]
    return supervisor


def metadata(partitions: int) -> SimpleNamespace:
    topic = SimpleNamespace(error=None, partitions=dict.fromkeys(range(partitions)))
    return SimpleNamespace(topics={"__marshal": topic})


def test_the_same_count_changes_nothing() -> None:
    supervisor = supervisor_started_with(8)
    supervisor._check_coordination_partitions(metadata(8))
    assert supervisor.phase is Phase.RUNNING and supervisor.exit_code == 0


def test_a_new_count_stops_the_supervisor_with_the_coordination_exit_code() -> None:
    supervisor = supervisor_started_with(8)
    supervisor._check_coordination_partitions(metadata(12))
    assert supervisor.phase is not Phase.RUNNING
    assert supervisor.exit_code == ExitCode.COORDINATION_ERROR


def test_a_coordination_topic_missing_from_the_metadata_is_not_a_change() -> None:
    supervisor = supervisor_started_with(8)
    supervisor._check_coordination_partitions(SimpleNamespace(topics={}))
    assert supervisor.phase is Phase.RUNNING
