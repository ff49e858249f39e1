"""The inspector's look into one cell: its tables and a page of rows, its alarm and
schedules, its undelivered outbox messages and dead letters, read through the cell's own
actor on this node (never by opening its file from outside) in a transaction that only
reads: every statement here is a fixed ``SELECT`` over names read from the cell's schema.

A cell that was never written is not created to be looked at: when it is not resident,
its ownership record is read first (one GET) and a missing one is answered 404.
"""

from __future__ import annotations

import base64
import sqlite3
from typing import Any, Protocol

from cellactors.actors.node.activations import Activations
from cellactors.actors.node.calls import CallRunner
from cellactors.actors.node.routes import RouteCache
from cellactors.core import keys
from cellactors.errors import BadRequest, UnknownCell
from cellactors.persistence.celldb.runtime_tables import RuntimeTables
from cellactors.persistence.control.ownership import OwnershipStore

#: Most rows one page may ask for, and the page size when it does not say.
MAX_ROWS = 200
DEFAULT_ROWS = 50
#: Most outbox messages shown.
MAX_MESSAGES = 50


class Inspected(Protocol):
    """What the cell view needs of a node (the node is one)."""

    @property
    def classes(self) -> dict[str, Any]: ...
    @property
    def runner(self) -> CallRunner: ...
    @property
    def routes(self) -> RouteCache: ...
    @property
    def ownership(self) -> OwnershipStore: ...
    @property
    def activations(self) -> Activations: ...


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _value(value: Any) -> Any:
    """A column value as JSON shows it: blobs as ``{"base64": ...}``."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def _tables(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        )
    ]
    return [
        {
            "name": n,
            "rows": int(conn.execute(f"SELECT count(*) FROM main.{_quote(n)}").fetchone()[0]),
        }
        for n in names
    ]


def _page(conn: sqlite3.Connection, table: str, offset: int, limit: int) -> dict[str, Any]:
    cursor = conn.execute(
        f"SELECT * FROM main.{_quote(table)} ORDER BY rowid LIMIT ? OFFSET ?", (limit + 1, offset)
    )
    columns = [d[0] for d in cursor.description]
    rows = [[_value(v) for v in row] for row in cursor.fetchall()]
    return {
        "name": table,
        "columns": columns,
        "offset": offset,
        "limit": limit,
        "rows": rows[:limit],
        "more": len(rows) > limit,
    }


def read_view(
    tables: RuntimeTables, table: str | None, offset: int, limit: int, next_txid: int
) -> dict[str, Any]:
    """Everything the cell view shows, read on the cell's connection (its thread) in the
    transaction that would commit as ``next_txid`` (it writes nothing, so it does not)."""
    conn = tables.conn
    listed = _tables(conn)
    chosen = table if table is not None else (listed[0]["name"] if listed else None)
    if chosen is not None and chosen not in {t["name"] for t in listed}:
        raise BadRequest(f"the cell has no table {chosen!r}")
    alarm = tables.alarm()
    return {
        "txid": next_txid - 1,
        "tables": listed,
        "table": None if chosen is None else _page(conn, chosen, offset, limit),
        "alarm": None if alarm is None else {"at_ms": alarm.at_ms, "failures": alarm.failures},
        "schedules": [
            {
                "name": s.name,
                "spec": s.spec.to_dict(),
                "due_ms": s.due_ms,
                "at_ms": s.at_ms,
                "failures": s.failures,
            }
            for s in tables.schedules.all()
        ],
        "outbox": [
            {"id": m.id, "target": m.target, "method": m.method, "txid": m.txid, "at_ms": m.at_ms}
            for m in tables.messages(MAX_MESSAGES)
        ],
        "dead_letters": [d.to_dict() for d in tables.dead_letters()],
    }


def cell_view(
    node: Inspected,
    cls_name: str,
    name: str,
    table: str | None = None,
    offset: int = 0,
    limit: int = DEFAULT_ROWS,
) -> dict[str, Any]:
    """The cell view of ``cls_name``/``name`` on this node (activating it here if no live
    peer owns it: :class:`~cellactors.errors.RemoteOwner` when one does)."""
    if cls_name not in node.classes:
        raise UnknownCell(f"no cell class {cls_name!r} is served here")
    if offset < 0 or not 1 <= limit <= MAX_ROWS:
        raise BadRequest(f"offset must be >= 0 and limit between 1 and {MAX_ROWS}")
    cell_id = keys.make_cell_id(cls_name, name)
    here = {cid for cid, _ in node.activations.resident()}
    here.update(cid for cid, _ in node.activations.dormant_since())
    if cell_id not in here and node.ownership.read_owner(cell_id) is None:
        raise UnknownCell(f"cell {cell_id} was never written")
    view: dict[str, Any] = node.runner.edit_runtime(
        cell_id, lambda tables, txid: read_view(tables, table, offset, limit, txid), node.routes
    )
    return {"cell": cell_id, "class": cls_name, "name": name, **view}
