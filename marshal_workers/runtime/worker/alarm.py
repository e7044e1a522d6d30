"""A flag raised at a given time by a thread: the worker's hot loop checks a list item, not the clock.

Reading the clock before every message cost about 75 ns, 7% of a trivial
handler's whole cost.  The alarm thread sleeps until ``EARLY_S`` before the
time it is set to and then raises the flag; the loop sees it before its next
message and looks at the lease and housekeeping itself, with the clock.
Early, because the thread needs the GIL to raise the flag, and a thread
running Python gives it up every few milliseconds; a time closer than
``2 * EARLY_S`` raises the flag at once, so near a lease's end every message
is checked against the clock as before.
"""

from __future__ import annotations

import threading
import time

EARLY_S = 0.010


class Alarm:
    def __init__(self) -> None:
        self.due = [True]  # the flag: read it as ``due[0]``
        self._at = 0.0
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="alarm", daemon=True).start()

    def set(self, at: float) -> None:
        """Raise the flag at ``at`` (monotonic seconds); at once if that is less than 2 * EARLY_S away."""
        if at - time.monotonic() <= 2 * EARLY_S:
            self.due[0] = True
            return
        if not self.due[0] and at >= self._at:
            self._at = at  # later than the thread waits for: it sees the new time when it wakes (no switch now)
            return
        with self._changed:
            self._at = at
            self.due[0] = False
            self._changed.notify()

    def raise_now(self) -> None:
        """Raise the flag now; safe in a signal handler (no lock)."""
        self.due[0] = True

    def _run(self) -> None:
        with self._changed:
            while True:
                if self.due[0]:
                    self._changed.wait()  # nothing to time until set() is called again
                    continue
                remaining = self._at - EARLY_S - time.monotonic()
                if remaining <= 0:
                    self.due[0] = True
                else:
                    self._changed.wait(remaining)
