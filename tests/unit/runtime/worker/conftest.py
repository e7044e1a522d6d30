"""Fixtures of the worker tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def to_close() -> Iterator[list[Any]]:
    """What a test made that holds pipes (each with a ``close()``): closed when the test ends, however it ends."""
    made: list[Any] = []
    yield made
    for thing in made:
        thing.close()
