"""The runtime's socket tables in a cell's own database.

``_cellactors_sockets`` holds the cell's open sockets: the node holding each, its tags, its
attachment and the caller that opened it. ``_cellactors_pushes`` holds the last pushes
(messages to sockets) the cell sent, numbered by one sequence, so that a holder that missed
some (a takeover, a client resuming elsewhere) gets them again. Both are written by the
runtime inside a transaction of the cell, like the outbox: a socket is open, and a push
exists, exactly when the transaction that did it is durable. A push leaves the owner once
that transaction is acknowledged (the replicator hands it on); the tables are what a new
owner, or a sync, reads back.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from cellactors.core import principal, sockets
from cellactors.core.principal import Principal
from cellactors.core.sockets import Holder, Push
from cellactors.persistence.celldb import calls

SOCKETS_TABLE = "_cellactors_sockets"
SOCKETS_SQL = (
    f"CREATE TABLE {SOCKETS_TABLE} ("
    "id TEXT PRIMARY KEY, "
    "holder TEXT NOT NULL, "
    "tags TEXT NOT NULL, "
    "attachment BLOB NOT NULL, "
    "caller TEXT NOT NULL, "
    "kind TEXT NOT NULL, "
    "opened_ms INTEGER NOT NULL, "
    "since INTEGER NOT NULL)"
)
PUSHES_TABLE = "_cellactors_pushes"
PUSHES_SQL = (
    f"CREATE TABLE {PUSHES_TABLE} ("
    "seq INTEGER PRIMARY KEY, "
    "target TEXT NOT NULL, "
    "kind TEXT NOT NULL, "
    "data BLOB NOT NULL, "
    "code INTEGER NOT NULL)"
)
#: The socket tables with the exact SQL that creates them.
SOCKET_SQL = {SOCKETS_TABLE: SOCKETS_SQL, PUSHES_TABLE: PUSHES_SQL}

#: Whom a push goes to, as stored: every socket, the sockets with a tag, or one socket.
ALL = "*"
_TAG, _CONN = "tag:", "conn:"


@dataclass
class SocketRow:
    """One open socket of the cell."""

    id: str
    holder: Holder
    tags: tuple[str, ...]
    attachment: Any
    caller: Principal | None
    kind: str
    opened_ms: int
    #: The last push sent before the socket opened: nothing up to it is ever its.
    since: int = 0


def target_of(tag: str | None = None, conn: str | None = None) -> str:
    """The stored target of a push: one socket, the sockets with ``tag``, or all."""
    if conn is not None:
        return _CONN + conn
    return ALL if tag is None else _TAG + tag


def _matches(target: str, row: SocketRow) -> bool:
    if target == ALL:
        return True
    if target.startswith(_CONN):
        return row.id == target[len(_CONN) :]
    return target[len(_TAG) :] in row.tags


def table_exists(conn: sqlite3.Connection, table: str) -> bool:
    """Whether the cell's database has ``table`` (a runtime table exists from its first use)."""
    return (
        conn.execute(
            "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        is not None
    )


@dataclass
class SocketTables:
    """The sockets and pushes of one cell, over its connection (the cell's thread only).

    ``sent`` collects the pushes of the current transaction (with the holders of their
    sockets resolved) for the replicator to hand on once it is durable; the cell clears it
    at the start of every transaction.

    The sockets are read once and kept (a broadcast to a thousand sockets must not decode a
    thousand rows): only the runtime writes the table, through these methods, which keep the
    copy in step; a transaction that rolls back makes it :meth:`forget` them."""

    conn: sqlite3.Connection
    sent: list[tuple[Push, dict[str, Holder]]] = field(default_factory=list)
    _known: dict[str, SocketRow] | None = None

    def forget(self) -> None:
        """Drop the copy of the sockets (the transaction that changed them rolled back)."""
        self._known = None

    def _ensure(self, table: str) -> None:
        if not table_exists(self.conn, table):
            self.conn.execute(SOCKET_SQL[table])

    # --- sockets ------------------------------------------------------------------------

    def add(self, row: SocketRow) -> None:
        self._ensure(SOCKETS_TABLE)
        self.conn.execute(
            f"INSERT INTO main.{SOCKETS_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                json.dumps(row.holder.to_wire()),
                json.dumps(list(row.tags)),
                calls.encode(row.attachment),
                principal.encode(row.caller),
                row.kind,
                row.opened_ms,
                row.since,
            ),
        )
        self._sockets()[row.id] = row

    def _sockets(self) -> dict[str, SocketRow]:
        if self._known is None:
            self._known = {row.id: row for row in self._read()}
        return self._known

    def _rows(self) -> list[SocketRow]:
        return list(self._sockets().values())

    def _read(self) -> list[SocketRow]:
        if not table_exists(self.conn, SOCKETS_TABLE):
            return []
        found = self.conn.execute(
            "SELECT id, holder, tags, attachment, caller, kind, opened_ms, since "
            f"FROM main.{SOCKETS_TABLE} ORDER BY opened_ms, id"
        ).fetchall()
        return [
            SocketRow(
                str(r[0]),
                Holder.from_wire(json.loads(r[1])),
                tuple(json.loads(r[2])),
                calls.decode(r[3]),
                principal.decode(str(r[4])),
                str(r[5]),
                int(r[6]),
                int(r[7]),
            )
            for r in found
        ]

    def get(self, conn_id: str) -> SocketRow | None:
        return self._sockets().get(conn_id)

    def all(self, tag: str | None = None) -> list[SocketRow]:
        rows = self._rows()
        return rows if tag is None else [r for r in rows if tag in r.tags]

    def held_by(self, node: str) -> list[SocketRow]:
        return [r for r in self._rows() if r.holder.node == node]

    def update(self, row: SocketRow) -> None:
        """Write back a socket's holder, tags and attachment."""
        self.conn.execute(
            f"UPDATE main.{SOCKETS_TABLE} SET holder = ?, tags = ?, attachment = ? WHERE id = ?",
            (
                json.dumps(row.holder.to_wire()),
                json.dumps(list(row.tags)),
                calls.encode(row.attachment),
                row.id,
            ),
        )
        known = self._sockets()
        if row.id in known:
            known[row.id] = row

    def remove(self, conn_id: str) -> bool:
        if not table_exists(self.conn, SOCKETS_TABLE):
            return False
        cur = self.conn.execute(f"DELETE FROM main.{SOCKETS_TABLE} WHERE id = ?", (conn_id,))
        self._sockets().pop(conn_id, None)
        return cur.rowcount > 0

    # --- pushes -------------------------------------------------------------------------

    def head(self) -> int:
        """The number of the last push sent (0: none yet)."""
        if not table_exists(self.conn, PUSHES_TABLE):
            return 0
        row = self.conn.execute(f"SELECT MAX(seq) FROM main.{PUSHES_TABLE}").fetchone()
        return int(row[0] or 0)

    def floor(self) -> int:
        """The oldest push retained, or 0 when none was ever dropped (all are kept)."""
        if not table_exists(self.conn, PUSHES_TABLE):
            return 0
        row = self.conn.execute(f"SELECT MIN(seq) FROM main.{PUSHES_TABLE}").fetchone()
        low = int(row[0] or 0)
        return 0 if low <= 1 else low

    def push(
        self, target: str, kind: str, data: str | bytes, code: int = sockets.CLOSE_NORMAL
    ) -> Push | None:
        """Record a push to the sockets ``target`` names now (none: nothing is recorded);
        the oldest beyond the retained count are dropped in the same transaction."""
        if target.startswith(_CONN):
            one = self.get(target[len(_CONN) :])
            rows = [] if one is None else [one]
        else:
            rows = [r for r in self._rows() if _matches(target, r)]
        if not rows:
            return None
        self._ensure(PUSHES_TABLE)
        seq = self.head() + 1
        self.conn.execute(
            f"INSERT INTO main.{PUSHES_TABLE} VALUES (?, ?, ?, ?, ?)",
            (seq, target, kind, data, code),
        )
        self.conn.execute(
            f"DELETE FROM main.{PUSHES_TABLE} WHERE seq < ?", (sockets.retained_from(seq),)
        )
        sent = Push(seq, tuple(r.id for r in rows), kind, data, code)
        self.sent.append((sent, {r.id: r.holder for r in rows}))
        return sent

    def pushes_for(
        self, rows: list[SocketRow], after: int, closed: tuple[str, ...] = ()
    ) -> list[Push]:
        """The retained pushes after ``after`` to any of ``rows``, each naming those of
        ``rows`` its target matches now and that were open when it was sent; and the close
        the cell sent each socket of ``closed`` (gone from the table since), if retained."""
        if not table_exists(self.conn, PUSHES_TABLE) or not (rows or closed):
            return []
        found = self.conn.execute(
            f"SELECT seq, target, kind, data, code FROM main.{PUSHES_TABLE} "
            "WHERE seq > ? ORDER BY seq",
            (after,),
        ).fetchall()
        closes = {target_of(conn=c): c for c in closed}
        out = []
        for seq, target, kind, data, code in found:
            conns = tuple(r.id for r in rows if r.since < seq and _matches(str(target), r))
            if kind == sockets.CLOSE and target in closes:
                conns = (closes[target],)
            if conns:
                out.append(Push(int(seq), conns, str(kind), data, int(code)))
        return out
