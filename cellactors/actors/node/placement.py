"""Where this node puts a cell nobody owns: here, or on a peer with room.

The choice itself is pure (:mod:`cellactors.core.placement`); this part reads what it needs
for it: the node's storage health, how many cells it holds, and its live peers' leases.
"""

from __future__ import annotations

from collections.abc import Callable

from cellactors.actors.node.settings import NodeSettings
from cellactors.actors.storage import StorageHealth
from cellactors.core import acquire, placement
from cellactors.errors import NodeStorageFault
from cellactors.persistence.control.leases import LeaseStore


class Placement:
    """Places unowned cells for one node."""

    def __init__(
        self,
        node_id: str,
        settings: NodeSettings,
        storage: StorageHealth,
        leases: LeaseStore,
        has_room: Callable[[int], bool],
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.storage = storage
        self.leases = leases
        self.has_room = has_room  # fewer active cells than the limit given?

    def place(self, forwarded: bool = False) -> acquire.Remote | None:
        """Placement of an unowned cell: here while there is room, else the least-loaded
        live peer with room (None means here); a forwarded call is placed where it lands.

        While this node's storage is degraded (and a probe, when due, does not pass) it
        takes no cell: the least-loaded healthy peer does, and with none (or for a call a
        peer forwarded here: never a third hop) the call is refused with
        :class:`~cellactors.errors.NodeStorageFault` before anything is written."""
        limit = self.settings.max_resident_cells
        if not self.storage.healthy():
            peer = None if forwarded else self._roomy_peer(limit)
            if peer is None:
                raise NodeStorageFault(
                    f"node {self.node_id} takes no new cells while its local storage is "
                    f"failing ({self.storage.reason}); the call did not run"
                )
            return peer
        full = not forwarded and not self.has_room(limit)  # no count asked when forwarded
        if not placement.needs_peer(forwarded, full):
            return None
        return self._roomy_peer(limit)

    def _roomy_peer(self, limit: int) -> acquire.Remote | None:
        return placement.roomy_peer(self.leases.read_capacity_peers(), limit)
