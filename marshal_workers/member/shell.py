"""What every part of the member core needs of the driver around it, whatever else its shell offers.

Each part of the core (partition_holding.py, range_leasing.py, batch_claims.py, checkpoint_writing.py, obeying.py)
is given a shell by its driver, a supervisor's component or a simulated member: its own protocol, with what that
part needs.  These are the pieces they share: where a part says what went wrong, the callbacks of a write (its
verdicts, one per record, or its failure), and the reading of the member's fold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from marshal_workers.protocol.world_state import WorldState

T = TypeVar("T")
OnVerdicts = Callable[[list[Any]], None]  # a write's verdicts, one per record, once the fold has given them
OnFailure = Callable[[Exception], None]  # a write not confirmed (failed, or past its deadline)


class Log(Protocol):
    """Where the core says what it did and what went wrong (a supervisor's log; the simulator's is quiet)."""

    def info(self, msg: str, *args: Any) -> None: ...

    def warning(self, msg: str, *args: Any) -> None: ...

    def error(self, msg: str, *args: Any) -> None: ...


class Quiet:
    """A log that says nothing: the simulator counts what happens instead."""

    def info(self, msg: str, *args: Any) -> None:
        pass

    def warning(self, msg: str, *args: Any) -> None:
        pass

    def error(self, msg: str, *args: Any) -> None:
        pass


class Reads(Protocol):
    """The member's fold of the coordination log, as it stands."""

    def read(self, query: Callable[[WorldState], T]) -> T:
        """``query`` over the fold (a supervisor holds its reader's lock meanwhile)."""
        ...
