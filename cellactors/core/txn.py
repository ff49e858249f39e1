"""One committed transaction of a cell as it is replicated: its txid, its row images (or a
whole-database image when it changed the schema), its commit time, and for a rollback in
place the txid it went back to. The local database
produces it, the replicator ships it in batches, a restore and the feed read it back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Txn:
    """One committed transaction as replicated."""

    txid: int
    rows: list[tuple[str, list[Any], list[Any] | None]] = field(default_factory=list)
    columns: dict[str, list[str]] = field(default_factory=dict)
    sequence: list[list[Any]] | None = None
    image: bytes | None = None
    ts_ms: int = 0
    #: A rollback in place (``cellactors rollback``): (the txid whose state it restored, the
    #: txid before it, to roll forward to again). None for every other transaction.
    rollback: tuple[int, int] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "txid": self.txid,
            "ts": self.ts_ms,
            "rows": [[t, k, r] for t, k, r in self.rows],
            "cols": self.columns,
            "seq": self.sequence,
            "image": self.image,
        }
        if self.rollback is not None:  # absent otherwise: older readers ignore the key
            wire["rb"] = list(self.rollback)
        return wire

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Txn:
        return cls(
            txid=int(value["txid"]),
            rows=[(str(t), list(k), None if r is None else list(r)) for t, k, r in value["rows"]],
            columns={str(k): list(v) for k, v in value["cols"].items()},
            sequence=value.get("seq"),
            image=value.get("image"),
            ts_ms=int(value.get("ts", 0)),
            rollback=_rollback(value.get("rb")),
        )


def _rollback(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    to_txid, undo_txid = value
    return int(to_txid), int(undo_txid)
