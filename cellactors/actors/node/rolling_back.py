"""Rolling a live cell back in place, through the node that owns it (``cellactors
rollback``, ``POST /cells/{cls}/{name}/rollback`` on the internal listener).

In three steps, none of which holds the cell while the bucket is read:

1. the cell, activated on this node, names its activation and its latest txid, answered
   once every transaction up to it is durable (so the bucket holds the history up to it);
   a cell the bucket has no record of is refused (a rollback creates no cell);
2. the database as it was at the point asked for (a txid, or the last transaction committed
   at or before a time) is restored from the bucket into a temporary file, as
   ``cellactors restore --at-txid`` does;
3. the cell makes its user tables that image's in one transaction marked as a rollback
   (:mod:`cellactors.actors.rollback_run`), if it is still the activation of step 1 (a cell
   that moved or was purged meanwhile refuses, unchanged); calls that committed between 1
   and 3 are rolled back too, and the answer names the txid before the rollback, to undo it.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellactors.actors.cell import CellActor
from cellactors.actors.messages import RollBack, RolledBack
from cellactors.core import keys
from cellactors.errors import (
    BadRequest,
    BucketError,
    BucketUnavailable,
    PointNotRestorable,
    RestoreHole,
)
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.history.restore import restore_at

if TYPE_CHECKING:
    from cellactors.actors.node.node import Node


@dataclass(frozen=True)
class RollbackResult:
    """What a rollback did: the cell's user tables are now as they were right after
    ``to_txid``; ``txid`` is the rollback's own transaction (None: nothing differed, nothing
    was written), and rolling back to ``undo_txid`` undoes it."""

    cell: str
    to_txid: int
    txid: int | None
    undo_txid: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _image_at(
    node: Node, cell_id: str, epoch: int, to_txid: int | None, at_ms: int | None
) -> tuple[int, bytes]:
    """The cell's database right after ``to_txid`` (or at ``at_ms``), from the bucket, and
    the txid it is at; ``epoch`` is the owner's. Nothing has changed yet: a store that fails
    here is ``bucket_unavailable`` (``not_run``)."""
    with tempfile.TemporaryDirectory(prefix="cellactors-rollback-", dir=node.cells_dir) as tmp:
        db = CellDatabase(Path(tmp) / "past.db")
        try:
            found = restore_at(node.gate, cell_id, epoch + 1, db, txid=to_txid, at_ms=at_ms)
            return found.last_txid, db.image()
        except PointNotRestorable as err:
            raise BadRequest(str(err)) from err
        except (BucketError, RestoreHole) as err:
            raise BucketUnavailable(
                f"the history of {cell_id} could not be read: {err}; nothing changed"
            ) from err
        finally:
            db.close()


def roll_back(
    node: Node,
    cls: type[CellActor] | str,
    name: str,
    *,
    to_txid: int | None = None,
    at_ms: int | None = None,
) -> RollbackResult:
    """Roll the cell back in place to right after ``to_txid``, or to its state at ``at_ms``
    (milliseconds since the epoch, the commit stamps' clock), activating it here if no live
    peer owns it (:class:`~cellactors.errors.RemoteOwner` when one does). A point at or after
    its latest txid, or outside the retained history, is refused (``BadRequest``,
    ``HistoryCollected``) and nothing changes."""
    if (to_txid is None) == (at_ms is None):
        raise BadRequest("give exactly one of to_txid and at_ms")
    if to_txid is not None and to_txid < 0:
        raise BadRequest(f"txid {to_txid} is not a transaction id")
    cell_id = keys.make_cell_id(cls if isinstance(cls, str) else cls.__name__, name)
    try:
        record = node.ownership.read_owner(cell_id)
    except BucketError as err:
        raise BucketUnavailable(f"own.json of {cell_id} could not be read: {err}") from err
    if record is None or record.purging:
        raise BadRequest(f"no cell {cell_id} in the bucket: nothing to roll back")
    incarnation, epoch, latest = node.runner.run_owned(
        cell_id, RollBack, "its latest txid was asked", node.routes
    )
    if to_txid is not None and to_txid >= latest:
        raise BadRequest(f"{cell_id} is at txid {latest}: a rollback goes to an earlier one")
    point, image = _image_at(node, cell_id, epoch, to_txid, at_ms)
    done: RolledBack = node.runner.run_owned(
        cell_id, lambda: RollBack(point, image, incarnation), "it was rolled back", node.routes
    )
    return RollbackResult(cell_id, done.to_txid, done.txid, done.undo_txid)
