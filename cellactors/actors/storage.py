"""The health of a node's data directory: faults met there, and the probe that ends them.

A node that met a storage fault (:mod:`cellactors.core.storage`) is *degraded*: it gives
up the cells that failed, places new activations on healthy live peers (or refuses them),
and advertises ``"storage": "degraded"`` in its lease ``load`` so that peers place nothing
on it. At most once a second it probes its data directory (a small write, fsync and
delete); the first probe that passes ends the episode and the node takes cells again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cellactors.core.storage import DEGRADED, HEALTHY, StorageEpisode

log = logging.getLogger(__name__)

#: Bytes the probe writes: a few of SQLite's pages, so that a directory with room for a
#: handful of bytes only does not pass for one that can take a cell's writes again.
PROBE_BYTES = 64 * 1024


def probe(directory: Path, size: int = PROBE_BYTES) -> str | None:
    """Write ``size`` bytes to a new file in ``directory``, fsync and delete it: None when
    that worked, else why not."""
    path = directory / f".probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            data = memoryview(bytes(size))
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        return f"probe of {directory} failed: {err}"
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    return None


class StorageHealth:
    """One node's storage episodes (thread-safe): faults are reported from cells and
    activations, probes run from the node's reaper and from placement."""

    def __init__(
        self,
        directory: Path,
        node_id: str,
        on_fault: Callable[[], None] | None = None,
        probe_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.node_id = node_id
        self.on_fault = on_fault  # counts each fault met (metrics)
        self._clock = clock
        self._lock = threading.Lock()
        self._probing = threading.Lock()  # one probe at a time
        self._episode = StorageEpisode(probe_interval)

    @property
    def degraded(self) -> bool:
        with self._lock:
            return self._episode.degraded

    @property
    def state(self) -> str:
        """``ok`` or ``degraded`` (the lease ``load`` and ``/state`` value)."""
        return DEGRADED if self.degraded else HEALTHY

    @property
    def reason(self) -> str:
        with self._lock:
            return self._episode.reason

    def fault(self, reason: str) -> None:
        """A storage fault was met: counted; the first of an episode is logged."""
        if self.on_fault is not None:
            self.on_fault()
        with self._lock:
            started = self._episode.fault(reason, self._clock())
        if started:
            log.warning(
                "node %s: local storage is failing (%s); the cells it fails for are given "
                "up, new cells go to healthy peers until a probe of %s passes",
                self.node_id,
                reason,
                self.directory,
            )

    def healthy(self) -> bool:
        """Whether this node may take cells: not degraded, or degraded and a probe (run now
        when one is due) passed, which ends the episode."""
        with self._lock:
            if not self._episode.degraded:
                return True
            due = self._episode.probe_due(self._clock())
        if not due or not self._probing.acquire(blocking=False):
            return False
        try:
            problem = probe(self.directory)
        finally:
            self._probing.release()
        with self._lock:
            ended = self._episode.probed(problem is None, self._clock())
            still = self._episode.degraded
        if ended is not None:
            faults, seconds = ended
            log.info(
                "node %s: local storage recovered after %d storage faults in %.1fs; "
                "taking cells again",
                self.node_id,
                faults,
                seconds,
            )
        return not still
