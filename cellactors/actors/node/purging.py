"""Purging a cell from a node: what ``cellactors purge`` does, after the node has let go of
its own activation, hibernated copy and local file of the cell.

Letting go first matters: an activation this node still held would write its next
transaction's batch under the purged cell's old epoch (its acknowledgement fails, but the
batch stays behind: docs/protocol.md, "Purging a cell").
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from cellactors.actors.cell import CellActor
from cellactors.core import keys
from cellactors.persistence.celldb.database import remove_db_files
from cellactors.persistence.control.purge import PurgeResult, purge_cell

if TYPE_CHECKING:
    from cellactors.actors.node.node import Node


def purge(node: Node, cls: type[CellActor] | str, name: str, settle: float = 2.0) -> PurgeResult:
    """Release the cell here (discarding its file), then purge it from the bucket; the next
    call finds an empty new cell."""
    cell_id = keys.make_cell_id(cls if isinstance(cls, str) else cls.__name__, name)
    node.activations.put_away(cell_id, hibernate=False, keep_copy=False)
    node.activations.release_dormant(cell_id)
    result = purge_cell(node.gate, cell_id, settle)
    copy = node.activations.local_copy(cell_id)
    if copy is not None:
        with contextlib.suppress(OSError):
            remove_db_files(copy.path)
    return result
