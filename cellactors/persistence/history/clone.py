"""Cloning a cell: a new cell whose database starts as another's, now or at a txid.

The clone never writes under the source's folder. For the target, in this order (so that
"a cell without ``own.json`` has no history" holds at every step, docs/protocol.md):

1. create the target's ``own.json`` with a conditional create, marked ``purging`` at epoch 1
   (fails if the target exists; no call can claim it while it is being built, and a clone
   that stops here is finished off by ``cellactors purge``);
2. restore the source into a temporary database and write it as the target's snapshot at
   epoch 1, txid T (the source's txid);
3. rewrite ``own.json`` (guarded) as released at epoch 1 with ``acked_txid`` T: the next call
   claims epoch 2 and restores the snapshot.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from cellactors.core import keys
from cellactors.errors import BucketError, CellactorsError
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.history.restore import restore, restore_at
from cellactors.persistence.history.snapshots import encode_snapshot
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Absent, Applied, Bucket, Match

EPOCH = 1


@dataclass(frozen=True)
class CloneResult:
    """The clone made: ``txid`` is the source's txid its database starts at."""

    source: str
    target: str
    txid: int


def _source_image(bucket: Bucket, source: str, at_txid: int | None) -> tuple[int, bytes]:
    """The source's database (as acknowledged, or right after ``at_txid``) and its txid."""
    record = OwnershipStore(bucket, "clone").read_owner(source)
    if record is None or record.purging:
        raise CellactorsError(f"no cell {source} to clone")
    with tempfile.TemporaryDirectory(prefix="cellactors-clone-") as tmp:
        db = CellDatabase(Path(tmp) / "source.db")
        try:
            if at_txid is None:
                result = restore(
                    bucket, source, record.epoch + 1, db, seal=False, floor=record.acked_txid
                )
            else:
                result = restore_at(bucket, source, record.epoch + 1, db, txid=at_txid)
            return result.last_txid, db.image()
        finally:
            db.close()


def clone_cell(bucket: Bucket, source: str, target: str, at_txid: int | None = None) -> CloneResult:
    """Make ``target`` a new cell whose database is ``source``'s (now, or right after
    ``at_txid``); raises if ``target`` exists. Writes nothing under ``source``."""
    keys.validate_cell_id(source)
    keys.validate_cell_id(target)
    if source == target:
        raise CellactorsError("a cell cannot be cloned onto itself")
    own = keys.owner_key(target)
    building = records.encode({"node": "", "epoch": EPOCH, "acked_txid": 0, "purging": True})
    created = bucket.put_cas(own, building, Absent())
    if not isinstance(created, Applied):
        raise CellactorsError(f"{target} exists; a clone creates a new cell")
    txid, image = _source_image(bucket, source, at_txid)
    snap = keys.snapshot_key(target, txid, EPOCH)
    bucket.put(snap, encode_snapshot(target, EPOCH, txid, image))
    done = records.encode({"node": "", "epoch": EPOCH, "acked_txid": txid})
    if not isinstance(bucket.put_cas(own, done, Match(created.token)), Applied):
        raise BucketError(f"{own} changed while {target} was being cloned")
    return CloneResult(source, target, txid)
