"""The runtime's alarm and outbox tables in a cell's own database.

``_cellactors_alarm`` holds the cell's one alarm; ``_cellactors_outbox`` the messages of
``send`` not yet delivered. Both are written by the runtime inside the call's own
transaction, so they are captured like any row and ride in the same batch as the user's
writes: an alarm set, or a message sent, exists exactly when the transaction that set it is
durable. Each is created by its first use (that transaction is a schema change, so its
batch carries a database image); cells that never use them never have them. User SQL may
read them but not write them (:mod:`cellactors.persistence.celldb`).
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any

from cellactors.core.alarms import Pending, Wake, WakeState
from cellactors.persistence import calls

ALARM_TABLE = "_cellactors_alarm"
ALARM_SQL = (
    f"CREATE TABLE {ALARM_TABLE} ("
    "id INTEGER PRIMARY KEY CHECK (id = 1), "
    "at_ms INTEGER NOT NULL, "
    "nonce TEXT NOT NULL, "
    "failures INTEGER NOT NULL)"
)
OUTBOX_TABLE = "_cellactors_outbox"
OUTBOX_SQL = (
    f"CREATE TABLE {OUTBOX_TABLE} ("
    "seq INTEGER PRIMARY KEY, "
    "id TEXT NOT NULL UNIQUE, "
    "txid INTEGER NOT NULL, "
    "target TEXT NOT NULL, "
    "method TEXT NOT NULL, "
    "kwargs BLOB NOT NULL, "
    "at_ms INTEGER NOT NULL)"
)
#: Every runtime table with the exact SQL that creates it.
RUNTIME_SQL = {
    calls.CALLS_TABLE: calls.CALLS_SQL,
    ALARM_TABLE: ALARM_SQL,
    OUTBOX_TABLE: OUTBOX_SQL,
}


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        is not None
    )


@dataclass(frozen=True)
class AlarmRow:
    """The cell's alarm: due at ``at_ms``, ``failures`` failed runs in a row so far."""

    at_ms: int
    nonce: str
    failures: int

    @property
    def wake(self) -> Wake:
        return Wake(self.at_ms, self.nonce)


@dataclass(frozen=True)
class Message:
    """One undelivered outbox message."""

    seq: int
    id: str
    txid: int
    target: str
    method: str
    kwargs: dict[str, Any]

    @property
    def pending(self) -> Pending:
        return Pending(self.seq, self.target, self.txid)


class RuntimeTables:
    """The alarm and the outbox of one cell, over its connection (the cell's thread only).

    ``touched`` says whether the current transaction wrote either table, so the cell
    knows when to tell the replicator the new :class:`WakeState`; the cell clears it at
    the start of every transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.touched = False

    # --- alarm --------------------------------------------------------------------------

    def alarm(self) -> AlarmRow | None:
        if not _exists(self.conn, ALARM_TABLE):
            return None
        row = self.conn.execute(
            f"SELECT at_ms, nonce, failures FROM main.{ALARM_TABLE} WHERE id = 1"
        ).fetchone()
        return None if row is None else AlarmRow(int(row[0]), str(row[1]), int(row[2]))

    def set_alarm(self, at_ms: int, failures: int = 0) -> AlarmRow:
        """Replace the alarm (a fresh nonce every time: a new wake entry)."""
        if not _exists(self.conn, ALARM_TABLE):
            self.conn.execute(ALARM_SQL)
        row = AlarmRow(at_ms, secrets.token_hex(8), failures)
        self.conn.execute(
            f"INSERT OR REPLACE INTO main.{ALARM_TABLE} (id, at_ms, nonce, failures) "
            "VALUES (1, ?, ?, ?)",
            (row.at_ms, row.nonce, row.failures),
        )
        self.touched = True
        return row

    def delete_alarm(self, nonce: str | None = None) -> bool:
        """Remove the alarm (only if it still has ``nonce``, when given)."""
        if not _exists(self.conn, ALARM_TABLE):
            return False
        sql = f"DELETE FROM main.{ALARM_TABLE} WHERE id = 1"
        gone = (
            self.conn.execute(sql + " AND nonce = ?", (nonce,))
            if nonce is not None
            else self.conn.execute(sql)
        ).rowcount
        if gone:
            self.touched = True
        return bool(gone)

    # --- outbox -------------------------------------------------------------------------

    def add_message(
        self, txid: int, target: str, method: str, kwargs: dict[str, Any], now_ms: int
    ) -> str:
        """Record one message in the current transaction (committed as ``txid``), sent at
        ``now_ms`` (the runtime's clock); its id is the idempotency key of its delivery."""
        if not _exists(self.conn, OUTBOX_TABLE):
            self.conn.execute(OUTBOX_SQL)
        message_id = "outbox." + secrets.token_hex(16)
        self.conn.execute(
            f"INSERT INTO main.{OUTBOX_TABLE} (id, txid, target, method, kwargs, at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (message_id, txid, target, method, calls.encode(kwargs), now_ms),
        )
        self.touched = True
        return message_id

    def messages(self, limit: int = 256) -> list[Message]:
        if not _exists(self.conn, OUTBOX_TABLE):
            return []
        rows = self.conn.execute(
            f"SELECT seq, id, txid, target, method, kwargs FROM main.{OUTBOX_TABLE} "
            "ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            Message(int(s), str(i), int(t), str(c), str(m), calls.decode(bytes(k)))
            for s, i, t, c, m, k in rows
        ]

    def remove_messages(self, seqs: list[int]) -> None:
        if seqs and _exists(self.conn, OUTBOX_TABLE):
            self.conn.executemany(
                f"DELETE FROM main.{OUTBOX_TABLE} WHERE seq = ?", [(s,) for s in seqs]
            )
            self.touched = True

    def outbox_pending(self) -> bool:
        if not _exists(self.conn, OUTBOX_TABLE):
            return False
        found = self.conn.execute(f"SELECT 1 FROM main.{OUTBOX_TABLE} LIMIT 1").fetchone()
        return found is not None

    def state(self) -> WakeState:
        """What the wake entries must mirror now."""
        alarm = self.alarm()
        return WakeState(alarm.wake if alarm else None, self.outbox_pending())
