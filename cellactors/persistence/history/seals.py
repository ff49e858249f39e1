"""Epoch seals: ``e<epoch>.seal.json``, created once by the first restore past an epoch
(a conditional create), naming the last txid of that epoch's history. A lost race raises
:class:`~cellactors.errors.SealLost`: the activation fails and the next one reads the seal."""

from __future__ import annotations

from cellactors.core import keys
from cellactors.errors import AmbiguousWrite, BucketError, SealLost
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Absent, Applied, Bucket


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
