"""The ownership store: ``cells/<cell>/own.json`` read and written with conditional writes.

The record is ``{"node": N, "epoch": E, "acked_txid": T}``; a released cell keeps its epoch
with an empty node. ``acked_txid`` is the highest txid known acknowledged when the record was
written: a release writes what its activation acknowledged, a claim carries the previous
record's forward, so that no later restore seals or opens below it (however far the store's
listings lag). The epoch only grows, and an epoch is claimed once and released at most once,
so the body never repeats and a stale ETag cannot match again (ABA).
"""

from __future__ import annotations

from cellactors.core import acquire, keys
from cellactors.core.types import OwnerRecord
from cellactors.errors import BucketError
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Bucket, CasResult, Guard, Match, Rejected

__all__ = ["OwnerRecord", "OwnershipStore"]


class OwnershipStore:
    """Reads and conditionally writes ownership records on behalf of one node."""

    def __init__(self, bucket: Bucket, node_id: str) -> None:
        self.bucket = bucket
        self.node = keys.validate_node_id(node_id)

    def read_owner(self, cell_id: str) -> OwnerRecord | None:
        key = keys.owner_key(cell_id)
        obj = self.bucket.get(key)
        if obj is None:
            return None
        value = records.decode(key, obj.body, {"node": str, "epoch": int})
        acked = value.get("acked_txid", 0)
        if not isinstance(acked, int) or isinstance(acked, bool) or acked < 0:
            raise BucketError(f"{key}: acked_txid is not a txid: {acked!r}")
        purging = value.get("purging", False) is True
        return OwnerRecord(value["node"], value["epoch"], obj.token, acked, purging)

    def cas_owner(self, cell_id: str, guard: Guard, epoch: int, acked_txid: int = 0) -> CasResult:
        """Write ``{this node, epoch, acked_txid}`` if ``guard`` holds (``acked_txid``: the
        claim's floor, carried forward from the record it replaces)."""
        body = records.encode({"node": self.node, "epoch": epoch, "acked_txid": acked_txid})
        return self.bucket.put_cas(keys.owner_key(cell_id), body, guard)

    def mark_purging(self, cell_id: str, record: OwnerRecord) -> tuple[int, CasResult]:
        """Fence the cell for a purge: write ``{"node": "", epoch + 1, purging}`` over
        ``record`` (guarded by its token). The owner's next re-read no longer names it, and
        no activation claims a purging record. Returns the new epoch and the write's result."""
        epoch = record.epoch + 1
        body = records.encode(
            {"node": "", "epoch": epoch, "acked_txid": record.acked_txid, "purging": True}
        )
        return epoch, self.bucket.put_cas(keys.owner_key(cell_id), body, Match(record.token))

    def release_owner(self, cell_id: str, epoch: int, acked_txid: int) -> CasResult:
        """Release the cell if the record still names this node at ``epoch``, recording
        ``acked_txid``, the highest txid this activation acknowledged (the next owner's
        floor: :class:`~cellactors.core.acquire.Claim`).

        Returns Rejected (and writes nothing) when someone else owns the cell now.
        """
        current = self.read_owner(cell_id)
        if current is None or not acquire.names(current, self.node, epoch):
            return Rejected("not owner")
        body = records.encode({"node": "", "epoch": epoch, "acked_txid": acked_txid})
        return self.bucket.put_cas(keys.owner_key(cell_id), body, Match(current.token))
