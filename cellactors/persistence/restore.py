"""Restoring a cell from the bucket, sealing epochs, and writing snapshots.

Runs after an acquire at epoch E and before the cell's mailbox opens. The plan comes from
:mod:`cellactors.core.restore_plan`; this module does the reads and writes. A lost seal race
fails the activation (the next one will find the seal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from cellactors.core import restore_plan
from cellactors.errors import AmbiguousWrite, BucketError, CellactorsError
from cellactors.persistence import keys, records
from cellactors.persistence.batches import decode_batch
from cellactors.persistence.bucket import Absent, Applied, Bucket
from cellactors.persistence.celldb import CellDatabase

SNAPSHOT_VERSION = 1


class SealLost(CellactorsError):
    """Another activation sealed the epoch first; this activation must fail."""


@dataclass
class RestoreResult:
    """Where a restore ended: the last applied txid and what it did on the way."""

    last_txid: int
    snapshot: tuple[int, int] | None = None  # (epoch, txid) of the snapshot used
    sealed: list[int] = field(default_factory=list)
    batches_read: int = 0


def seal_body(epoch: int, max_txid: int, sealed_by: int) -> bytes:
    return records.encode({"epoch": epoch, "max_txid": max_txid, "sealed_by_epoch": sealed_by})


def read_seal(bucket: Bucket, cell_id: str, epoch: int) -> int | None:
    """The ``max_txid`` of epoch ``epoch``'s seal, or None when unsealed."""
    key = keys.seal_key(cell_id, epoch)
    obj = bucket.get(key)
    if obj is None:
        return None
    value = records.decode(key, obj.body, {"epoch": int, "max_txid": int})
    return int(value["max_txid"])


def create_seal(bucket: Bucket, cell_id: str, epoch: int, max_txid: int, sealed_by: int) -> None:
    """Create the seal (conditional create); raise :class:`SealLost` if someone else did."""
    key = keys.seal_key(cell_id, epoch)
    body = seal_body(epoch, max_txid, sealed_by)
    for _ in range(3):
        try:
            result = bucket.put_cas(key, body, Absent())
        except AmbiguousWrite:
            back = bucket.get(key)
            if back is None:
                continue  # it did not happen: try again
            if back.body == body:
                return
            raise SealLost(f"epoch {epoch} of {cell_id} was sealed by another activation") from None
        if isinstance(result, Applied):
            return
        raise SealLost(f"epoch {epoch} of {cell_id} was sealed by another activation")
    raise BucketError(f"could not create the seal of epoch {epoch} of {cell_id}")


def encode_snapshot(cell_id: str, epoch: int, txid: int, image: bytes) -> bytes:
    payload = {"v": SNAPSHOT_VERSION, "cell": cell_id, "epoch": epoch, "txid": txid, "image": image}
    return bytes(msgpack.packb(payload, use_bin_type=True))


def decode_snapshot(key: str, body: bytes) -> tuple[int, int, bytes]:
    """(epoch, txid, image) of a snapshot object."""
    try:
        value: dict[str, Any] = msgpack.unpackb(body, raw=False)
        if value.get("v") != SNAPSHOT_VERSION:
            raise ValueError("unsupported snapshot version")
        return int(value["epoch"]), int(value["txid"]), bytes(value["image"])
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as err:
        raise BucketError(f"{key} is not a valid snapshot: {err}") from err


def restore(
    bucket: Bucket, cell_id: str, epoch: int, db: CellDatabase, *, seal: bool = True
) -> RestoreResult:
    """Rebuild ``db`` (expected empty) as of every sealed transaction below ``epoch``, sealing
    each unsealed epoch on the way.

    ``seal=False`` is the read-only form for operators (``cellactors restore``): it writes
    nothing, follows unsealed epochs' chains, and so may include writes that were uploaded
    but never acknowledged.
    """
    root = keys.cell_root(cell_id)
    listing = restore_plan.parse_listing(root, [info.key for info in bucket.list(root)])
    result = RestoreResult(last_txid=0)
    start_epoch = 1
    for snap_txid, key_epoch, snap_key in listing.snapshots:
        if key_epoch >= epoch:
            continue  # not written by an earlier owner: unusable
        obj = bucket.get(snap_key)
        if obj is None:
            continue
        snap_epoch, txid, image = decode_snapshot(snap_key, obj.body)
        if snap_epoch != key_epoch or txid != snap_txid:
            continue
        if snap_epoch in listing.seals:
            sealed_max = read_seal(bucket, cell_id, snap_epoch)
            if sealed_max is not None and txid > sealed_max:
                continue  # a fenced owner's late snapshot: not acknowledged state
        db.load_image(image)
        start_epoch, result.last_txid, result.snapshot = snap_epoch, txid, (snap_epoch, txid)
        break
    for e in restore_plan.epochs_to_restore(listing, start_epoch, epoch):
        seal_max: int | None = None
        if e in listing.seals:
            if not restore_plan.needs_seal_read(listing, e, result.last_txid):
                continue
            seal_max = read_seal(bucket, cell_id, e)
            if seal_max is None:
                raise BucketError(f"seal of epoch {e} of {cell_id} vanished during restore")
        step = restore_plan.plan_epoch(listing, e, result.last_txid, seal_max)
        if seal_max is not None and step.upto < seal_max:
            raise BucketError(
                f"epoch {e} of {cell_id} is sealed at txid {seal_max} but its batches end at "
                f"txid {step.upto}: batch objects are missing from the bucket"
            )
        for ref in step.reads:
            obj = bucket.get(ref.key)
            if obj is None:
                raise BucketError(f"{ref.key} vanished during restore")
            result.batches_read += 1
            for txn in decode_batch(ref.key, obj.body).txns:
                if result.last_txid < txn.txid <= step.upto:
                    if txn.txid != result.last_txid + 1:
                        raise BucketError(f"{ref.key}: txid {txn.txid} out of order")
                    db.apply(txn)
                    result.last_txid = txn.txid
        if step.seal and seal:
            create_seal(bucket, cell_id, e, result.last_txid, epoch)
            result.sealed.append(e)
    return result


def collect_garbage(bucket: Bucket, cell_id: str, snap_epoch: int, snap_txid: int) -> int:
    """Delete what a valid snapshot at (``snap_epoch``, ``snap_txid``) covers: batches and
    seals of epochs below ``snap_epoch`` and older snapshots. Returns objects deleted."""
    root = keys.cell_root(cell_id)
    listing = restore_plan.parse_listing(root, [info.key for info in bucket.list(root)])
    doomed = [ref.key for e, refs in listing.batches.items() if e < snap_epoch for ref in refs]
    doomed += [keys.seal_key(cell_id, e) for e in listing.seals if e < snap_epoch]
    doomed += [key for txid, _epoch, key in listing.snapshots if txid < snap_txid]
    for key in doomed:
        bucket.delete(key)
    return len(doomed)
