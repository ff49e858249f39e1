"""Where an unowned cell goes: a pure choice from this node's state and its peers' leases."""

from __future__ import annotations

from collections.abc import Iterable

from cellactors.core.acquire import Remote
from cellactors.core.storage import DEGRADED
from cellactors.core.types import NodeLease


def roomy_peer(peers: Iterable[NodeLease], max_resident: int) -> Remote | None:
    """The least-loaded live peer with room and healthy storage, if any (ties by name)."""
    fit = [
        p
        for p in peers
        if p.load.get("storage") != DEGRADED and int(p.load.get("resident_cells", 0)) < max_resident
    ]
    if not fit:
        return None
    best = min(fit, key=lambda p: (int(p.load.get("resident_cells", 0)), p.node))
    return Remote(best.node, best.addr, best.generation)


def needs_peer(forwarded: bool, full: bool) -> bool:
    """Whether a healthy node should look for a peer instead of taking the cell: only when
    it is full (as many active cells as it may hold), and never for a call a peer forwarded
    here (never a third hop)."""
    return not forwarded and full
