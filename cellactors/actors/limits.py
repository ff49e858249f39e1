"""Process limits that bound how many cells a node can keep active.

Each active cell holds a file descriptor (its SQLite database; a hibernated cell holds none),
so the soft open-files limit, often 1024, caps a node long before memory does. ``serve``
raises the soft limit to the hard one at start-up, and ``/state`` reports what remains.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

#: File descriptors an active cell holds: its database (journal and temp tables are in memory).
FDS_PER_ACTIVE_CELL = 1
#: Descriptors kept for everything else: listeners, connections to the store and clients.
RESERVED_FDS = 256


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, err)
    return soft, hard


def max_active_cells() -> int:
    """How many cells the open-files limit allows to be active at once."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, (soft - RESERVED_FDS) // FDS_PER_ACTIVE_CELL)
