"""Snapshots of a cell's database in the bucket, and the collection they allow: once a
snapshot is durable (and, with retention, old enough), the batches, seals and older
snapshots it covers are deleted by the owner that still owns the cell."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgpack

from cellactors.core import keys, restore_plan, retention
from cellactors.errors import BucketError
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.bucket import Bucket

SNAPSHOT_VERSION = 1

log = logging.getLogger(__name__)


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


def collect_garbage(
    bucket: Bucket,
    cell_id: str,
    snap_epoch: int,
    snap_txid: int,
    *,
    owns: Callable[[], bool],
    cancelled: Callable[[], bool] = lambda: False,
    retain_s: float = 0.0,
    now_ms: int | None = None,
) -> int:
    """Delete what a valid snapshot covers: batches and seals of epochs below its epoch and
    older snapshots. Returns objects deleted.

    Without retention (``retain_s`` 0) that snapshot is the one just written at
    (``snap_epoch``, ``snap_txid``). With retention it is the newest usable snapshot uploaded
    at least ``retain_s`` before ``now_ms`` (default: the store's time now;
    :func:`cellactors.core.retention.retention_base`),
    so history stays in the bucket for the change feed and point-in-time restores until a
    snapshot covering it has aged; nothing is collected while there is none.

    Owner work: ``owns()`` (a fresh read of ``own.json``) must confirm the snapshot's
    activation still owns the cell before anything is deleted, and ``cancelled()`` is checked
    before every delete. A restore racing the collection finds a listed object gone and lists
    again, which shows the snapshot (written before the collection began)."""
    root = keys.cell_root(cell_id)
    infos = list(bucket.list(root))
    listing = restore_plan.parse_listing(root, [info.key for info in infos])
    newest = restore_plan.SnapshotRef(
        snap_txid, snap_epoch, keys.snapshot_key(cell_id, snap_txid, snap_epoch)
    )
    base: restore_plan.SnapshotRef | None = newest
    if retain_s > 0:
        # Upload times are the store's, so the horizon is in the store's time too.
        horizon = (bucket.clock.now_ms() if now_ms is None else now_ms) - int(retain_s * 1000)
        uploaded = {info.key: info.last_modified_ms for info in infos}
        seals: dict[int, int] = {}
        while True:
            found = retention.retention_base(listing, uploaded, snap_epoch, newest, seals, horizon)
            if not isinstance(found, restore_plan.NeedSeal):
                base = found
                break
            value = read_seal(bucket, cell_id, found.epoch)
            if value is None:
                return 0  # collected meanwhile: leave it to a later collection
            seals[found.epoch] = value
    if base is None:
        return 0
    plan = retention.covered_by(listing, base)
    doomed = [*plan.batch_keys, *(keys.seal_key(cell_id, e) for e in plan.seal_epochs)]
    doomed += plan.snapshot_keys
    if not doomed or cancelled() or not owns():
        return 0
    deleted = 0
    for key in doomed:
        if cancelled():
            break
        bucket.delete(key)
        deleted += 1
    return deleted
