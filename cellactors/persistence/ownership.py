"""The ownership store: ``cells/<cell>/own.json`` read and written with conditional writes.

The record is ``{"node": N, "epoch": E}``; a released cell keeps its epoch with an empty node.
The epoch only grows, so the body never repeats and a stale ETag cannot match again (ABA).
"""

from __future__ import annotations

from cellactors.core.types import OwnerRecord
from cellactors.persistence import keys, records
from cellactors.persistence.bucket import Bucket, CasResult, Guard, Match, Rejected

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
        return OwnerRecord(node=value["node"], epoch=value["epoch"], token=obj.token)

    def cas_owner(self, cell_id: str, guard: Guard, epoch: int) -> CasResult:
        """Write ``{this node, epoch}`` if ``guard`` holds."""
        body = records.encode({"node": self.node, "epoch": epoch})
        return self.bucket.put_cas(keys.owner_key(cell_id), body, guard)

    def release_owner(self, cell_id: str, epoch: int) -> CasResult:
        """Release the cell if the record still names this node at ``epoch``.

        Returns Rejected (and writes nothing) when someone else owns the cell now.
        """
        current = self.read_owner(cell_id)
        if current is None or current.node != self.node or current.epoch != epoch:
            return Rejected("not owner")
        body = records.encode({"node": "", "epoch": epoch})
        return self.bucket.put_cas(keys.owner_key(cell_id), body, Match(current.token))
