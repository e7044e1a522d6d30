"""Settings: defaults < config file (TOML) < MARSHAL_WORKERS_* environment < CLI.

Every setting is declared once in ``SETTINGS`` with its parser and a one-line
explanation; ``config/marshal-workers.toml`` lists them all with their
defaults.  librdkafka settings (SASL, SSL, ...) go in the ``[kafka]`` table of
the file or in ``MARSHAL_WORKERS_KAFKA_<NAME>`` variables (``_`` for ``.``);
settings of consumers only or producers only in ``[kafka.consumer]`` and
``[kafka.producer]`` (``MARSHAL_WORKERS_KAFKA_CONSUMER_<NAME>``, ``..._PRODUCER_<NAME>``).
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from marshal_workers.core.durations import (
    parse_duration,
    parse_heartbeat_interval,
    parse_limit,
    parse_memory_limit,
)
from marshal_workers.core.librdkafka_check import librdkafka_refusal
from marshal_workers.errors import ConfigError

ENV_PREFIX = "MARSHAL_WORKERS_"
ENV_KAFKA_PREFIX = ENV_PREFIX + "KAFKA_"
KAFKA_ROLES = ("consumer", "producer")  # the sub-tables of [kafka]: [kafka.consumer], [kafka.producer]
ENV_CONFIG_FILE = ENV_PREFIX + "CONFIG"

_SECRET_WORDS = ("password", "secret", "token", "key", "jaas")


def _parse_str(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise ConfigError("expected a non-empty value")
    return text


def _parse_int(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"expected a whole number, got {value!r}") from None
        if isinstance(value, bool) or (isinstance(value, float) and value != number):
            raise ConfigError(f"expected a whole number, got {value!r}")
        if number < minimum:
            raise ConfigError(f"expected a number >= {minimum}, got {number}")
        if maximum is not None and number > maximum:
            raise ConfigError(f"expected a number <= {maximum}, got {number}")
        return number

    return parse


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected true or false, got {value!r}")


def _parse_choice(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


# librdkafka's properties that only one kind of client takes (CONFIGURATION.md, column C/P); any other kind
# warns (CONFWARN) that it ignores them.  Given under plain [kafka] they go to that kind of client only.
CONSUMER_ONLY = frozenset(
    """
    auto.commit.enable auto.commit.interval.ms auto.offset.reset check.crcs consume.callback.max.messages
    consume_cb coordinator.query.interval.ms enable.auto.commit enable.auto.offset.store enable.partition.eof
    fetch.error.backoff.ms fetch.max.bytes fetch.message.max.bytes fetch.min.bytes fetch.queue.backoff.ms
    fetch.wait.max.ms group.id group.instance.id group.protocol group.protocol.type group.remote.assignor
    heartbeat.interval.ms isolation.level max.partition.fetch.bytes max.poll.interval.ms max.poll.records
    offset.store.method offset.store.path offset.store.sync.interval.ms offset_commit_cb
    partition.assignment.strategy queued.max.messages.kbytes queued.min.messages rebalance_cb session.timeout.ms
    """.split()  # noqa: SIM905 - the names as librdkafka's table lists them, easier to compare than a list
)
PRODUCER_ONLY = frozenset(
    """
    acks batch.num.messages batch.size compression.codec compression.level compression.type
    delivery.report.only.error delivery.timeout.ms dr_cb dr_msg_cb enable.gapless.guarantee enable.idempotence
    linger.ms message.send.max.retries message.timeout.ms msg_order_cmp partitioner partitioner_cb
    produce.offset.report queue.buffering.backpressure.threshold queue.buffering.max.kbytes
    queue.buffering.max.messages queue.buffering.max.ms queuing.strategy request.required.acks request.timeout.ms
    retries sticky.partitioning.linger.ms transaction.timeout.ms transactional.id
    """.split()  # noqa: SIM905 - the names as librdkafka's table lists them, easier to compare than a list
)
_ONLY = {"consumer": CONSUMER_ONLY, "producer": PRODUCER_ONLY}


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    help: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("brokers", _parse_str, "Kafka bootstrap servers, comma-separated host:port."),
        Setting("group", _parse_str, "The consumer group: the unit that shares partitions."),
        Setting("client_id", _parse_str, "Stable name of this host or instance (default: the hostname)."),
        Setting(
            "heartbeat_interval",
            parse_heartbeat_interval,
            "HB: heartbeat period (at least 250ms); a claim is stale after 2*HB.",
        ),
        Setting("coordination_topic", _parse_str, "The topic that carries claims, heartbeats and releases."),
        Setting("coordination_partitions", _parse_int(1), "Partition count used when creating the coordination topic."),
        Setting(
            "coordination_replication_factor",
            _parse_int(-1),
            "Replication factor used when creating it (-1: the broker's default).",
        ),
        Setting("connect_timeout", parse_duration, "How long to wait for Kafka to answer before giving up."),
        Setting("write_timeout", parse_duration, "How long a coordination write may take to be confirmed."),
        Setting(
            "coordination_fetch_wait",
            parse_duration,
            "Longest wait of the coordination log's fetches (fetch.wait.max.ms); the embedded broker may show another "
            "member's record up to half of it late.",
        ),
        Setting(
            "checkpoint_interval",
            parse_limit,
            "How often the group writes a checkpoint of its state, so readers start near the end; sooner on a busy log, "
            "once 1,000 records came after the last (0: never).",
        ),
        Setting(
            "coordination_retention",
            parse_limit,
            "retention.ms given to the coordination topic when it is created (0: the broker's default).",
        ),
        Setting("log_level", _parse_choice("debug", "info", "warning", "error"), "Log level."),
        Setting("log_format", _parse_choice("text", "json"), "Log lines as text, or as one JSON object each."),
        Setting("max_partitions", _parse_int(0), "Most partitions one supervisor claims (0: no cap)."),
        Setting(
            "processes", _parse_int(0), "Worker processes per supervisor for each shared handler (0: one per CPU)."
        ),
        Setting("shutdown_timeout", parse_duration, "On SIGTERM, how long workers may finish before they are killed."),
        Setting(
            "auto_offset_reset",
            _parse_choice("earliest", "latest"),
            "Where a partition with no known position starts: earliest or latest.",
        ),
        Setting("crash_limit", _parse_int(1), "Worker crashes in a row before its partition is released as sick."),
        Setting("sick_cooldown", parse_duration, "How long a partition released as sick is not claimed again here."),
        Setting(
            "release_if_behind",
            _parse_bool,
            "Release a partition whose worker falls behind or stalls (a handler call within its time limit does not), "
            "if another member can take it.",
        ),
        Setting(
            "max_messages_per_worker",
            _parse_int(0),
            "Restart a worker cleanly after it handled this many messages (0: never).",
        ),
        Setting(
            "max_memory_per_worker",
            parse_memory_limit,
            "Restart a worker cleanly once its resident memory passes this, e.g. 512MB (0: never).",
        ),
        Setting(
            "behind_cycles", _parse_int(1), "Health cycles (HB/2 each) in a row of falling behind before a release."
        ),
        Setting(
            "worker_nice",
            _parse_int(0, 19),
            "How much lower the workers' CPU priority is than the supervisor's (a nice increment, 0 to 19; 0: the "
            "same): when handlers keep every core busy, heartbeats, claims and start-ups still get a core.",
        ),
        Setting(
            "soft_time_limit",
            parse_limit,
            "A handler call running longer gets SoftTimeLimitExceeded raised inside it (0: no limit).",
        ),
        Setting(
            "time_limit",
            parse_limit,
            "A handler call running longer has its worker killed and restarted; the message is retried (0: no limit).",
        ),
        Setting("metrics_port", _parse_int(0), "Serve Prometheus metrics on this port (0: off)."),
        Setting("metrics_host", _parse_str, "The address the metrics endpoint listens on (0.0.0.0: every interface)."),
        Setting("dashboard", _parse_bool, "run: also serve the live dashboard on the metrics port, at /dashboard."),
        Setting("dashboard_port", _parse_int(0), "The port of the `dashboard` command's web server."),
        Setting("dashboard_host", _parse_str, "The address the `dashboard` command listens on."),
        Setting(
            "drain_target",
            parse_duration,
            "/autoscale: how soon the wanted workers should drain the backlog (docs/operations.md, Autoscaling).",
        ),
        Setting("serve_topic", _parse_str, "serve: the shared topic served over HTTP."),
        Setting("serve_port", _parse_int(0), "serve: the HTTP port of the Read / Ack / Cancel service."),
        Setting("serve_host", _parse_str, "serve: the address it listens on (not loopback: give a token)."),
        Setting("serve_token", _parse_str, "serve: clients must send Authorization: Bearer <token> (never logged)."),
        Setting("serve_token_file", _parse_str, "serve: read the token from this file instead."),
        Setting("serve_pending_timeout", parse_duration, "serve: how long a read message stays pending."),
        Setting("serve_max_deliveries", _parse_int(1), "serve: hand-outs of a message before it is dead-lettered."),
        Setting("serve_range_size", _parse_int(1), "serve: offsets per range lease, at least (more for fast readers)."),
        Setting("serve_dlq_topic", _parse_str, "serve: the dead-letter topic (default: <topic>.dlq)."),
        Setting("serve_tls_cert", _parse_str, "serve: a PEM certificate (chain): serve HTTPS."),
        Setting("serve_tls_key", _parse_str, "serve: the certificate's PEM private key."),
        Setting(
            "balance",
            _parse_choice("greedy", "fair"),
            "greedy: claim every free partition (up to max_partitions); fair: hold an equal share of the group's.",
        ),
    )
}


@dataclass(frozen=True)
class Settings:
    brokers: str = "127.0.0.1:9092"
    group: str | None = None
    client_id: str = field(default_factory=socket.gethostname)
    heartbeat_interval: float = 5.0
    coordination_topic: str = "__marshal"
    coordination_partitions: int = 8
    coordination_replication_factor: int = -1
    connect_timeout: float = 10.0
    write_timeout: float = 10.0
    coordination_fetch_wait: float = 0.05
    checkpoint_interval: float = 60.0
    coordination_retention: float = 7 * 24 * 3600.0
    log_level: str = "info"
    log_format: str = "text"
    max_partitions: int = 0
    processes: int = 0
    shutdown_timeout: float = 30.0
    auto_offset_reset: str = "earliest"
    crash_limit: int = 5
    sick_cooldown: float = 60.0
    release_if_behind: bool = True
    max_messages_per_worker: int = 0
    max_memory_per_worker: int = 0
    behind_cycles: int = 5
    worker_nice: int = 10  # workers' CPU priority below the supervisor's (docs/operations.md, "Priorities")
    balance: str = "fair"  # members of a group share its partitions; greedy: the first up takes all
    soft_time_limit: float = 0.0
    time_limit: float = 0.0
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"  # /metrics, the probes and /state: this host only unless an address is given
    dashboard: bool = False
    dashboard_port: int = 8000
    dashboard_host: str = "127.0.0.1"  # read-only, but it shows the group to anyone who can reach it
    drain_target: float = 60.0
    serve_topic: str | None = None
    serve_port: int = 8080
    serve_host: str = "127.0.0.1"  # without a token, this host only
    serve_token: str | None = None
    serve_token_file: str | None = None
    serve_pending_timeout: float = 30.0
    serve_max_deliveries: int = 5
    serve_range_size: int = 100
    serve_dlq_topic: str | None = None
    serve_tls_cert: str | None = None
    serve_tls_key: str | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)  # [kafka]: every client
    kafka_consumer: Mapping[str, str] = field(default_factory=dict)  # [kafka.consumer]: consumers only
    kafka_producer: Mapping[str, str] = field(default_factory=dict)  # [kafka.producer]: producers only

    @property
    def heartbeat_ms(self) -> int:
        return round(self.heartbeat_interval * 1000)  # round: 4.007 * 1000 is 4006.99...

    @property
    def shared_processes(self) -> int:
        """Worker processes per shared handler: ``processes``, or one per CPU."""
        return self.processes or os.cpu_count() or 1

    def serve_token_value(self) -> str | None:
        """The serve token: ``serve_token``, else the first line of ``serve_token_file``."""
        if self.serve_token:
            return self.serve_token
        if not self.serve_token_file:
            return None
        try:
            with open(self.serve_token_file, encoding="utf-8") as file:
                token = file.readline().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {self.serve_token_file}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"the token file {self.serve_token_file} is empty")
        return token

    def require_group(self) -> str:
        if not self.group:
            raise ConfigError(
                "no group given: pass --group, set MARSHAL_WORKERS_GROUP, or put group in the config file"
            )
        return self.group

    def __repr__(self) -> str:
        # Settings travel in WorkerSpecs, exceptions and test reports: a repr never shows a secret.
        shown = {
            f.name: ("***" if f.name == "serve_token" and self.serve_token else getattr(self, f.name))
            for f in fields(self)
        } | {
            "kafka": self.kafka_redacted(),
            "kafka_consumer": _redacted(self.kafka_consumer),
            "kafka_producer": _redacted(self.kafka_producer),
        }
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    def kafka_redacted(self) -> dict[str, str]:
        """The librdkafka passthrough settings with secrets masked, fit for logs."""
        return _redacted(self.kafka)

    def kafka_for(self, role: str) -> dict[str, str]:
        """The librdkafka passthrough settings of a ``consumer``, a ``producer`` or an ``admin`` client.

        [kafka] less what librdkafka takes only from another kind of client (so a consumer-only property given
        there reaches consumers only), then [kafka.consumer] or [kafka.producer].
        """
        if role not in ("consumer", "producer", "admin"):
            raise ValueError(f"role must be consumer, producer or admin, not {role!r}")
        others = [only for kind, only in _ONLY.items() if kind != role]
        common = {k: v for k, v in self.kafka.items() if not any(k in only for only in others)}
        own = {"consumer": self.kafka_consumer, "producer": self.kafka_producer}.get(role, {})
        return common | dict(own)

    def check_kafka(self, origins: Mapping[tuple[str, str], Origin] | None = None) -> None:
        """librdkafka's own check of the passthrough settings, for each kind of client, before any client is made:
        a ConfigError naming the property and where it was given (``origins``: (table, property) -> Origin, table
        "" for [kafka]), rather than a KafkaException once the first client is made.  No client connects."""
        for role in KAFKA_CLIENTS:
            properties = self.kafka_for(role)
            refusal = librdkafka_refusal(role, properties) if properties else None
            if refusal is None:
                continue
            # Refused as it was set: the property refused on its own in the same words is the culprit (its name as
            # given: librdkafka names an alias's property, request.required.acks for acks).
            culprit = (
                None
                if refusal.on_create
                else next((k for k in properties if librdkafka_refusal(role, {k: properties[k]}) == refusal), None)
            )
            known = origins or {}
            tables = {key: self._table_of(role, key) for key in properties}
            where = {key: known.get((table, key), Origin(_table_name(table))) for key, table in tables.items()}
            reason = mask_secrets(refusal.reason, properties)
            raise ConfigError(refusal_message(role, properties, reason, culprit, where))

    def _table_of(self, role: str, key: str) -> str:
        """The table a property of ``kafka_for(role)`` came from: the role's own, else [kafka] ("")."""
        own = {"consumer": self.kafka_consumer, "producer": self.kafka_producer}.get(role, {})
        return role if key in own else ""


KAFKA_CLIENTS = ("consumer", "producer", "admin")
LIBRDKAFKA_PROPERTIES = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"


@dataclass(frozen=True)
class Origin:
    """Where a librdkafka property was given: a table of a config file, or an environment variable."""

    place: str  # "[kafka] of /etc/marshal-workers.toml", "the environment"
    variable: str | None = None  # MARSHAL_WORKERS_KAFKA_..., for the environment

    def __str__(self) -> str:
        return self.place if self.variable is None else f"{self.place} ({self.variable})"


def refusal_message(
    role: str, properties: Mapping[str, str], refusal: str, culprit: str | None, where: Mapping[str, Origin]
) -> str:
    """One line for the user: which property (or which settings together), where given, what to do.  ``refusal``
    is librdkafka's words with secrets already masked; a secret's value is never shown."""
    if culprit is not None:
        if refusal.startswith("No such configuration property"):
            return (
                f'"{culprit}" in {where[culprit]} is not a librdkafka property: correct its name or remove it '
                f"(librdkafka's properties: {LIBRDKAFKA_PROPERTIES})"
            )
        value = "" if _is_secret(culprit) else f" = {properties[culprit]!r}"
        return (
            f'"{culprit}"{value} in {where[culprit]} is refused by librdkafka ({refusal}): give it a value '
            f"librdkafka takes ({LIBRDKAFKA_PROPERTIES})"
        )
    places: dict[str, list[str]] = {}
    for origin in where.values():
        variables = places.setdefault(origin.place, [])
        if origin.variable is not None and origin.variable not in variables:
            variables.append(origin.variable)
    given = " and ".join(f"{place} ({', '.join(names)})" if names else place for place, names in places.items())
    kind = {"consumer": "consumers", "producer": "producers", "admin": "admin clients"}[role]
    return (
        f"librdkafka refuses the Kafka settings of {kind} given in {given}: {refusal}; set or fix them there "
        f"({LIBRDKAFKA_PROPERTIES})"
    )


def _table_name(table: str) -> str:
    return f"[kafka.{table}]" if table else "[kafka]"


def _is_secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def _redacted(kafka: Mapping[str, str]) -> dict[str, str]:
    return {k: ("***" if _is_secret(k) else v) for k, v in kafka.items()}


def mask_secrets(text: str, kafka: Mapping[str, str]) -> str:
    """``text`` with the value of every secret property of ``kafka`` masked (quoted, as librdkafka quotes values;
    anywhere, once it is long enough that masking it cannot eat the message)."""
    for key, value in kafka.items():
        if _is_secret(key) and value:
            text = text.replace(f'"{value}"', '"***"')
            if len(value) >= 4:
                text = text.replace(value, "***")
    return text


def _apply(values: dict[str, Any], raw: Mapping[str, Any], origin: str) -> None:
    for name, value in raw.items():
        setting = SETTINGS.get(name)
        if setting is None:
            known = ", ".join(sorted(SETTINGS))
            raise ConfigError(f"unknown setting {name!r} in {origin}; known settings: {known}")
        try:
            values[name] = setting.parse(value)
        except ConfigError as exc:
            raise ConfigError(f"{name} in {origin}: {exc}") from None


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _kafka_tables(raw: Any, origin: str) -> dict[str, dict[str, str]]:
    """[kafka], [kafka.consumer] and [kafka.producer] of a file: {"": common, "consumer": ..., "producer": ...}."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[kafka] in {origin} must be a table of librdkafka settings")
    common = {k: v for k, v in raw.items() if k not in KAFKA_ROLES}
    tables = {"": _kafka_table(common, "[kafka]", origin)}
    for role in KAFKA_ROLES:
        table = raw.get(role, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"[kafka.{role}] in {origin} must be a table of librdkafka settings")
        tables[role] = _kafka_table(table, f"[kafka.{role}]", origin)
    return tables


def _kafka_table(raw: Mapping[str, Any], name: str, origin: str) -> dict[str, str]:
    for key, value in raw.items():
        if isinstance(value, Mapping):
            raise ConfigError(
                f'{name} in {origin}: {key} is a table; write librdkafka names in quotes, e.g. "{key}.x" = ...'
            )
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in raw.items()}


def _check_roles(sections: Mapping[str, Mapping[str, str]]) -> None:
    """A property of one kind of client only, given in the other kind's section, is refused (librdkafka ignores it)."""
    for role, section in sections.items():
        for other, only in _ONLY.items():
            wrong = sorted(k for k in section if other != role and k in only)
            if wrong:
                raise ConfigError(
                    f"{', '.join(wrong)} under [kafka.{role}] only applies to {other}s: "
                    f"put {'it' if len(wrong) == 1 else 'them'} under [kafka.{other}] (or [kafka])"
                )


def load_settings(
    config_file: str | None = None,
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    app_defaults: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings; CLI values of None mean "not given".

    ``app_defaults`` are the settings given in code (``App(group=..., ...)``):
    they replace the built-in defaults, and everything else overrides them.
    librdkafka checks the [kafka] settings here (Settings.check_kafka), so a
    mistake there is a ConfigError before anything starts.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    by_role: dict[str, dict[str, str]] = {role: {} for role in KAFKA_ROLES}
    origins: dict[tuple[str, str], Origin] = {}  # (table, property) -> where it was given; table "" is [kafka]
    _apply(values, app_defaults or {}, "App(...)")

    config_file = config_file or env.get(ENV_CONFIG_FILE)
    if config_file:
        raw = _read_file(config_file)
        tables = _kafka_tables(raw.pop("kafka", {}), config_file)
        kafka.update(tables[""])
        for role in KAFKA_ROLES:
            by_role[role].update(tables[role])
        for table, properties in tables.items():
            origins |= {(table, key): Origin(f"{_table_name(table)} of {config_file}") for key in properties}
        _apply(values, raw, config_file)

    env_values = {name: env[ENV_PREFIX + name.upper()] for name in SETTINGS if ENV_PREFIX + name.upper() in env}
    _apply(values, env_values, "the environment")
    for key, value in env.items():
        if key.startswith(ENV_KAFKA_PREFIX) and len(key) > len(ENV_KAFKA_PREFIX):
            name = key[len(ENV_KAFKA_PREFIX) :].lower()
            role = name.split("_", 1)[0]
            if role in KAFKA_ROLES and "_" in name:  # MARSHAL_WORKERS_KAFKA_CONSUMER_FETCH_MIN_BYTES
                table, prop = role, name.split("_", 1)[1].replace("_", ".")
                by_role[role][prop] = value
            else:
                table, prop = "", name.replace("_", ".")
                kafka[prop] = value
            origins[(table, prop)] = Origin("the environment", key)
    _check_roles(by_role)

    _apply(values, {k: v for k, v in (cli or {}).items() if v is not None}, "the command line")
    settings = replace(
        Settings(), kafka=kafka, kafka_consumer=by_role["consumer"], kafka_producer=by_role["producer"], **values
    )
    settings.check_kafka(origins)
    return settings
