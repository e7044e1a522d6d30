"""The metrics a scrape shows, from a supervisor's snapshot (marshal_workers.observe.metrics)."""

from __future__ import annotations

import collections
import socket
import urllib.error
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from marshal_workers.errors import ConfigError
from marshal_workers.kafka.embedded_broker import free_port
from marshal_workers.observe.latency import LATENCY_BOUNDS
from marshal_workers.observe.metrics import Counters, PartitionStats, Probes, SharedStats, Snapshot
from marshal_workers.observe.metrics_server import MetricsServer


def snapshot() -> Snapshot:
    latency = [0] * (len(LATENCY_BOUNDS) + 1)
    latency[0], latency[4], latency[-1] = 90, 9, 1  # <= 0.5ms, <= 10ms, > 10s
    busy = PartitionStats(
        "orders",
        3,
        1000,
        1500,
        500,
        250.5,
        990,
        2,
        latency,
        12.5,
        in_flight=32,
        window_used=700,
        call_age_s=95.5,
        fetch_stalls=2,
    )
    fresh = PartitionStats("orders", 4, 0, None, None, None, 0, 0, [0] * (len(LATENCY_BOUNDS) + 1), 0.0)
    counters = Counters(claims_accepted=2, claims_refused=5, releases=collections.Counter(sick=1, balance=3))
    counters.heartbeat_failures = 4
    counters.release_failures = 1
    counters.worker_restarts.update(crash=3, poison=1)
    thumbs = SharedStats(
        "thumbs",
        leases_held=8,
        workers=4,
        ranges={"claimed": 40, "refused": 3, "acked": 30, "ack_refused": 1, "cancelled": 2, "abandoned": 1},
        messages={"handled": 2990, "failed": 6, "dead_lettered": 4},
        worker_restarts=1,
        low_water_marks={0: 1500, 1: 1480},
        lost={0: 0, 1: 20},
    )
    return Snapshot(
        "billing",
        [busy, fresh],
        counters,
        garbage_records=7,
        shared=[thumbs],
        coordination_fetch_stalls=3,
        coordination_records=900,
        coordination_batches=120,
        coordination_produce_requests=110,
    )


def scrape(server_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server_port}/metrics", timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def served() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    port = free_port()
    server = MetricsServer("127.0.0.1", port, snapshot)
    try:
        yield scrape(port)
    finally:
        server.close()


def where(partition: int, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"group": "billing", "topic": "orders", "partition": str(partition), **more}.items()))


def test_per_partition_progress_lag_and_rate(served: dict) -> None:
    assert served[("marshal_workers_partition_next_offset", where(3))] == 1000
    assert served[("marshal_workers_partition_lag", where(3))] == 500
    assert served[("marshal_workers_partition_messages_per_second", where(3))] == 250.5
    assert served[("marshal_workers_messages_handled_total", where(3))] == 990
    assert served[("marshal_workers_messages_dead_lettered_total", where(3))] == 2
    # A partition whose end is not known yet has no lag rather than a made-up one.
    assert ("marshal_workers_partition_lag", where(4)) not in served
    assert served[("marshal_workers_partition_next_offset", where(4))] == 0


def test_calls_in_flight_and_window_use_per_partition(served: dict) -> None:
    assert served[("marshal_workers_partition_in_flight", where(3))] == 32
    assert served[("marshal_workers_partition_window_used", where(3))] == 700
    assert served[("marshal_workers_partition_in_flight", where(4))] == 0


def test_stalled_fetches_read_again_with_a_longer_wait_are_counted(served: dict) -> None:
    assert served[("marshal_workers_partition_fetch_stalls_total", where(3))] == 2
    assert served[("marshal_workers_partition_fetch_stalls_total", where(4))] == 0
    assert served[("marshal_workers_coordination_fetch_stalls_total", (("group", "billing"),))] == 3


def test_the_age_of_the_oldest_call_in_flight_per_partition(served: dict) -> None:
    assert served[("marshal_workers_partition_call_age_seconds", where(3))] == 95.5
    assert served[("marshal_workers_partition_call_age_seconds", where(4))] == 0, "no call in flight"


def test_handler_latency_is_a_cumulative_histogram(served: dict) -> None:
    bucket = "marshal_workers_handler_duration_seconds_bucket"
    assert served[(bucket, where(3, le="0.0005"))] == 90
    assert served[(bucket, where(3, le="0.01"))] == 99
    assert served[(bucket, where(3, le="10"))] == 99
    assert served[(bucket, where(3, le="+Inf"))] == 100
    assert served[("marshal_workers_handler_duration_seconds_count", where(3))] == 100
    assert served[("marshal_workers_handler_duration_seconds_sum", where(3))] == 12.5


def test_supervisor_counters(served: dict) -> None:
    group = (("group", "billing"),)
    assert served[("marshal_workers_partitions_owned", group)] == 2
    assert served[("marshal_workers_claims_total", (("group", "billing"), ("result", "accepted")))] == 2
    assert served[("marshal_workers_claims_total", (("group", "billing"), ("result", "refused")))] == 5
    assert served[("marshal_workers_releases_total", (("group", "billing"), ("reason", "balance")))] == 3
    assert served[("marshal_workers_heartbeat_failures_total", group)] == 4
    assert served[("marshal_workers_release_failures_total", group)] == 1
    assert served[("marshal_workers_coordination_garbage_records_total", group)] == 7
    assert served[("marshal_workers_coordination_records_total", group)] == 900
    assert served[("marshal_workers_coordination_batches_total", group)] == 120
    assert served[("marshal_workers_coordination_produce_requests_total", group)] == 110


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="in use.*--metrics-port"):
            MetricsServer("127.0.0.1", taken.getsockname()[1], snapshot)


def test_shared_partitions_leases_ranges_messages_and_the_logs_low_water_marks(served: dict) -> None:
    def thumbs(**more: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"group": "billing", "topic": "thumbs", **more}.items()))

    assert served[("marshal_workers_shared_leases_held", thumbs())] == 8
    assert served[("marshal_workers_shared_workers", thumbs())] == 4
    assert served[("marshal_workers_shared_ranges_total", thumbs(result="ack_refused"))] == 1
    assert served[("marshal_workers_shared_messages_total", thumbs(outcome="dead_lettered"))] == 4
    assert served[("marshal_workers_shared_low_water_mark", thumbs(partition="1"))] == 1480
    assert served[("marshal_workers_shared_messages_lost_total", thumbs(partition="1"))] == 20


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_the_probes_answer_from_the_supervisors_view_with_200_or_503() -> None:
    healthy = [True]
    probes = Probes(
        health=lambda: (healthy[0], {"loop_tick_age_s": 0.1}),
        ready=lambda: (False, {"phase": "stopping"}),
        state=lambda: {"phase": "stopping", "partitions": []},
    )
    port = free_port()
    server = MetricsServer("127.0.0.1", port, snapshot, probes)
    try:
        assert get(port, "/healthz") == (200, {"ok": True, "loop_tick_age_s": 0.1})
        healthy[0] = False
        assert get(port, "/healthz")[0] == 503
        assert get(port, "/readyz") == (503, {"ok": False, "phase": "stopping"})
        assert get(port, "/state") == (200, {"phase": "stopping", "partitions": []})
        assert get(port, "/nothing")[0] == 404
        assert scrape(port)[("marshal_workers_partitions_owned", (("group", "billing"),))] == 2, "metrics still there"
    finally:
        server.close()


def test_a_supervisor_is_healthy_while_its_loop_ticks_and_its_writes_are_confirmed() -> None:
    from marshal_workers.core.config import Settings
    from marshal_workers.handlers.app import App
    from marshal_workers.runtime.supervisor.supervisor import Supervisor
    from marshal_workers.runtime.supervisor.supervisor_lines import loop_health

    # loop_health(seconds since the loop's last pass, HB, last write confirmed at, last write failed at, phase)
    assert loop_health(0.0, 1.0, 0.0, 0.0, "running")[0]
    ok, details = loop_health(2.0, 1.0, 0.0, 0.0, "running")
    assert not ok and details["loop_tick_age_s"] >= 2.0, "a loop stuck for an HB is not healthy"
    ok, details = loop_health(0.0, 1.0, 5.0, 6.0, "running")
    assert not ok and details["last_write_confirmed"] is False, "the last coordination write failed"
    assert loop_health(0.0, 1.0, 7.0, 6.0, "running")[0], "a confirmed write after the failure: healthy again"
    supervisor = Supervisor(App(group="g"), "m:app", Settings(group="g", heartbeat_interval=1.0))
    assert supervisor.readiness() == (False, {"phase": "running", "claiming": True}), "not ready before start-up"


def test_worker_restarts_are_counted_by_reason(served: dict) -> None:
    reason = lambda r: (("group", "billing"), ("reason", r))  # noqa: E731
    assert served[("marshal_workers_worker_restarts_total", reason("crash"))] == 3
    assert served[("marshal_workers_worker_restarts_total", reason("poison"))] == 1


def test_autoscale_answers_the_groups_backlog_and_refuses_a_bad_query_with_a_json_400() -> None:
    from marshal_workers.core.config import Settings
    from marshal_workers.observe.autoscale_meter import AutoscaleMeter
    from marshal_workers.observe.dashboard_model import advance
    from marshal_workers.protocol.codec import Claim, Heartbeat
    from marshal_workers.protocol.world_state import WorldState

    state = WorldState("billing", 1000)
    t0 = 1_700_000_000_000
    state.apply(Claim(v=1, ts=t0, group="billing", client="a", instance="i", topic="orders", partition=0), t0)
    state.apply(
        Heartbeat(v=1, ts=t0, group="billing", client="a", instance="i", topic="orders", partition=0, offset=250), t0
    )
    meter = AutoscaleMeter(lambda d: advance(d, state, t0 + 500, {("orders", 0): 1000}, {"orders": 3}), Settings())
    port = free_port()
    server = MetricsServer("127.0.0.1", port, snapshot, autoscale=meter.start().answer)
    try:
        status, found = get(port, "/autoscale?drain_target=30s")
        assert status == 200
        assert (found["group"], found["backlog"], found["drain_target_s"]) == ("billing", 750, 30.0)
        assert found["topics"]["orders"]["partitions"] == 3
        # One look, no rate yet: the member there is keeps working.
        assert found["workers_wanted"] == found["topics"]["orders"]["workers_wanted"] == 1
        assert get(port, "/autoscale")[1]["drain_target_s"] == 60.0, "the drain_target setting's default"
        status, refused = get(port, "/autoscale?drain_target=soon")
        assert status == 400 and refused["error"].startswith("drain_target: expected a duration")
        assert get(port, "/autoscale?group=other")[0] == 400
    finally:
        server.close()
