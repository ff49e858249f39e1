"""Rolling a cell's database back in place: make its user tables what they were at an
earlier txid, inside one transaction of the live cell (``cellactors rollback``).

Only the user's objects go back: tables, their rows, indexes, views, triggers, the
AUTOINCREMENT counters of the user's tables and the header values (``user_version``,
``application_id``). The runtime's tables stay as they are, so that the rollback undoes no
bookkeeping: a call already answered is still answered from its record (exactly once), a
delivered outbox message is not sent again, and the alarm and schedules set since stay set.

When the schema is the same at both points, only the rows that differ are written (the
change feed shows them, and no image is shipped unless the user's triggers had to be set
aside); otherwise every user object is dropped and rebuilt, and the transaction ships a
whole-database image like any schema change.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from cellactors.persistence.celldb import capture
from cellactors.persistence.celldb.calls import RESERVED_PREFIX

#: Order in which a schema's objects are created (dropped in the reverse order).
_KINDS = ("table", "index", "view", "trigger")


def user_objects(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """(type, name, sql) of every object of the user's in ``main``, in creation order: not
    SQLite's own, not the runtime's, not an index a constraint made (it has no SQL)."""
    rows = conn.execute(
        "SELECT type, name, sql FROM main.sqlite_master WHERE sql IS NOT NULL "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND substr(name, 1, ?) != ? "
        "AND substr(tbl_name, 1, ?) != ? ORDER BY rowid",
        (len(RESERVED_PREFIX), RESERVED_PREFIX) * 2,
    ).fetchall()
    return [(str(t), str(n), str(s)) for t, n, s in rows]


def _header(conn: sqlite3.Connection) -> tuple[int, int]:
    version = conn.execute("PRAGMA main.user_version").fetchone()[0]
    app = conn.execute("PRAGMA main.application_id").fetchone()[0]
    return int(version), int(app)


def _counters(conn: sqlite3.Connection) -> dict[str, int]:
    """The AUTOINCREMENT counters of the user's tables."""
    has = conn.execute(
        "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'"
    ).fetchone()
    if has is None:
        return {}
    return {
        str(name): int(seq)
        for name, seq in conn.execute("SELECT name, seq FROM main.sqlite_sequence")
        if not str(name).startswith(RESERVED_PREFIX)
    }


def _rows(conn: sqlite3.Connection, shape: capture.TableShape) -> dict[tuple[Any, ...], list[Any]]:
    """Every row of a table by its key (rowid, or primary key values)."""
    cols = ", ".join(capture.quote(c) for c in shape.columns)
    found: dict[tuple[Any, ...], list[Any]] = {}
    positions = [shape.columns.index(k) for k in shape.key_cols]
    for row in conn.execute(f"SELECT {cols} FROM main.{capture.quote(shape.name)}"):
        found[tuple(row[i] for i in positions)] = list(row)
    return found


def _same_value(a: list[Any], b: list[Any]) -> bool:
    """Equal values of the same SQLite types (1 and 1.0 differ; so do a text and a blob)."""
    return len(a) == len(b) and all(
        type(x) is type(y) and x == y for x, y in zip(a, b, strict=True)
    )


def _differing_rows(
    conn: sqlite3.Connection, past: sqlite3.Connection
) -> tuple[list[tuple[str, list[Any], list[Any] | None]], dict[str, list[str]]]:
    """The row images that turn ``conn``'s rows into ``past``'s (same schema at both)."""
    rows: list[tuple[str, list[Any], list[Any] | None]] = []
    columns: dict[str, list[str]] = {}
    for kind, name, sql in user_objects(conn):
        if kind != "table":
            continue
        shape = capture.table_shape(conn, name, sql)
        now, then = _rows(conn, shape), _rows(past, shape)
        columns[name] = list(shape.columns)
        rows.extend((name, list(key), None) for key in now if key not in then)
        rows.extend(
            (name, list(key), row)
            for key, row in then.items()
            if key not in now or not _same_value(now[key], row)
        )
    return rows, columns


def _rebuild(conn: sqlite3.Connection, past: sqlite3.Connection) -> None:
    """Drop every user object of ``conn`` and create ``past``'s, with its rows."""
    present = user_objects(conn)
    for kind in reversed(_KINDS):
        for obj_kind, name, _sql in present:
            if obj_kind == kind:
                conn.execute(f"DROP {kind.upper()} IF EXISTS main.{capture.quote(name)}")
    wanted = user_objects(past)
    for kind, name, sql in wanted:
        if kind != "table":
            continue
        conn.execute(sql)
        shape = capture.table_shape(past, name, sql)
        cols = ", ".join(capture.quote(c) for c in shape.columns)
        marks = ", ".join("?" for _ in shape.columns)
        conn.executemany(
            f"INSERT INTO main.{capture.quote(name)} ({cols}) VALUES ({marks})",
            past.execute(f"SELECT {cols} FROM main.{capture.quote(name)}"),
        )
    for kind in _KINDS[1:]:  # indexes, views and triggers once the rows are in
        for obj_kind, _name, sql in wanted:
            if obj_kind == kind:
                conn.execute(sql)


def _set_counters(conn: sqlite3.Connection, wanted: dict[str, int]) -> None:
    if _counters(conn) == wanted:
        return
    conn.execute(
        "DELETE FROM main.sqlite_sequence WHERE substr(name, 1, ?) != ?",
        (len(RESERVED_PREFIX), RESERVED_PREFIX),
    )
    conn.executemany("INSERT INTO main.sqlite_sequence (name, seq) VALUES (?, ?)", wanted.items())


def restore_user_state(conn: sqlite3.Connection, past: sqlite3.Connection) -> None:
    """Inside the caller's transaction on ``conn``: make its user objects, rows, counters and
    header values ``past``'s (see the module); the runtime's tables are left alone."""
    conn.execute("PRAGMA defer_foreign_keys = ON")  # the end state is past's: consistent
    if user_objects(conn) == user_objects(past):
        rows, columns = _differing_rows(conn, past)
        if rows:
            with capture.without_user_triggers(conn):
                capture.apply_rows(conn, rows, columns, None)
    else:
        _rebuild(conn, past)
    _set_counters(conn, _counters(past))
    version, app = _header(past)
    if _header(conn) != (version, app):
        conn.execute(f"PRAGMA main.user_version = {int(version)}")
        conn.execute(f"PRAGMA main.application_id = {int(app)}")
