"""How many examples a property test tries: a share of its full count in the suite, all of it in the long run.

Each property test names its full count (``@settings(max_examples=examples(300))``; a test that names none has
hypothesis's 100, through the suite's profile in tests/conftest.py): the count its author judged enough to trust the
property.  The suite runs a share of it, MARSHAL_WORKERS_PROPERTY_SHARE (default 0.3), so that
the whole test command fits its time on 2 cores: the property tests of tests/unit/protocol were about half of the
suite's CPU at their full counts.  Hypothesis draws new examples on every run, so many runs of the suite try many
more examples than one run at the full count; and it keeps the failing ones it finds in .hypothesis/ and tries them
first next time.  Before a change to the fold, the codec or the claiming rules, run the long run (docs/architecture.md,
"Contributing: checks")::

    MARSHAL_WORKERS_PROPERTY_SHARE=1 python -m pytest -n 4 tests/unit

A test never tries fewer than MINIMUM examples.
"""

from __future__ import annotations

import os

MINIMUM = 25


def share() -> float:
    """The share of each property test's full count this run tries (MARSHAL_WORKERS_PROPERTY_SHARE)."""
    text = os.environ.get("MARSHAL_WORKERS_PROPERTY_SHARE", "0.3")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"MARSHAL_WORKERS_PROPERTY_SHARE must be a number such as 0.3 or 1, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"MARSHAL_WORKERS_PROPERTY_SHARE must be above 0, got {text!r}")
    return value


def examples(full: int) -> int:
    """The examples to try of a property whose full count is ``full``: at least MINIMUM (or ``full`` if less)."""
    return max(min(full, MINIMUM), round(full * share()))
