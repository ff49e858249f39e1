"""Purging a cell from a node: what ``cellactors purge`` does, after the node has let go of
its own activation, hibernated copy and local file of the cell.

Letting go first matters: an activation still held would write its next transaction's
batch under the purged cell's old epoch (its acknowledgement fails, but the batch stays
behind: docs/protocol.md, "Purging a cell"). So a cell a live peer owns is not purged from
here unless asked (``fence_live``): :class:`~cellactors.errors.RemoteOwner` names the node
to purge it on.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from cellactors.actors.cell import CellActor
from cellactors.core import acquire as acq
from cellactors.core import keys
from cellactors.errors import ActivationFailed, RemoteOwner
from cellactors.persistence.celldb.database import remove_db_files
from cellactors.persistence.control.purge import PurgeResult, purge_cell

if TYPE_CHECKING:
    from cellactors.actors.node.node import Node


def check_not_owned_elsewhere(node: Node, cell_id: str) -> None:
    """Raise :class:`RemoteOwner` when a live peer owns the cell (as the acquire protocol
    judges it: :func:`cellactors.core.acquire.decide`)."""
    record = node.ownership.read_owner(cell_id)
    if record is None or record.purging or record.node in ("", node.node_id):
        return
    snap = node.leases.read_lease(record.node)
    lease = snap.lease if snap else None
    decision = acq.decide(node.node_id, record, node.lease_clock.judge(), lease)
    if isinstance(decision, acq.Remote):
        raise RemoteOwner(decision.node, decision.addr, decision.generation)
    if isinstance(decision, acq.Defer):
        raise ActivationFailed(f"the lease of {cell_id}'s owner cannot be judged now; try again")


def purge(
    node: Node,
    cls: type[CellActor] | str,
    name: str,
    settle: float = 2.0,
    fence_live: bool = False,
) -> PurgeResult:
    """Release the cell here (discarding its file), then purge it from the bucket; the next
    call finds an empty new cell. A cell a live peer owns raises :class:`RemoteOwner`
    (nothing done) unless ``fence_live``."""
    cell_id = keys.make_cell_id(cls if isinstance(cls, str) else cls.__name__, name)
    if not fence_live:
        check_not_owned_elsewhere(node, cell_id)
    node.activations.put_away(cell_id, hibernate=False, keep_copy=False)
    node.activations.release_dormant(cell_id)
    result = purge_cell(node.gate, cell_id, settle)
    copy = node.activations.local_copy(cell_id)
    if copy is not None:
        with contextlib.suppress(OSError):
            remove_db_files(copy.path)
    return result
