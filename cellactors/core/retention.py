"""What a garbage collection may delete when history is retained (docs/feed.md, "Retention").

A collection runs after an owner at epoch E uploads a snapshot. Without retention it deletes
what that snapshot covers. With a retention period, it deletes only what a snapshot *old
enough* covers: the base is the newest usable snapshot uploaded at or before the horizon
(now minus the retention), so every point after the horizon keeps a snapshot at or below it
and every batch from there on, and the change feed and point-in-time restore reach back that
far. The base is a snapshot this activation wrote, or one of a sealed epoch below E whose
txid is within that epoch's seal (never a fenced owner's late snapshot): a restore from any
later snapshot still finds everything it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cellactors.core.restore_plan import Listing, NeedSeal, SnapshotRef


@dataclass(frozen=True)
class Collection:
    """Delete the batches ``batch_keys``, the seals of ``seal_epochs`` and the snapshots
    ``snapshot_keys``: what the snapshot ``base`` covers."""

    base: SnapshotRef
    batch_keys: tuple[str, ...]
    seal_epochs: tuple[int, ...]
    snapshot_keys: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.batch_keys or self.seal_epochs or self.snapshot_keys)


def covered_by(listing: Listing, base: SnapshotRef) -> Collection:
    """Everything the snapshot ``base`` makes unnecessary for restores from it: batches and
    seals of epochs below its epoch, and snapshots older than it."""
    return Collection(
        base,
        tuple(
            ref.key for e, refs in sorted(listing.batches.items()) if e < base.epoch for ref in refs
        ),
        tuple(sorted(e for e in listing.seals if e < base.epoch)),
        tuple(key for txid, _e, key in listing.snapshots if txid < base.txid),
    )


def retention_base(
    listing: Listing,
    uploaded_ms: Mapping[str, int],
    owner_epoch: int,
    newest: SnapshotRef,
    seals: Mapping[int, int],
    horizon_ms: int,
) -> SnapshotRef | NeedSeal | None:
    """The newest usable snapshot, at or below ``newest`` (the one just written by the owner
    at ``owner_epoch``), uploaded at or before ``horizon_ms``; None when there is none (then
    nothing is collected yet). ``uploaded_ms`` maps keys to their upload time in the store."""
    for txid, epoch, key in listing.snapshots:  # newest first
        if txid > newest.txid or epoch > owner_epoch:
            continue
        if uploaded_ms.get(key, horizon_ms + 1) > horizon_ms:
            continue
        if epoch < owner_epoch:
            if epoch not in listing.seals:
                continue  # nothing vouches for it
            if epoch not in seals:
                return NeedSeal(epoch)
            if txid > seals[epoch]:
                continue  # a fenced owner's late snapshot
        return SnapshotRef(txid, epoch, key)
    return None
