"""The metrics server of a supervisor (``--metrics-port``): Prometheus metrics, probes, the dashboard.

:func:`metric_families` turns a :class:`~marshal_workers.observe.metrics.Snapshot` into Prometheus metrics.  The
server (a thread of its own) takes a snapshot at each scrape, so nothing is computed between scrapes; it also answers
the health, readiness and state probes.  Imported only where a metrics port is served (supervisor.py, the HTTP
service's metrics).
"""

from __future__ import annotations

import errno
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from marshal_workers.errors import ConfigError
from marshal_workers.observe.dashboard import KEEPALIVE_S, Publisher, asyncapi_answer, page, sse_event
from marshal_workers.observe.latency import LATENCY_BOUNDS
from marshal_workers.observe.metrics import Probes, SharedStats, Snapshot

PREFIX = "marshal_workers"
_M = TypeVar("_M", bound=Metric)  # a kind of metric family


def metric_families(snapshot: Snapshot) -> list[Metric]:
    """Every metric of one scrape."""
    group, counters = snapshot.group, snapshot.counters
    labels = ["group", "topic", "partition"]

    def per_partition(kind: type[_M], name: str, doc: str) -> _M:
        return kind(f"{PREFIX}_{name}", doc, labels=labels)  # type: ignore[call-arg]

    next_offset = per_partition(GaugeMetricFamily, "partition_next_offset", "Next offset the worker will handle.")
    high = per_partition(GaugeMetricFamily, "partition_high_watermark", "End of the partition, as last fetched.")
    lag = per_partition(GaugeMetricFamily, "partition_lag", "Messages between the next offset and the end.")
    rate = per_partition(GaugeMetricFamily, "partition_messages_per_second", "Moving average of messages handled/s.")
    handled = per_partition(
        CounterMetricFamily, "messages_handled", "Messages handled since the partition was claimed."
    )
    dead = per_partition(CounterMetricFamily, "messages_dead_lettered", "Messages sent to the dead-letter topic.")
    in_flight = per_partition(GaugeMetricFamily, "partition_in_flight", "Handler calls running now.")
    call_age = per_partition(
        GaugeMetricFamily,
        "partition_call_age_seconds",
        "How long the oldest handler call in flight has been running (0: none).",
    )
    window = per_partition(
        GaugeMetricFamily,
        "partition_window_used",
        "Offsets from the lowest unfinished message to the furthest fetched (a stuck message holds it).",
    )
    stalls = per_partition(
        CounterMetricFamily,
        "partition_fetch_stalls",
        "Times the broker answered the worker's fetches without records while it was behind, and it read again "
        "with a longer fetch wait (the embedded broker on a long partition: docs/brokers.md).",
    )
    latency = per_partition(
        HistogramMetricFamily,
        "handler_duration_seconds",
        "Time of handler calls, sampled: every call of a fetch, a fetch at least every 100 ms.",
    )
    for p in snapshot.partitions:
        where = [group, p.topic, str(p.partition)]
        next_offset.add_metric(where, p.next_offset)
        handled.add_metric(where, p.handled)
        dead.add_metric(where, p.dead_lettered)
        in_flight.add_metric(where, p.in_flight)
        call_age.add_metric(where, p.call_age_s)
        window.add_metric(where, p.window_used)
        stalls.add_metric(where, p.fetch_stalls)
        if p.high_watermark is not None:
            high.add_metric(where, p.high_watermark)
        if p.lag is not None:
            lag.add_metric(where, p.lag)
        if p.messages_per_second is not None:
            rate.add_metric(where, p.messages_per_second)
        cumulative = list(itertools.accumulate(p.latency_counts))
        bounds = [*(f"{bound:g}" for bound in LATENCY_BOUNDS), "+Inf"]
        latency.add_metric(where, buckets=list(zip(bounds, cumulative)), sum_value=p.latency_sum_s)

    owned = GaugeMetricFamily(f"{PREFIX}_partitions_owned", "Partitions this supervisor holds.", labels=["group"])
    owned.add_metric([group], len(snapshot.partitions))
    claims = CounterMetricFamily(
        f"{PREFIX}_claims",
        "Partition claims written, by verdict (asked: refused asks of fair balance).",
        labels=["group", "result"],
    )
    claims.add_metric([group, "accepted"], counters.claims_accepted)
    claims.add_metric([group, "refused"], counters.claims_refused)
    claims.add_metric([group, "asked"], counters.asks)
    releases = _counted_by(group, "releases", "Partitions released, by reason.", ["reason"], counters.releases.items())
    restarts = _counted_by(
        group,
        "worker_restarts",
        "Workers restarted, by reason: crash, lifecycle (a limit), time_limit, poison (a message dead-lettered as "
        "WorkerLost after its worker died on it crash_limit times).",
        ["reason"],
        counters.worker_restarts.items(),
    )
    errors = _counted_by(
        group,
        "handler_errors",
        "Failed handler calls, by the type of the error raised.",
        ["topic", "error_type"],
        counters.handler_errors.items(),
    )
    retries = _counted_by(
        group, "handler_retries", "Handler calls retried.", ["topic"], counters.handler_retries.items()
    )
    outcomes = _counted_by(
        group,
        "handler_outcomes",
        "Messages a handler ignored (raise Ignore) or rejected (raise Reject), too old to handle (max_age), or "
        "redriven for another group (other_group).",
        ["topic", "outcome"],
        counters.handler_outcomes.items(),
    )
    simple = [
        ("heartbeat_failures", "Heartbeat writes that were not confirmed.", counters.heartbeat_failures),
        (
            "release_failures",
            (
                "Release writes that were not confirmed: the partition waits for its lease to run out, and what was "
                "handled since its last confirmed position is handled again."
            ),
            counters.release_failures,
        ),
        ("partitions_lost", "Partitions another member took over while we held them.", counters.partitions_lost),
        ("time_limit_kills", "Workers killed because a handler call ran past time_limit.", counters.time_limit_kills),
        (
            "message_claims_unconfirmed",
            "AMO batch claims Kafka did not confirm within an HB (the worker asks again).",
            counters.message_claims_unconfirmed,
        ),
        ("coordination_garbage_records", "Coordination records that were not valid.", snapshot.garbage_records),
        (
            "coordination_fetch_stalls",
            (
                "Times the broker answered the coordination log's fetches without records while it was behind, and it "
                "was read again with a longer fetch wait (docs/brokers.md)."
            ),
            snapshot.coordination_fetch_stalls,
        ),
        (
            "coordination_records",
            "Coordination records this supervisor's producer sent (librdkafka's statistics, every 5 s).",
            snapshot.coordination_records,
        ),
        (
            "coordination_batches",
            "Produce batches that carried them: the writes of one pass of the loop leave together (docs/brokers.md).",
            snapshot.coordination_batches,
        ),
        (
            "coordination_produce_requests",
            "Produce requests that carried those batches.",
            snapshot.coordination_produce_requests,
        ),
    ]
    families: list[Metric] = [
        next_offset,
        high,
        lag,
        rate,
        handled,
        dead,
        in_flight,
        call_age,
        window,
        stalls,
        latency,
        owned,
        claims,
        releases,
        restarts,
        errors,
        retries,
        outcomes,
    ]
    for name, doc, value in simple:
        counter = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["group"])
        counter.add_metric([group], value)
        families.append(counter)
    return families + shared_families(group, snapshot.shared)


def _counted_by(
    group: str, name: str, doc: str, labels: list[str], counts: Iterable[tuple[str | tuple[str, ...], int]]
) -> CounterMetricFamily:
    """A counter of ``group`` by ``labels``: one sample per (key, count) of ``counts``, a key being a label's value
    or a tuple of them."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["group", *labels])
    for key, count in sorted(counts):
        family.add_metric([group, *((key,) if isinstance(key, str) else key)], count)
    return family


def shared_families(group: str, shared: list[SharedStats]) -> list[Metric]:
    """Shared partitions (range leases): per topic, and per partition from the coordination log."""
    if not shared:
        return []
    by_topic = ["group", "topic"]
    leases = GaugeMetricFamily(f"{PREFIX}_shared_leases_held", "Range leases this supervisor holds.", labels=by_topic)
    workers = GaugeMetricFamily(f"{PREFIX}_shared_workers", "Shared workers running.", labels=by_topic)
    ranges = CounterMetricFamily(f"{PREFIX}_shared_ranges", "Range leases by result.", labels=[*by_topic, "result"])
    messages = CounterMetricFamily(
        f"{PREFIX}_shared_messages", "Messages of leased ranges by outcome.", labels=[*by_topic, "outcome"]
    )
    restarts = CounterMetricFamily(f"{PREFIX}_shared_worker_restarts", "Shared workers restarted.", labels=by_topic)
    by_partition = [*by_topic, "partition"]
    low = GaugeMetricFamily(
        f"{PREFIX}_shared_low_water_mark", "Every offset below it is done (the coordination log).", labels=by_partition
    )
    lost = CounterMetricFamily(
        f"{PREFIX}_shared_messages_lost",
        "Offsets of at-most-once leases that lapsed (never delivered again).",
        labels=by_partition,
    )
    for stats in shared:
        where = [group, stats.topic]
        leases.add_metric(where, stats.leases_held)
        workers.add_metric(where, stats.workers)
        restarts.add_metric(where, stats.worker_restarts)
        for result, count in stats.ranges.items():
            ranges.add_metric([*where, result], count)
        for outcome, count in stats.messages.items():
            messages.add_metric([*where, outcome], count)
        for partition, mark in sorted(stats.low_water_marks.items()):
            low.add_metric([*where, str(partition)], mark)
        for partition, count in sorted(stats.lost.items()):
            lost.add_metric([*where, str(partition)], count)
    return [leases, workers, ranges, messages, restarts, low, lost]


class _SnapshotCollector(Collector):
    def __init__(self, take_snapshot: Callable[[], Snapshot]) -> None:
        self._take_snapshot = take_snapshot

    def collect(self) -> Iterator[Metric]:
        yield from metric_families(self._take_snapshot())


class MetricsServer:
    """The HTTP endpoint on ``--metrics-port``, in threads of its own.

    ``/metrics``: Prometheus (prometheus_client renders it).  With probes: ``/healthz`` and ``/readyz``
    (200, or 503 when not, with a JSON body saying why: for Kubernetes' liveness and readiness probes or
    systemd's watchdog scripts) and ``/state`` (the SIGUSR1 document as JSON).  With a dashboard publisher
    (``run --dashboard``): the live dashboard's page at ``/dashboard/``, its JSON at ``/dashboard/api/state``
    and its server-sent events at ``/dashboard/events`` (the same page and documents as the ``dashboard``
    command; each event stream holds one of the server's threads).  With an app's document: its AsyncAPI
    document at ``/asyncapi.json``.  With ``autoscale`` (an AutoscaleMeter's ``answer``): ``/autoscale``, the
    group's backlog and the workers it wants (docs/operations.md, Autoscaling).
    """

    def __init__(
        self,
        host: str,
        port: int,
        take_snapshot: Callable[[], Snapshot],
        probes: Probes | None = None,
        dashboard: Publisher | None = None,
        asyncapi: Callable[[], bytes] | None = None,
        autoscale: Callable[[str], tuple[int, bytes]] | None = None,
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_SnapshotCollector(take_snapshot))
        handler = type(
            "Handler",
            (_Handler,),
            {
                "registry": registry,
                "probes": probes,
                "dashboard": dashboard,
                "asyncapi": staticmethod(asyncapi_answer(asyncapi)),
                "autoscale": None if autoscale is None else staticmethod(autoscale),
            },
        )
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"metrics port {port} is in use on {host}: choose another --metrics-port") from None
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    probes: Probes | None
    dashboard: Publisher | None
    asyncapi: Callable[[], tuple[int, bytes]]
    autoscale: Callable[[str], tuple[int, bytes]] | None

    def do_GET(self) -> None:  # the http.server name
        path, _, query = self.path.partition("?")
        probes = self.probes
        try:
            if self.dashboard is not None and path.startswith("/dashboard"):
                self._dashboard(path[len("/dashboard") :], self.dashboard)
            elif self.autoscale is not None and path == "/autoscale":
                self._send(*self.autoscale(query), "application/json")
            elif path in ("/metrics", "/"):
                self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
            elif probes is not None and path in ("/healthz", "/readyz"):
                ok, details = (probes.health if path == "/healthz" else probes.ready)()
                self._send(200 if ok else 503, orjson.dumps({"ok": ok, **details}), "application/json")
            elif probes is not None and path == "/state":
                self._send(200, orjson.dumps(probes.state()), "application/json")
            elif path == "/asyncapi.json":
                self._send(*self.asyncapi(), "application/json")
            else:
                self._send(
                    404,
                    orjson.dumps(
                        {"error": f"no {path} here: /metrics, /healthz, /readyz, /state, /asyncapi.json, /autoscale"}
                    ),
                    "application/json",
                )
        except Exception as exc:  # noqa: BLE001 - a probe that fails answers 500, the server goes on
            self._send(500, orjson.dumps({"error": f"{type(exc).__name__}: {exc}"}), "application/json")

    def _dashboard(self, path: str, publisher: Publisher) -> None:
        if path == "":  # the page's URLs are relative: they must resolve under /dashboard/
            self.send_response(301)
            self.send_header("Location", "/dashboard/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/":
            self._send(200, page(), "text/html; charset=utf-8")
        elif path == "/api/state":
            self._send(200, publisher.latest()[1], "application/json")
        elif path == "/events":
            self._stream_events(publisher)
        else:
            self._send(
                404,
                orjson.dumps(
                    {"error": f"no /dashboard{path} here: /dashboard/, /dashboard/api/state, /dashboard/events"}
                ),
                "application/json",
            )

    def _stream_events(self, publisher: Publisher) -> None:
        """Server-sent events in this handler's thread: a document per update until the client or we go."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()  # HTTP/1.0 and no length: the stream lasts until either side closes
        version, body = publisher.latest()
        try:
            self.wfile.write(sse_event(body))
            self.wfile.flush()
            while not publisher.closing.is_set():
                newer = publisher.wait_newer(version, KEEPALIVE_S)
                if newer is None:
                    self.wfile.write(b": keep-alive\n\n")
                else:
                    version, body = newer
                    self.wfile.write(sse_event(body))
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
        pass  # a scrape or probe every few seconds is not worth a log line
