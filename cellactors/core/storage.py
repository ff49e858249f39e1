"""Faults of a node's own storage: which errors are one, and the episode they belong to.

An error of the node's data directory (disk full, I/O error, a read-only or unopenable file
system, an exhausted quota) says nothing about the call that met it: it is the node's
fault, answered ``storage_unavailable`` (``not_run``), never ``method_failed``. A node that
met one is *degraded* until a probe of its data directory passes again; an episode is logged
once when it starts and once when it ends (docs/guarantees.md).
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass

#: OS errors of the storage itself (not of the request): no space, I/O, read-only, quota.
#: The lease ``load`` value (key ``storage``) of a node whose local storage is failing, and of
#: one whose storage is fine.
DEGRADED = "degraded"
HEALTHY = "ok"

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT})

#: SQLite's primary result codes for the same (an extended code's low byte is its primary).
SQLITE_STORAGE_CODES = {
    8: "SQLITE_READONLY",  # the file or its directory cannot be written (EROFS)
    10: "SQLITE_IOERR",  # every SQLITE_IOERR_* (read, write, fsync, truncate, ...)
    13: "SQLITE_FULL",  # no space (or quota) to grow the file or a journal
    14: "SQLITE_CANTOPEN",  # the file cannot be opened or created
}

#: The messages of those codes, for Pythons whose sqlite3 errors carry no code (3.10).
_MESSAGES = {
    "attempt to write a readonly database": "SQLITE_READONLY",
    "disk I/O error": "SQLITE_IOERR",
    "database or disk is full": "SQLITE_FULL",
    "unable to open database file": "SQLITE_CANTOPEN",
}


def storage_fault_reason(err: BaseException) -> str | None:
    """Why ``err`` is a fault of the node's storage (e.g. ``"SQLITE_FULL: database or disk
    is full"``), or None when it is not one. Only ``err`` itself counts, not what it was
    raised from: a call to another cell that failed on *that* cell's node is no fault of
    this one."""
    if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
        return f"{errno.errorcode[err.errno]}: {err.strerror or err}"
    if not isinstance(err, sqlite3.Error):
        return None
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        primary = SQLITE_STORAGE_CODES.get(code & 0xFF)
        if primary is None:
            return None
        name = getattr(err, "sqlite_errorname", None) or primary
        return f"{name}: {err}"
    text = str(err)
    for message, name in _MESSAGES.items():
        if text.startswith(message):
            return f"{name}: {text}"
    return None


@dataclass
class StorageEpisode:
    """Pure bookkeeping of one node's storage health; the caller passes the (monotonic)
    time and does the probing and logging these methods ask for."""

    #: Seconds between two probes of the data directory while degraded.
    probe_interval: float = 1.0
    degraded_since: float | None = None
    reason: str = ""
    faults: int = 0  # in the current episode
    next_probe: float = 0.0

    @property
    def degraded(self) -> bool:
        return self.degraded_since is not None

    def fault(self, reason: str, now: float) -> bool:
        """Record a fault met at ``now``; True when it starts an episode (log it). The next
        probe waits a full interval: the fault itself is the newest evidence."""
        self.faults += 1
        self.next_probe = now + self.probe_interval
        if self.degraded_since is not None:
            return False
        self.degraded_since, self.reason, self.faults = now, reason, 1
        return True

    def probe_due(self, now: float) -> bool:
        """Degraded, and the last probe (or fault) is an interval old: probe now."""
        return self.degraded_since is not None and now >= self.next_probe

    def probed(self, passed: bool, now: float) -> tuple[int, float] | None:
        """Record a probe's result: when it passed and ends the episode, (faults met in it,
        seconds it lasted) to log; None otherwise."""
        if self.degraded_since is None:
            return None
        if not passed:
            self.next_probe = now + self.probe_interval
            return None
        ended = (self.faults, now - self.degraded_since)
        self.degraded_since, self.reason, self.faults = None, "", 0
        return ended
