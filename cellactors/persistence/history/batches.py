"""Change batches: the msgpack objects under ``cells/<cell>/e<epoch>/<first>-<last>.batch``.

A batch holds consecutive transactions ``first..last`` of one epoch. Each transaction is
either row images (table, key, full row or ``None`` for a deletion) or, when it changed the
schema, a whole-database image. The batch objects double as the cell's event log.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from cellactors.core.txn import Txn
from cellactors.errors import BucketError

FORMAT_VERSION = 1


@dataclass
class Batch:
    cell_id: str
    epoch: int
    txns: list[Txn]

    @property
    def first(self) -> int:
        return self.txns[0].txid

    @property
    def last(self) -> int:
        return self.txns[-1].txid


def encode_batch(batch: Batch) -> bytes:
    if not batch.txns:
        raise ValueError("empty batch")
    ids = [t.txid for t in batch.txns]
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise ValueError(f"batch txids are not consecutive: {ids}")
    payload = {
        "v": FORMAT_VERSION,
        "cell": batch.cell_id,
        "epoch": batch.epoch,
        "txns": [t.to_wire() for t in batch.txns],
    }
    return bytes(msgpack.packb(payload, use_bin_type=True))


def decode_batch(key: str, body: bytes) -> Batch:
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if value.get("v") != FORMAT_VERSION:
            raise ValueError(f"unsupported batch version {value.get('v')!r}")
        return Batch(
            cell_id=str(value["cell"]),
            epoch=int(value["epoch"]),
            txns=[Txn.from_wire(t) for t in value["txns"]],
        )
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as err:
        raise BucketError(f"{key} is not a valid change batch: {err}") from err
