"""The change feed's records (docs/feed.md): one :class:`Change` per acknowledged
transaction, with a :class:`RowChange` per row written or deleted.

Plain data with their wire form, and the error for history that was collected, shared by
the bucket reader (:mod:`cellactors.persistence.history.feed`), point-in-time restore, the HTTP
route and the client, which must not pull in the runtime to decode them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RowChange:
    """One row a transaction wrote (``row``: column -> value) or deleted (``row`` None).
    ``key`` is the row's rowid, or its primary key values for a WITHOUT ROWID table."""

    table: str
    key: list[Any]
    row: dict[str, Any] | None

    @property
    def deleted(self) -> bool:
        return self.row is None

    def to_wire(self) -> dict[str, Any]:
        if self.row is None:
            return {"table": self.table, "key": self.key, "deleted": True}
        return {"table": self.table, "key": self.key, "row": self.row}


@dataclass(frozen=True)
class Change:
    """One acknowledged transaction of a cell, as the feed returns it.

    A transaction that changed the schema shipped a whole-database image: ``schema_change``
    is True, and ``rows`` holds the rows of the tables it created or left unchanged (restore
    the cell at that txid to see the rest, ``cellactors restore --at-txid``)."""

    txid: int
    epoch: int
    ts_ms: int
    rows: tuple[RowChange, ...] = ()
    schema_change: bool = False
    sequence: list[list[Any]] | None = field(default=None, compare=False)
    #: A rollback in place: (the txid whose state it restored, the txid to roll back to in
    #: order to undo it); None for every other transaction.
    rollback: tuple[int, int] | None = None

    @property
    def time(self) -> str:
        """The commit time (the owner's clock) in ISO 8601, UTC."""
        stamp = datetime.datetime.fromtimestamp(self.ts_ms / 1000, datetime.timezone.utc)
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def to_wire(self) -> dict[str, Any]:
        """The feed's wire record (one NDJSON line or msgpack object)."""
        return {
            "txid": self.txid,
            "epoch": self.epoch,
            "ts": self.ts_ms,
            "time": self.time,
            "schema_change": self.schema_change,
            "changes": [row.to_wire() for row in self.rows],
            **self._rollback_wire(),
        }

    def _rollback_wire(self) -> dict[str, Any]:
        if self.rollback is None:
            return {}
        to_txid, undo_txid = self.rollback
        return {"rollback": {"to_txid": to_txid, "undo_txid": undo_txid}}

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Change:
        rows = tuple(
            RowChange(str(r["table"]), list(r["key"]), None if r.get("deleted") else r["row"])
            for r in value.get("changes", [])
        )
        return cls(
            txid=int(value["txid"]),
            epoch=int(value["epoch"]),
            ts_ms=int(value["ts"]),
            rows=rows,
            schema_change=bool(value.get("schema_change", False)),
            rollback=_rollback(value.get("rollback")),
        )


def _rollback(value: Any) -> tuple[int, int] | None:
    if not isinstance(value, dict):
        return None
    return int(value["to_txid"]), int(value["undo_txid"])
