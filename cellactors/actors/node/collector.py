"""The node's collector: a thread that hands idle cells' resources back.

Every interval it trims the SQLite caches of cells idle past
:data:`~cellactors.actors.node.settings.TRIM_AFTER_S` (once per idle period), hibernates
cells idle past ``hibernate_timeout`` (still owned, nothing running), and releases cells
idle past ``idle_timeout``, resident or hibernated. After a round that trimmed or put cells
away, and the round after it (their actors stop a moment later), it hands the freed heap
back to the system (:mod:`.heap`), after a full garbage collection when cells were put away
(their actors' reference cycles): otherwise a node's RSS stays where its busiest moment
left it. While the node's storage is degraded it also lets the storage probe run when due.
It stops when the node stops serving.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from cellactors.actors.node.activations import Activations
from cellactors.actors.node.heap import release_free_heap
from cellactors.actors.node.settings import TRIM_AFTER_S, NodeSettings
from cellactors.actors.node.status import NodeStatus
from cellactors.actors.ownership import Active
from cellactors.actors.storage import StorageHealth

log = logging.getLogger(__name__)

#: Rounds that hand freed heap back once cells were trimmed or put away: this one and the
#: next.
TRIM_ROUNDS = 2
#: Seconds between two full garbage collections before handing heap back: a put-away
#: cell's actors, threads and futures refer to each other, and Python frees such cycles
#: only in a full collection, which on its own runs rarely on a big heap.
COLLECT_EVERY_S = 10.0


class Collector:
    """Trims, hibernates and releases idle cells (see the module's docstring)."""

    def __init__(
        self,
        node_id: str,
        settings: NodeSettings,
        activations: Activations,
        storage: StorageHealth,
        status: Callable[[], NodeStatus],
    ) -> None:
        self.settings = settings
        self.activations = activations
        self.storage = storage
        self._status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reaper-{node_id}", daemon=True)
        #: Rounds that still hand freed heap back (set when a round trims or puts cells away).
        self._trims_due = 0
        self.heap_trims = 0  # times it did (tests count them)
        self._collected_at = float("-inf")
        self._uncollected = False  # cells were put away since the last full collection

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        release_after = self.settings.idle_timeout
        hibernate_after = self.settings.hibernate_timeout
        hibernating = hibernate_after < release_after
        interval = min(1.0, (hibernate_after if hibernating else release_after) / 4)
        while not self._stop.wait(interval):
            self.storage.healthy()  # while degraded: probes when due, ends the episode
            if not self.collect_once(release_after, hibernate_after if hibernating else None):
                return

    def collect_once(self, release_after: float, hibernate_after: float | None) -> bool:
        """One round; False once the node no longer serves."""
        now = time.monotonic()
        trim: list[Active] = []
        idle: list[tuple[str, float]] = []
        first_step = release_after if hibernate_after is None else hibernate_after
        for cid, active in self.activations.resident():
            rt = active.runtime
            idle_for = now - rt.last_used
            if idle_for > TRIM_AFTER_S and rt.trimmed_for != rt.last_used:
                trim.append(active)
            if idle_for > min(first_step, release_after) and rt.channel.idle():
                idle.append((cid, idle_for))
        expired = [
            cid for cid, used in self.activations.dormant_since() if now - used > release_after
        ]
        shrunk = False
        for active in trim:
            rt = active.runtime
            used = rt.last_used
            if rt.trim_if_idle is not None and rt.trim_if_idle():
                rt.trimmed_for = used
                shrunk = True
        for cid, idle_for in idle:
            if self._status() is not NodeStatus.SERVING:
                return False
            if idle_for > release_after:
                self.activations.put_away(cid, hibernate=False)
            elif hibernate_after is not None:
                self.activations.put_away(cid, hibernate=True)
        for cid in expired:
            if self._status() is not NodeStatus.SERVING:
                return False
            self.activations.release_dormant(cid)
        put_away = bool(idle or expired)
        if put_away or shrunk:
            self._trims_due = TRIM_ROUNDS
        self._uncollected = self._uncollected or put_away
        if self._trims_due:
            self._trims_due -= 1
            self._release_heap(now, settled=not put_away)
        return True

    def _release_heap(self, now: float, settled: bool) -> None:
        """Free the garbage cycles put-away cells left (at most every
        :data:`COLLECT_EVERY_S` while cells keep being put away, and once more in the first
        round that puts none away; none for cells only trimmed), then hand the allocator's
        free pages back."""
        if self._uncollected and (settled or now - self._collected_at >= COLLECT_EVERY_S):
            self._collected_at = now
            self._uncollected = False
            gc.collect()
        if release_free_heap():
            self.heap_trims += 1
