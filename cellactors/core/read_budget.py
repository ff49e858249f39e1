"""Which read-only methods may run on the serving event loop (docs/writing-a-cell.md,
"Read-only methods").

A read-only call on an idle cell can run right in the thread that received it, which on a
serving node is the event loop: fast, but a slow method there would hold up every other
request, health checks included. So a method runs on the loop only once it has *proven
quick*: its last :data:`PROVE` runs each finished within the budget. Until then, and again
after any run that overstayed, its calls run in a worker thread (still without the cell's
own thread). Pure: the caller measures and reports each run.
"""

from __future__ import annotations

from collections.abc import Hashable

#: Runs in a row within the budget that make a method quick enough for the loop.
PROVE = 3
#: The budget of one read-only run on the loop, by default (seconds). Runs that prove a
#: method are timed in a worker thread, where waiting for the interpreter lock (its switch
#: interval is 5 ms) counts too: the budget leaves room for that.
DEFAULT_BUDGET_S = 0.010


class QuickReads:
    """Per read-only method (any hashable key): how many of its last runs were quick."""

    def __init__(self, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.budget_s = budget_s
        self._streak: dict[Hashable, int] = {}

    def quick(self, key: Hashable) -> bool:
        """Whether ``key``'s calls may run on the loop."""
        return self._streak.get(key, 0) >= PROVE

    def ran(self, key: Hashable, seconds: float) -> bool:
        """Record one run of ``key`` that took ``seconds``; True when it overstayed the
        budget (then the method must prove itself again, off the loop)."""
        if seconds > self.budget_s:
            self._streak[key] = 0
            return True
        self._streak[key] = min(PROVE, self._streak.get(key, 0) + 1)
        return False
