"""What operators see of a running fleet: lag and rate in ``status``, the Prometheus endpoint."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request

import orjson
import pytest
from fleet import Fleet
from polling import poll_until
from prometheus_client.parser import text_string_to_metric_families

from marshal_workers.kafka.embedded_broker import free_port

pytestmark = pytest.mark.broker


def test_status_shows_each_partitions_lag_and_rate_while_a_backlog_drains(fleet: Fleet) -> None:
    fleet.env["MW_TEST_DELAY"] = "0.004"  # at most ~250 messages/s per partition: a backlog of seconds
    fleet.start("only")
    fleet.produce(range(8 * 1500))

    def draining() -> bool:
        rows = fleet.status_rows().values()
        return any(row["lag"] and row["rate"] for row in rows)

    poll_until(draining, what="heartbeats reporting lag and rate during the backlog")
    poll_until(lambda: len(fleet.counts()) == 8 * 1500, timeout=90, what="every message")
    poll_until(
        lambda: all(row["lag"] == 0 and row["offset"] == 1500 for row in fleet.status_rows().values()),
        what="lag 0 everywhere once drained",
    )
    assert all(row["rate"] is not None and row["rate"] >= 0 for row in fleet.status_rows().values())


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    return sum(value for labels, value in samples.get(name, []) if match.items() <= labels.items())


def test_the_metrics_endpoint_counts_messages_latency_and_claims(fleet: Fleet) -> None:
    port = free_port()
    fleet.start("only", "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
    fleet.produce(range(800))
    poll_until(lambda: len(fleet.counts()) == 800, what="every message")

    def scraped_all() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        try:
            samples = scrape(port)
        except OSError:
            return None
        return samples if total(samples, "marshal_workers_messages_handled_total") == 800 else None

    samples = poll_until(scraped_all, what="the endpoint counting all 800 messages")
    assert total(samples, "marshal_workers_partitions_owned", group=fleet.group) == 8
    assert total(samples, "marshal_workers_claims_total", result="accepted") == 8
    assert {labels["partition"] for labels, _ in samples["marshal_workers_partition_next_offset"]} == {
        str(p) for p in range(8)
    }
    assert total(samples, "marshal_workers_partition_next_offset", topic=fleet.topic) == 800
    timed = total(samples, "marshal_workers_handler_duration_seconds_count")
    assert 8 <= timed <= 800, "a sample of the calls, at least the first fetch of each partition"
    assert total(samples, "marshal_workers_handler_duration_seconds_bucket", le="+Inf") == timed
    poll_until(
        lambda: (
            total(scrape(port), "marshal_workers_partition_lag") == 0
            and len(scrape(port).get("marshal_workers_partition_lag", [])) == 8
        ),
        what="lag 0 on all 8 partitions",
    )


def probe(port: int, path: str) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())
    except OSError:
        return None  # not listening (yet, or any more)


def test_health_readiness_and_state_probes_follow_the_supervisor(fleet: Fleet) -> None:
    port = free_port()
    fleet.env["MW_TEST_DELAY"] = "1.5"  # a stop waits for the message in hand: the probes are seen meanwhile
    supervisor = fleet.start("only", "--metrics-port", str(port), MARSHAL_WORKERS_METRICS_HOST="127.0.0.1")
    poll_until(lambda: len(fleet.worker_pids("only")) == 8, what="8 workers")
    assert poll_until(lambda: probe(port, "/healthz"), what="/healthz")[0] == 200
    status, ready = probe(port, "/readyz")  # type: ignore[misc]
    assert (status, ready["phase"]) == (200, "running")
    state = probe(port, "/state")[1]  # type: ignore[index]
    assert sorted(row["partition"] for row in state["partitions"]) == list(range(8))

    fleet.produce(range(8))
    poll_until(lambda: len(fleet.counts()) >= 1, what="messages in hand")
    supervisor.send_signal(signal.SIGTERM)
    status, ready = poll_until(
        lambda: (probe(port, "/readyz") or (200, {}))[0] == 503 and probe(port, "/readyz"),
        what="/readyz 503 while stopping",
    )  # type: ignore[misc]
    assert ready["phase"] == "stopping"
    assert supervisor.wait(timeout=30) == 0
