"""Row-level change capture for a cell's SQLite database, and its replay.

Capture uses TEMP triggers and a TEMP table, so nothing of the mechanism lives in the user's
database file: snapshots and restores compare equal schema-for-schema. The triggers record
only the *key* of every row touched (rowid, or the primary key of a WITHOUT ROWID table);
at commit time the final row values are read back inside the same transaction. That makes
capture exact for non-deterministic SQL (``random()``, ``CURRENT_TIMESTAMP``), BLOBs and
NULLs, independent of column changes, and lets replay be idempotent: a key whose row exists
at commit becomes an ``INSERT OR REPLACE`` of the whole row, a key whose row is gone becomes a
``DELETE``.

A transaction that changes the schema (``PRAGMA schema_version`` moved) ships a whole-database
image, which replay loads instead of rows; the caller takes it after commit with
:func:`database_image`. Its rows ship beside it for the change feed alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sqlite3
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from cellactors.errors import UnsupportedSchema

CHANGES_TABLE = "temp._cellactors_changes"
_CHANGES_IN_TRIGGER = "_cellactors_changes"  # trigger bodies may not qualify names
TRIGGER_PREFIX = "_cellactors_cap_"
MAX_KEY_COLUMNS = 8
_KEY_COLS = [f"k{i}" for i in range(MAX_KEY_COLUMNS)]
_WITHOUT_ROWID = re.compile(r"\)\s*WITHOUT\s+ROWID\s*;?\s*$", re.IGNORECASE)


def quote(name: str) -> str:
    """Quote an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class TableShape:
    """What capture and replay need to know about one table."""

    name: str
    rowid: bool
    key_cols: tuple[str, ...]  # ("rowid",) for rowid tables
    columns: tuple[str, ...]  # insertable (non-generated) columns, rowid first for rowid tables


@dataclass
class TxnChanges:
    """The net effect of one transaction: final row images by key, or a database image."""

    rows: list[tuple[str, list[Any], list[Any] | None]] = field(default_factory=list)
    columns: dict[str, list[str]] = field(default_factory=dict)
    sequence: list[list[Any]] | None = None
    schema_changed: bool = False

    @property
    def empty(self) -> bool:
        return not self.rows and self.sequence is None and not self.schema_changed


def user_tables(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(name, sql) of every table in ``main`` that capture covers."""
    rows = conn.execute(
        "SELECT name, sql FROM main.sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
    ).fetchall()
    return [(str(n), str(s or "")) for n, s in rows]


def table_shape(conn: sqlite3.Connection, name: str, sql: str) -> TableShape:
    if sql.upper().startswith("CREATE VIRTUAL TABLE"):
        raise UnsupportedSchema(
            f"table {name!r} is a virtual table; cellactors cannot replicate virtual tables"
        )
    info = conn.execute(f"PRAGMA main.table_xinfo({quote(name)})").fetchall()
    # table_xinfo: cid, name, type, notnull, dflt, pk, hidden (2, 3 = generated)
    cols = [str(r[1]) for r in info if r[6] not in (2, 3)]
    rowid = not _WITHOUT_ROWID.search(sql)
    if rowid:
        return TableShape(name, True, ("rowid",), ("rowid", *cols))
    pk = [str(r[1]) for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    if len(pk) > MAX_KEY_COLUMNS:
        raise UnsupportedSchema(
            f"table {name!r} has a primary key of {len(pk)} columns; at most "
            f"{MAX_KEY_COLUMNS} are supported"
        )
    return TableShape(name, False, tuple(pk), tuple(cols))


def install(conn: sqlite3.Connection) -> dict[str, TableShape]:
    """(Re)create the temp capture table and triggers for every user table.

    Called at activation and after every transaction that changed the schema. Raises
    :class:`UnsupportedSchema` for tables capture cannot handle.
    """
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {CHANGES_TABLE} "
        f"(seq INTEGER PRIMARY KEY, tbl TEXT NOT NULL, {', '.join(_KEY_COLS)})"
    )
    uninstall(conn)
    shapes: dict[str, TableShape] = {}
    for index, (name, sql) in enumerate(user_tables(conn)):
        shape = table_shape(conn, name, sql)
        shapes[name] = shape
        for event, images in (
            ("INSERT", ("NEW",)),
            ("UPDATE", ("OLD", "NEW")),
            ("DELETE", ("OLD",)),
        ):
            targets = ", ".join(_KEY_COLS[: len(shape.key_cols)])
            inserts = " ".join(
                f"INSERT INTO {_CHANGES_IN_TRIGGER} (tbl, {targets}) VALUES "
                f"({_sql_literal(name)}, {', '.join(f'{img}.{quote(k)}' for k in shape.key_cols)});"
                for img in images
            )
            conn.execute(
                f"CREATE TEMP TRIGGER {quote(f'{TRIGGER_PREFIX}{index}_{event.lower()}')} "
                f"AFTER {event} ON main.{quote(name)} BEGIN {inserts} END"
            )
    return shapes


def uninstall(conn: sqlite3.Connection) -> None:
    """Drop the capture triggers (before the main schema is replaced wholesale)."""
    for (trig,) in conn.execute(
        "SELECT name FROM temp.sqlite_master WHERE type = 'trigger' AND name LIKE ?",
        (TRIGGER_PREFIX + "%",),
    ).fetchall():
        conn.execute(f"DROP TRIGGER IF EXISTS temp.{quote(trig)}")


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA main.schema_version").fetchone()[0])


def read_header(conn: sqlite3.Connection) -> tuple[int, int]:
    """The header values user code may set: (user_version, application_id)."""
    version = conn.execute("PRAGMA main.user_version").fetchone()[0]
    app = conn.execute("PRAGMA main.application_id").fetchone()[0]
    return int(version), int(app)


def read_sequence(conn: sqlite3.Connection) -> list[list[Any]] | None:
    """Contents of ``sqlite_sequence`` (AUTOINCREMENT counters), or None if absent."""
    exists = conn.execute(
        "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'"
    ).fetchone()
    if not exists:
        return None
    return [
        list(r) for r in conn.execute("SELECT name, seq FROM main.sqlite_sequence ORDER BY name")
    ]


def pending(conn: sqlite3.Connection) -> bool:
    """Whether the open transaction has touched any captured row so far."""
    return conn.execute(f"SELECT 1 FROM {CHANGES_TABLE} LIMIT 1").fetchone() is not None


@functools.lru_cache(maxsize=4096)
def _row_query(shape: TableShape) -> str:
    """The query reading one row's final image by its key."""
    where = " AND ".join(f"{quote(k)} IS ?" for k in shape.key_cols)
    columns = ", ".join(quote(c) for c in shape.columns)
    return f"SELECT {columns} FROM main.{quote(shape.name)} WHERE {where}"


def collect(
    conn: sqlite3.Connection,
    shapes: dict[str, TableShape],
    schema_changed: bool,
    previous: dict[str, TableShape] | None = None,
) -> TxnChanges:
    """Turn the keys recorded in this transaction into final row images; clears the log.

    Must run inside the transaction, just before COMMIT. ``shapes`` are the tables now,
    ``previous`` those before the transaction (the same when omitted). A transaction that
    changed the schema ships an image for replay, but its rows still go to the change feed:
    the rows it touched of every table it left unchanged, and every row of every table it
    created (no trigger watched those: all of their rows are new). A table it altered shows
    no rows; the image has them.
    """
    result = TxnChanges(schema_changed=schema_changed)
    keys = conn.execute(
        f"SELECT tbl, {', '.join(_KEY_COLS)} FROM {CHANGES_TABLE} "
        f"GROUP BY tbl, {', '.join(_KEY_COLS)} ORDER BY MIN(seq)"
    ).fetchall()
    conn.execute(f"DELETE FROM {CHANGES_TABLE}")
    before = shapes if previous is None else previous
    for tbl, *raw_key in keys:
        shape = shapes.get(tbl)
        if shape is None or before.get(tbl) != shape:
            continue  # dropped or altered in this transaction: only the image has it
        key = list(raw_key[: len(shape.key_cols)])
        row = conn.execute(_row_query(shape), key).fetchone()
        result.columns.setdefault(tbl, list(shape.columns))
        result.rows.append((tbl, key, list(row) if row is not None else None))
    for name, shape in shapes.items():
        if name not in before:
            _collect_new_table(conn, shape, result)
    return result


def _collect_new_table(conn: sqlite3.Connection, shape: TableShape, into: TxnChanges) -> None:
    """Every row of a table created in this transaction, in key order."""
    keys = ", ".join(quote(k) for k in shape.key_cols)
    columns = ", ".join(quote(c) for c in shape.columns)
    width = len(shape.key_cols)
    query = f"SELECT {keys}, {columns} FROM main.{quote(shape.name)} ORDER BY {keys}"
    for row in conn.execute(query):
        into.columns.setdefault(shape.name, list(shape.columns))
        into.rows.append((shape.name, list(row[:width]), list(row[width:])))


def apply_rows(
    conn: sqlite3.Connection,
    rows: list[tuple[str, list[Any], list[Any] | None]],
    columns: dict[str, list[str]],
    sequence: list[list[Any]] | None,
) -> None:
    """Replay one transaction's row images. Runs inside the caller's transaction, with the
    user's triggers removed (see :func:`without_user_triggers`)."""
    key_cols: dict[str, tuple[str, ...]] = {}
    for tbl, _key, _row in rows:
        if tbl not in key_cols:
            sql = conn.execute(
                "SELECT sql FROM main.sqlite_master WHERE type='table' AND name=?", (tbl,)
            ).fetchone()
            key_cols[tbl] = table_shape(conn, tbl, str(sql[0] if sql else "")).key_cols
    for tbl, key, row in rows:
        if row is None:
            where = " AND ".join(f"{quote(k)} IS ?" for k in key_cols[tbl])
            conn.execute(f"DELETE FROM main.{quote(tbl)} WHERE {where}", key)
    for tbl, _key, row in rows:
        if row is not None:
            cols = columns[tbl]
            conn.execute(
                f"INSERT OR REPLACE INTO main.{quote(tbl)} ({', '.join(quote(c) for c in cols)}) "
                f"VALUES ({', '.join('?' for _ in cols)})",
                row,
            )
    if sequence is not None:
        conn.execute("DELETE FROM main.sqlite_sequence")
        conn.executemany("INSERT INTO main.sqlite_sequence (name, seq) VALUES (?, ?)", sequence)


class without_user_triggers:
    """Drop the user's triggers for a replay and recreate them after, so replayed rows do
    not fire side effects that are themselves already in the log."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.saved: list[tuple[str, str]] = []

    def __enter__(self) -> None:
        self.saved = [
            (str(n), str(s))
            for n, s in self.conn.execute(
                "SELECT name, sql FROM main.sqlite_master WHERE type = 'trigger'"
            ).fetchall()
        ]
        for name, _ in self.saved:
            self.conn.execute(f"DROP TRIGGER main.{quote(name)}")

    def __exit__(self, *exc: object) -> None:
        for _name, sql in self.saved:
            self.conn.execute(sql)


def database_image(conn: sqlite3.Connection) -> bytes:
    """A page-exact copy of ``main`` (rowids preserved, unlike VACUUM INTO): serialized in
    memory where SQLite can (Python 3.11+; a new cell's first write ships one, and a copy
    through a temporary file cost it a file, a backup and a read), else through a
    temporary file that is never synced (it is read back at once and deleted)."""
    if sys.version_info >= (3, 11) and hasattr(conn, "serialize"):
        with contextlib.suppress(sqlite3.OperationalError):  # an empty database has none
            return bytes(conn.serialize(name="main"))
    fd, path = tempfile.mkstemp(suffix=".db")
    os.close(fd)
    try:
        target = sqlite3.connect(path)
        try:
            target.execute("PRAGMA synchronous = OFF")
            target.execute("PRAGMA journal_mode = OFF")
            conn.backup(target)
        finally:
            target.close()
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)
