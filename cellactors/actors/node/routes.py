"""The node's route cache: which live peer owned a cell when this node last looked.

A call for a cell a live peer owns is answered with
:class:`~cellactors.errors.RemoteOwner` from the cache for one lease TTL, with no bucket
request; an activation that finds the cell owned elsewhere remembers the route, one that
opens the cell here forgets it, and an answer that proves the route stale
(:mod:`cellactors.core.routing`) forgets it too.
"""

from __future__ import annotations

import threading
import time

from cellactors.core import acquire


class RouteCache:
    """Routes to the live peers that own cells, each fresh for ``ttl_s`` seconds."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[acquire.Remote, float]] = {}

    def get(self, cell_id: str) -> acquire.Remote | None:
        """The live peer that owned the cell when this node last looked, if still fresh."""
        with self._lock:
            route = self._routes.get(cell_id)
        return route[0] if route is not None and route[1] > time.monotonic() else None

    def remember(self, cell_id: str, owner: acquire.Remote) -> None:
        with self._lock:
            self._routes[cell_id] = (owner, time.monotonic() + self.ttl_s)

    def forget(self, cell_id: str) -> None:
        with self._lock:
            self._routes.pop(cell_id, None)
