"""Purging a cell: every object of it in the bucket deleted, ``own.json`` last.

The order keeps the rule "a cell without ``own.json`` has no history" (docs/protocol.md,
"Purging a cell"):

1. fence: ``own.json`` is rewritten at a new epoch, marked ``purging``, with a conditional
   write over the record just read. The owner's next acknowledgement re-reads it, sees
   another epoch and fails (``not_durable``), and no activation claims a purging record
   (:class:`~cellactors.errors.CellPurging`);
2. delete every other object of the cell: its batches, seals and snapshots under
   ``cells/<cell>/`` and its wake entries under ``wake/``;
3. after ``settle`` seconds (room for a batch PUT the fenced owner had in flight to land),
   list the folder again and delete what appeared;
4. delete ``own.json``: the cell is new again, unless a live node owned the cell when the
   purge began. That owner may still have a batch PUT on its way, which would land under
   an epoch the new cell will use again; so ``own.json`` stays, marked purging (a
   tombstone: no activation claims it), until a purge run once that owner has let go
   deletes what landed meanwhile and then ``own.json``.

A purge that stops part way leaves ``own.json`` marked purging: calls answer
``cell_purging`` (409) until a purge is run again, which skips the fencing and finishes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cellactors.core import keys
from cellactors.errors import AmbiguousWrite, BucketError
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.control.wakes import WAKE_PREFIX, parse_wake_key
from cellactors.persistence.store.bucket import Applied, Bucket

log = logging.getLogger(__name__)

#: Conflicting writes of own.json (the owner claiming or releasing meanwhile) tolerated.
MAX_FENCE_ATTEMPTS = 5


@dataclass(frozen=True)
class PurgeResult:
    """What a purge did: the epoch it fenced at (None when the cell had no ``own.json``)
    and how many objects it deleted, ``own.json`` included."""

    cell: str
    fenced_epoch: int | None
    deleted: int
    #: The live node that owned the cell when the purge began: ``own.json`` was left
    #: marked purging; purge again once that node has let go to finish.
    fenced_live: str | None = None

    @property
    def finished(self) -> bool:
        """``own.json`` is gone: the cell is new again."""
        return self.fenced_live is None


def fence_for_purge(bucket: Bucket, cell_id: str) -> int | None:
    """Step 1: mark ``own.json`` purging at a new epoch (or find it already marked);
    the epoch, or None when the cell has no ``own.json``."""
    owners = OwnershipStore(bucket, "purge")
    for _ in range(MAX_FENCE_ATTEMPTS):
        record = owners.read_owner(cell_id)
        if record is None or record.purging:
            return None if record is None else record.epoch
        try:
            epoch, result = owners.mark_purging(cell_id, record)
        except AmbiguousWrite:
            continue  # the next read says whether it applied
        if isinstance(result, Applied):
            return epoch
    raise BucketError(f"could not fence {cell_id} for a purge: own.json kept changing")


def live_owner(bucket: Bucket, cell_id: str) -> str | None:
    """The node that owns the cell if its lease is live by the store's clock (an owner that
    may still write, and whose purge belongs on that node), else None."""
    record = OwnershipStore(bucket, "purge").read_owner(cell_id)
    if record is None or record.purging or record.released:
        return None
    snap = LeaseStore(bucket, record.node).read_lease(record.node)
    if snap is None or snap.lease.node != record.node:
        return None
    return record.node if snap.lease.is_live(bucket.clock.now_ms()) else None


def _delete_history(bucket: Bucket, cell_id: str) -> int:
    """Delete every object of the cell except ``own.json``; how many."""
    own = keys.owner_key(cell_id)
    deleted = 0
    for info in list(bucket.list(keys.cell_root(cell_id))):
        if info.key != own:
            bucket.delete(info.key)
            deleted += 1
    return deleted


def _delete_wakes(bucket: Bucket, cell_id: str) -> int:
    """Delete the cell's wake entries (a scan of ``wake/``: entries are keyed by time)."""
    deleted = 0
    for info in list(bucket.list(WAKE_PREFIX)):
        parsed = parse_wake_key(info.key)
        if parsed is not None and parsed[0] == cell_id:
            bucket.delete(info.key)
            deleted += 1
    return deleted


def purge_cell(bucket: Bucket, cell_id: str, settle: float = 2.0) -> PurgeResult:
    """Delete the cell and every object of it from the bucket, fenced, ``own.json`` last
    (the module's docstring says why in this order). Finishes a purge that stopped part way;
    purging a cell that does not exist deletes nothing."""
    keys.validate_cell_id(cell_id)
    owner = live_owner(bucket, cell_id)
    epoch = fence_for_purge(bucket, cell_id)
    deleted = _delete_history(bucket, cell_id) + _delete_wakes(bucket, cell_id)
    if settle > 0:
        time.sleep(settle)  # a PUT the fenced owner sent before the fence may still land
    deleted += _delete_history(bucket, cell_id)
    if owner is not None:
        log.warning(
            "purged the history of %s, but its owner %s was live: own.json stays marked "
            "purging until a purge run after %s let go of the cell finishes",
            cell_id,
            owner,
            owner,
        )
        return PurgeResult(cell_id, epoch, deleted, owner)
    if epoch is not None:
        bucket.delete(keys.owner_key(cell_id))
        deleted += 1
    log.info("purged %s (fenced at epoch %s, %d objects deleted)", cell_id, epoch, deleted)
    return PurgeResult(cell_id, epoch, deleted)
