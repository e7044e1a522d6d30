"""Logging set-up: text lines that always say which group, topic and partition they are about."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``; safe to call again in a forked worker."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


class ContextLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with its context, e.g. ``group billing orders[3]:``."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{self.extra['context']}: {msg}", kwargs  # type: ignore[index]


def group_log(logger: logging.Logger, group: str) -> ContextLog:
    return ContextLog(logger, {"context": f"group {group}"})


def partition_log(logger: logging.Logger, group: str, topic: str, partition: int) -> ContextLog:
    return ContextLog(logger, {"context": f"group {group} {topic}[{partition}]"})
