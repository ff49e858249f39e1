"""What user code may do to its cell's database, decided in SQLite's authorizer callback.

Refused, each with a reason the method's caller sees: what capture could not replicate
(virtual tables, ATTACH), explicit transaction control, pragmas that change how the file is
kept, writes to the runtime's own tables and names under the runtime's prefix, and any
write at all in a read-only method. Setting a header value (``user_version``,
``application_id``) is allowed and reported, so that the transaction ships a whole image.
"""

from __future__ import annotations

import sqlite3
import sys

from cellactors.errors import Refused
from cellactors.persistence.celldb.calls import RESERVED_PREFIX
from cellactors.persistence.celldb.runtime_tables import RUNTIME_SQL

_DENIED = {
    22: "explicit transaction control (BEGIN/COMMIT/ROLLBACK): each call is one transaction",
    24: "ATTACH: attached databases are not replicated",
    25: "DETACH: attached databases are not replicated",
    29: "CREATE VIRTUAL TABLE: virtual tables are not replicated",
    30: "DROP VIRTUAL TABLE: virtual tables are not replicated",
}

# Actions whose first argument is the table acted on: refused on the runtime's tables.
_WRITES = {
    9: "DELETE FROM",  # SQLITE_DELETE
    11: "DROP TABLE",  # SQLITE_DROP_TABLE
    18: "INSERT INTO",  # SQLITE_INSERT
    23: "UPDATE",  # SQLITE_UPDATE
}
# Actions whose second argument is the table: an index, trigger or ALTER on the runtime's
# tables is refused too (a trigger would run user SQL inside the runtime's writes).
_ON_TABLE = {
    1: "CREATE INDEX ON",  # SQLITE_CREATE_INDEX
    3: "CREATE INDEX ON",  # SQLITE_CREATE_TEMP_INDEX
    5: "CREATE TRIGGER ON",  # SQLITE_CREATE_TEMP_TRIGGER
    7: "CREATE TRIGGER ON",  # SQLITE_CREATE_TRIGGER
    26: "ALTER TABLE",  # SQLITE_ALTER_TABLE (arg1 is the schema name)
}
# Actions whose first argument names a new object: the runtime's prefix is reserved.
_CREATES = {1, 2, 3, 4, 5, 6, 7, 8}
# Everything that writes, refused outright to a read-only method: CREATE and DROP of any
# object (1-17), INSERT, UPDATE and DELETE, ALTER TABLE, REINDEX, ANALYZE, virtual tables.
_READ_ONLY_REFUSED = frozenset({*range(1, 19), 23, 26, 27, 28, 29, 30})
_PRAGMA = 19
# Pragmas a read-only method may run with an argument: they read (``PRAGMA table_info(t)``).
# Any other pragma given a value sets something (the file's header, the connection's or the
# process's settings) and is refused; without one, a pragma reads, except these.
_READING_PRAGMAS = frozenset(
    {
        "foreign_key_check",
        "foreign_key_list",
        "index_info",
        "index_list",
        "index_xinfo",
        "integrity_check",
        "quick_check",
        "table_info",
        "table_list",
        "table_xinfo",
    }
)
_ACTING_PRAGMAS = frozenset({"incremental_vacuum", "optimize", "shrink_memory", "wal_checkpoint"})
#: Pragmas whose value lives in the database file's header: set in a write method, they are
#: replicated (the transaction ships a whole image, as a schema change does).
_HEADER_PRAGMAS = frozenset({"user_version", "application_id"})
#: Pragmas user code may not set at all: the runtime owns the journal, and the schema cookie
#: and a writable schema bypass what capture and restore rely on.
_OWNED_PRAGMAS = {
    "journal_mode": "PRAGMA journal_mode: the runtime owns the database's journal",
    # A full database and a read-only one are faults of the node's storage: user code may
    # not fake them (and the settings would outlive the call, on the cell's connection).
    "max_page_count": "PRAGMA max_page_count: the runtime owns the database's size limit",
    "query_only": "PRAGMA query_only: the runtime owns whether the database is writable",
    "schema_version": "PRAGMA schema_version: setting the schema cookie corrupts replication",
    "writable_schema": "PRAGMA writable_schema: edits to sqlite_master are not replicated",
}


def _read_only_refusal(action: int, arg1: str | None, arg2: str | None) -> bool:
    """Whether a read-only method may not do ``action``: anything that writes or sets."""
    if action in _READ_ONLY_REFUSED:
        return True
    if action != _PRAGMA:
        return False
    name = (arg1 or "").lower()
    return name in _ACTING_PRAGMAS or (arg2 is not None and name not in _READING_PRAGMAS)


_RUNTIME_TABLES = frozenset(RUNTIME_SQL)


def allow_all(*_args: object) -> int:
    return sqlite3.SQLITE_OK


def clear(conn: sqlite3.Connection) -> None:
    """Remove the authorizer (Python 3.10 cannot take None; it would deny everything)."""
    if sys.version_info >= (3, 11):
        conn.set_authorizer(None)
    else:
        conn.set_authorizer(allow_all)


#: SQLite virtual-machine steps between two looks at a read's deadline.


def _runtime_refusal(action: int, arg1: str | None, arg2: str | None) -> str | None:
    """Why user code may not do ``action`` (None: it may): the runtime's tables are read-only
    to it, and names under the runtime's prefix are not its to create."""
    verb = _WRITES.get(action)
    if verb is not None and arg1 in _RUNTIME_TABLES:
        return f"{verb} {arg1}: the table is the runtime's (user code may only read it)"
    verb = _ON_TABLE.get(action)
    if verb is not None and arg2 in _RUNTIME_TABLES:
        return f"{verb} {arg2}: the table is the runtime's (user code may only read it)"
    if action in _CREATES and arg1 is not None and arg1.startswith(RESERVED_PREFIX):
        return f"the name {arg1!r}: names starting with {RESERVED_PREFIX!r} are the runtime's"
    return None


def check_reserved(conn: sqlite3.Connection) -> None:
    """After user DDL: no object of the user's bears the runtime's prefix or hangs off a
    runtime table (catches what the authorizer cannot see, e.g. a RENAME TO the prefix)."""
    found = conn.execute(
        "SELECT type, name, sql FROM main.sqlite_master "
        "WHERE substr(name, 1, ?) = ? OR substr(tbl_name, 1, ?) = ?",
        (len(RESERVED_PREFIX), RESERVED_PREFIX) * 2,
    ).fetchall()
    for kind, name, sql in found:
        ours = (kind == "table" and RUNTIME_SQL.get(str(name)) == sql) or (
            kind == "index" and sql is None and str(name).startswith("sqlite_autoindex_")
        )
        if not ours:
            raise Refused(
                f"refused: {kind} {name!r}: names starting with {RESERVED_PREFIX!r}, and the "
                "runtime's tables, are the runtime's"
            )


def decide(
    action: int, arg1: str | None, arg2: str | None, *, read_only: bool
) -> tuple[str | None, bool]:
    """Why user code may not do ``action`` (None: it may), and whether it sets a header
    value of the database."""
    if read_only and _read_only_refusal(action, arg1, arg2):
        return "a read-only method may not write", False
    header = False
    if action == _PRAGMA and arg2 is not None:  # a pragma that sets something
        name = (arg1 or "").lower()
        header = name in _HEADER_PRAGMAS
        reason = _OWNED_PRAGMAS.get(name)
    else:
        reason = _DENIED.get(action)
    if reason is None:
        reason = _runtime_refusal(action, arg1, arg2)
    return reason, header
