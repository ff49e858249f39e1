"""Rolling a cell's database back in place: make its user tables what they were at an
earlier txid, inside one transaction of the live cell (``cellactors rollback``).

Only the user's objects go back: tables, their rows, indexes, views, triggers, the
AUTOINCREMENT counters of the user's tables and the header values (``user_version``,
``application_id``). The runtime's tables stay as they are, so that the rollback undoes no
bookkeeping: a call already answered is still answered from its record (exactly once), a
delivered outbox message is not sent again, and the alarm and schedules set since stay set.

When the schema is the same at both points, only the rows that differ are written (the
change feed shows them, and no image is shipped unless the user's triggers had to be set
aside). Otherwise only the objects that differ are dropped and created (views and triggers
are always set aside and made again), the tables whose SQL did not change get only the rows
that differ, and the transaction ships a whole-database image like any schema change; the
feed lists the rows of the kept tables that changed and every row of the tables created.
"""

from __future__ import annotations

import math
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


def _counters(conn: sqlite3.Connection) -> dict[str, int]:
    """The AUTOINCREMENT counters of the user's tables."""
    return {
        str(name): int(seq)
        for name, seq in capture.read_sequence(conn) or []
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
    """Equal values of the same SQLite types (1 and 1.0 differ; so do a text and a blob,
    and 0.0 and -0.0, which SQLite keeps apart)."""
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _same(x: Any, y: Any) -> bool:
    if type(x) is not type(y) or x != y:
        return False
    return not isinstance(x, float) or math.copysign(1.0, x) == math.copysign(1.0, y)


def _differing_rows(
    conn: sqlite3.Connection, past: sqlite3.Connection, tables: list[tuple[str, str]]
) -> tuple[list[tuple[str, list[Any], list[Any] | None]], dict[str, list[str]]]:
    """The row images that turn ``conn``'s rows of ``tables`` (name, SQL: the same at both
    points) into ``past``'s."""
    rows: list[tuple[str, list[Any], list[Any] | None]] = []
    columns: dict[str, list[str]] = {}
    for name, sql in tables:
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


def _copy_rows(conn: sqlite3.Connection, past: sqlite3.Connection, name: str, sql: str) -> None:
    shape = capture.table_shape(past, name, sql)
    cols = ", ".join(capture.quote(c) for c in shape.columns)
    marks = ", ".join("?" for _ in shape.columns)
    conn.executemany(
        f"INSERT INTO main.{capture.quote(name)} ({cols}) VALUES ({marks})",
        past.execute(f"SELECT {cols} FROM main.{capture.quote(name)}"),
    )


def _rebuild(conn: sqlite3.Connection, past: sqlite3.Connection) -> None:
    """Make ``conn``'s schema ``past``'s, touching only what differs: views and triggers are
    set aside, tables (and indexes) whose SQL differs or that are gone are dropped, new ones
    created with ``past``'s rows; the tables whose SQL is the same at both points get only
    the rows that differ, through change capture (so the feed lists them)."""
    present, wanted = user_objects(conn), user_objects(past)
    for kind in ("trigger", "view"):
        for obj_kind, name, _sql in present:
            if obj_kind == kind:
                conn.execute(f"DROP {kind.upper()} main.{capture.quote(name)}")
    now_tables = {n: q for k, n, q in present if k == "table"}
    past_tables = {n: q for k, n, q in wanted if k == "table"}
    kept = [(n, q) for n, q in past_tables.items() if now_tables.get(n) == q]
    for name, sql in now_tables.items():
        if past_tables.get(name) != sql:
            conn.execute(f"DROP TABLE main.{capture.quote(name)}")
    past_indexes = {(n, q) for k, n, q in wanted if k == "index"}
    for kind, name, sql in user_objects(conn):  # what is left of the present
        if kind == "index" and (name, sql) not in past_indexes:
            conn.execute(f"DROP INDEX main.{capture.quote(name)}")
    for name, sql in past_tables.items():
        if now_tables.get(name) != sql:
            conn.execute(sql)
            _copy_rows(conn, past, name, sql)
    rows, columns = _differing_rows(conn, past, kept)
    if rows:
        capture.apply_rows(conn, rows, columns, None)
    left = set(user_objects(conn))
    for kind in _KINDS[1:]:  # indexes, views and triggers once the rows are in
        for obj in wanted:
            if obj[0] == kind and obj not in left:
                conn.execute(obj[2])


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
    if set(user_objects(conn)) == set(user_objects(past)):
        tables = [(n, q) for k, n, q in user_objects(conn) if k == "table"]
        rows, columns = _differing_rows(conn, past, tables)
        if rows:
            with capture.without_user_triggers(conn):
                capture.apply_rows(conn, rows, columns, None)
    else:
        _rebuild(conn, past)
    _set_counters(conn, _counters(past))
    version, app = capture.read_header(past)
    if capture.read_header(conn) != (version, app):
        conn.execute(f"PRAGMA main.user_version = {int(version)}")
        conn.execute(f"PRAGMA main.application_id = {int(app)}")
