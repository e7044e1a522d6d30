"""Logging set-up: every line says which group, topic and partition it is about.

Text by default; ``log_format = "json"`` writes one JSON object per line with
the fields ``ts``, ``level``, ``logger``, ``pid``, ``message`` and, where they
apply, ``group``, ``topic``, ``partition``, ``offset`` (a failed handler call's
message) and ``exception`` (a traceback).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
_CONTEXT_FIELDS = ("group", "topic", "partition", "offset")


def _where(record: logging.LogRecord) -> str | None:
    group = getattr(record, "group", None)
    if group is None:
        return None
    topic = getattr(record, "topic", None)
    return f"group {group}" if topic is None else f"group {group} {topic}[{getattr(record, 'partition', '?')}]"


class TextFormatter(logging.Formatter):
    """The standard text line, with the group (topic, partition) before the message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        where = _where(record)
        if where is not None:
            record.message = f"{where}: {record.message}"
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        line.update({name: getattr(record, name) for name in _CONTEXT_FIELDS if hasattr(record, name)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level``, as text or JSON lines; safe to call again in a forked worker."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())


class ContextLog(logging.LoggerAdapter):
    """Says which group (and topic and partition) a line is about: a prefix in text, fields in JSON."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def group_log(logger: logging.Logger, group: str) -> ContextLog:
    return ContextLog(logger, {"group": group})


def partition_log(logger: logging.Logger, group: str, topic: str, partition: int) -> ContextLog:
    return ContextLog(logger, {"group": group, "topic": topic, "partition": partition})
