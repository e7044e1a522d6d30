"""Running a Spark action and turning its failure into one line that says what went wrong.

A failed task reaches the driver as a Py4JJavaError whose text is a Java stack
trace with the task's Python traceback inside; the user needs the Python
exception's last line (and the split it names), not a hundred lines of JVM.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from marshal_workers.errors import SparkJobError

T = TypeVar("T")

# The last line of a Python traceback: "package.module.SomeError: message" (or "SomeError: message").
_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt)): (.*)$")


def run_job(what: str, action: Callable[[], T]) -> T:
    """``action()`` (a Spark action); SparkJobError with the tasks' own error if the job fails."""
    try:
        return action()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a job dies of, the user gets one line
        raise SparkJobError(f"the Spark job for the {what} failed: {task_error(exc)}") from None


def task_error(exc: BaseException) -> str:
    """The Python exception a task died of, as ``Name: message``; else the first line of ``exc``."""
    text = str(exc)
    python_part = text.split("PythonException:", 1)[1] if "PythonException:" in text else text
    found = None
    for line in python_part.splitlines():
        if line.startswith(("\tat ", "\t... ", "Caused by:", "Driver stacktrace:")):
            if found is not None:
                break  # the first Python traceback is the task's own; the rest is the JVM's retelling
            continue
        match = _PYTHON_ERROR.match(line.strip())
        if match is not None:
            found = f"{match.group(1)}: {match.group(2)}"
    if found is not None:
        return found
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:500]
