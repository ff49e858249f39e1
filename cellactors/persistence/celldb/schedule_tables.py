"""The runtime's schedules table in a cell's own database: ``_cellactors_schedules``.

One row per named schedule of the cell (``schedule(...)``): how it recurs (a
:class:`~cellactors.core.schedules.Spec` as JSON), when it is due (``due_ms``), when it
runs next (``at_ms``: its due time, or later while a failing run backs off), its failures in
a row, its payload (JSON) and the ``traceparent`` of the call that set it. Like the alarm
table, it is written by the runtime inside a transaction of the cell, so a schedule exists
exactly when the transaction that set it is durable; the table is created by its first use.

The cell's one wake entry covers the earliest ``at_ms`` of these rows and of its alarm
(:meth:`~cellactors.persistence.celldb.runtime_tables.RuntimeTables.state`): each row has a
nonce, renewed whenever its ``at_ms`` changes, which names the wake entry while it is the
earliest; rows due later cost no bucket request at all.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol

from cellactors.core.alarms import Wake
from cellactors.core.schedules import Spec
from cellactors.persistence.celldb.socket_tables import table_exists as _exists

SCHEDULE_TABLE = "_cellactors_schedules"
SCHEDULE_SQL = (
    f"CREATE TABLE {SCHEDULE_TABLE} ("
    "name TEXT PRIMARY KEY, "
    "spec TEXT NOT NULL, "
    "due_ms INTEGER NOT NULL, "
    "at_ms INTEGER NOT NULL, "
    "nonce TEXT NOT NULL, "
    "failures INTEGER NOT NULL, "
    "payload TEXT NOT NULL, "
    "trace TEXT NOT NULL)"
)
_COLUMNS = "name, spec, due_ms, at_ms, nonce, failures, payload, trace"


class Touched(Protocol):
    """Who is told that the current transaction changed the runtime's tables."""

    touched: bool


def encode_payload(payload: Any) -> str:
    """``payload`` as stored: JSON (TypeError/ValueError for anything JSON cannot hold)."""
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise TypeError(f"a schedule's payload must be JSON-able: {err}") from err


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as stored (times in epoch ms)."""

    name: str
    spec: Spec
    due_ms: int
    at_ms: int
    nonce: str
    failures: int
    payload: Any
    trace: str = ""

    @property
    def wake(self) -> Wake:
        return Wake(self.at_ms, self.nonce)


def _row(values: tuple[Any, ...]) -> ScheduleRow:
    name, spec, due, at, nonce, failures, payload, trace = values
    return ScheduleRow(
        str(name),
        Spec.from_dict(json.loads(spec)),
        int(due),
        int(at),
        str(nonce),
        int(failures),
        json.loads(payload),
        str(trace),
    )


class ScheduleTables:
    """The schedules of one cell, over its connection (the cell's thread only); every
    write marks ``owner.touched`` so the new wake state reaches the replicator."""

    def __init__(self, conn: sqlite3.Connection, owner: Touched) -> None:
        self.conn = conn
        self.owner = owner

    def put(
        self,
        name: str,
        spec: Spec,
        due_ms: int,
        payload: Any,
        trace: str = "",
        at_ms: int | None = None,
        failures: int = 0,
    ) -> ScheduleRow:
        """Set (or replace) schedule ``name``, running next at ``at_ms`` (default: when
        due), with a fresh nonce."""
        if not _exists(self.conn, SCHEDULE_TABLE):
            self.conn.execute(SCHEDULE_SQL)
        row = ScheduleRow(
            name,
            spec,
            due_ms,
            due_ms if at_ms is None else at_ms,
            secrets.token_hex(8),
            failures,
            payload,
            trace,
        )
        self.conn.execute(
            f"INSERT OR REPLACE INTO main.{SCHEDULE_TABLE} ({_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.name,
                json.dumps(spec.to_dict(), separators=(",", ":")),
                row.due_ms,
                row.at_ms,
                row.nonce,
                row.failures,
                encode_payload(payload),
                row.trace,
            ),
        )
        self.owner.touched = True
        return row

    def get(self, name: str) -> ScheduleRow | None:
        if not _exists(self.conn, SCHEDULE_TABLE):
            return None
        found = self.conn.execute(
            f"SELECT {_COLUMNS} FROM main.{SCHEDULE_TABLE} WHERE name = ?", (name,)
        ).fetchone()
        return None if found is None else _row(found)

    def all(self) -> list[ScheduleRow]:
        """Every schedule, the next to run first."""
        if not _exists(self.conn, SCHEDULE_TABLE):
            return []
        rows = self.conn.execute(
            f"SELECT {_COLUMNS} FROM main.{SCHEDULE_TABLE} ORDER BY at_ms, name"
        ).fetchall()
        return [_row(r) for r in rows]

    def first(self) -> ScheduleRow | None:
        """The schedule that runs next (ties: the least name), or None."""
        if not _exists(self.conn, SCHEDULE_TABLE):
            return None
        found = self.conn.execute(
            f"SELECT {_COLUMNS} FROM main.{SCHEDULE_TABLE} ORDER BY at_ms, name LIMIT 1"
        ).fetchone()
        return None if found is None else _row(found)

    def delete(self, name: str, nonce: str | None = None) -> bool:
        """Remove schedule ``name`` (only if it still has ``nonce``, when given)."""
        if not _exists(self.conn, SCHEDULE_TABLE):
            return False
        sql = f"DELETE FROM main.{SCHEDULE_TABLE} WHERE name = ?"
        if nonce is not None:
            gone = self.conn.execute(sql + " AND nonce = ?", (name, nonce)).rowcount
        else:
            gone = self.conn.execute(sql, (name,)).rowcount
        if gone:
            self.owner.touched = True
        return bool(gone)


__all__ = ["SCHEDULE_SQL", "SCHEDULE_TABLE", "ScheduleRow", "ScheduleTables", "encode_payload"]
