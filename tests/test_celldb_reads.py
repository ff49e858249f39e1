"""A cell's transaction discipline on reads: a call that writes nothing runs no capture work
(the statement count is exact), and every kind of write still takes the capture path."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellactors.persistence.celldb.database import CellDatabase


@pytest.fixture
def db(tmp_path: Path) -> Iterator[CellDatabase]:
    cell = CellDatabase(tmp_path / "c.db")
    cell.run(lambda: cell.conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)"))
    cell.run(lambda: cell.conn.execute("INSERT INTO t VALUES ('a', 1)"))
    yield cell
    cell.close()


def traced(db: CellDatabase) -> list[str]:
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    return statements


def run_sql(db: CellDatabase, statement: str) -> list[Any]:
    return db.conn.execute(statement).fetchall()


def read(db: CellDatabase) -> int:
    return int(db.conn.execute("SELECT v FROM t WHERE k = 'a'").fetchone()[0])


def test_a_read_runs_four_statements_and_ships_nothing(db: CellDatabase) -> None:
    statements = traced(db)
    result, changes = db.run(lambda: read(db))
    assert result == 1 and changes.empty
    assert statements == [
        "BEGIN IMMEDIATE",
        "SELECT v FROM t WHERE k = 'a'",
        "PRAGMA main.schema_version",
        "COMMIT",
    ]


def test_a_read_whose_result_is_refused_rolls_back(db: CellDatabase) -> None:
    def refuse(_result: int) -> None:
        raise ValueError("not encodable")

    with pytest.raises(ValueError):
        db.run(lambda: read(db), check=refuse)
    assert not db.conn.in_transaction


@pytest.mark.parametrize(
    "sql, rows",
    [
        # (table, key, row image): t is a rowid table, keyed and imaged with its rowid.
        ("UPDATE t SET v = 2 WHERE k = 'a'", [("t", [1], [1, "a", 2])]),
        ("DELETE FROM t WHERE k = 'a'", [("t", [1], None)]),
        ("INSERT INTO t VALUES ('b', 3)", [("t", [2], [2, "b", 3])]),
        # A write undone in the same call still takes the capture path (net: the old row).
        ("UPDATE t SET v = v + 1; UPDATE t SET v = v - 1", [("t", [1], [1, "a", 1])]),
    ],
)
def test_every_write_is_captured(db: CellDatabase, sql: str, rows: list[object]) -> None:
    def write() -> None:
        for statement in sql.split("; "):
            db.conn.execute(statement)

    _result, changes = db.run(write)
    assert changes.rows == rows


def test_a_write_that_only_moves_an_autoincrement_counter_ships_it(db: CellDatabase) -> None:
    db.run(lambda: db.conn.execute("CREATE TABLE s (id INTEGER PRIMARY KEY AUTOINCREMENT)"))

    def insert_and_delete() -> None:
        db.conn.execute("INSERT INTO s DEFAULT VALUES")
        db.conn.execute("DELETE FROM s")

    _result, changes = db.run(insert_and_delete)
    assert changes.sequence == [["s", 1]]
    assert not changes.empty


def test_a_schema_change_is_not_a_read(db: CellDatabase) -> None:
    _result, changes = db.run(lambda: db.conn.execute("CREATE INDEX ix ON t (v)") and None)
    assert changes.schema_changed


def test_an_open_cell_database_holds_one_file_descriptor(tmp_path: Path) -> None:
    """The journal and temp tables (the capture log) live in memory: a write, a read and a
    schema change leave each cell with its database file open and nothing else."""

    def open_files() -> list[str]:
        """What this process's descriptors under ``tmp_path`` point at."""
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:
                continue  # the descriptor listdir itself used
            if target.startswith(str(tmp_path)) or "(deleted)" in target:
                found.append(target)
        return sorted(found)

    before = open_files()  # e.g. temp files that other tests' connections still hold
    cells = [CellDatabase(tmp_path / f"c{i}.db") for i in range(10)]
    for cell in cells:
        cell.run(functools.partial(run_sql, cell, "CREATE TABLE t (k PRIMARY KEY, v)"))
        cell.run(functools.partial(run_sql, cell, "INSERT INTO t VALUES (1, 2)"))
        cell.run(functools.partial(run_sql, cell, "SELECT * FROM t"))
    opened = list((Counter(open_files()) - Counter(before)).elements())
    assert sorted(opened) == sorted(str(tmp_path / f"c{i}.db") for i in range(10))
    for cell in cells:
        cell.close()
