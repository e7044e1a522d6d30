"""librdkafka's own judgement of the [kafka] settings, asked before any real client is made.

A throw-away client per kind (consumer, producer, admin) is made with the settings and closed at once, without
bootstrap servers, so it connects nowhere; what librdkafka says against them becomes a ConfigError when the
settings are loaded (config.Settings.check_kafka) instead of a KafkaException once the first client is made.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

# The librdkafka log of the throw-away clients librdkafka_refusal builds: they connect nowhere, so all they could
# say is that they have no bootstrap servers (the real clients log their warnings through librdkafka_log).
_unheard = logging.getLogger("marshal_workers.librdkafka.check")
_unheard.propagate = False
_unheard.addHandler(logging.NullHandler())
_NOT_CHECKED = ("bootstrap.servers", "metadata.broker.list")  # without them the client never opens a socket
_FAILED_TO_CREATE = re.compile(r"^Failed to create [a-z ]+: ")


@dataclass(frozen=True)
class Refusal:
    """librdkafka's words against some settings, on one line, and whether it said them as it set one property
    (an unknown name, a bad value) or only as it made the client (settings that do not go together)."""

    reason: str
    on_create: bool


def librdkafka_refusal(role: str, properties: Mapping[str, str]) -> Refusal | None:
    """What librdkafka says against ``properties`` for a ``consumer``, ``producer`` or ``admin`` client, or None
    if it takes them.

    A client is made with them and closed at once, without bootstrap servers, so it connects nowhere: librdkafka
    checks each name and value as it is set (unknown property, bad value) and their combination as the client is
    made (SASL without credentials, an SSL file it cannot read).
    """
    config: dict[str, Any] = {"logger": _unheard}
    if role == "consumer":
        config["group.id"] = "marshal-workers-check"  # a consumer is not made without one
    config |= {k: v for k, v in properties.items() if k not in _NOT_CHECKED}
    try:
        if role == "consumer":
            Consumer(config).close()
        elif role == "producer":
            Producer(config).flush(0)
        else:
            AdminClient(config)
    except KafkaException as exc:
        error = exc.args[0]
        return _refusal(error.str() if isinstance(error, KafkaError) else str(error))
    except (TypeError, ValueError) as exc:  # the Python client's own checks: a callback property that is a string
        return _refusal(str(exc))
    return None


def _refusal(text: str) -> Refusal:
    """librdkafka's message on one line, without its "Failed to create producer: " (the caller knows which)."""
    line = " ".join(text.split())
    return Refusal(_FAILED_TO_CREATE.sub("", line), _FAILED_TO_CREATE.match(line) is not None)
