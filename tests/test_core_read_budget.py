"""Which read-only methods run on the serving loop (cellactors.core.read_budget)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cellactors.core.read_budget import PROVE, QuickReads
from cellactors.persistence.celldb.database import CellDatabase, ReadInterrupted


def test_a_method_is_quick_after_its_last_runs_each_kept_the_budget() -> None:
    reads = QuickReads(budget_s=0.01)
    key = ("Reports", "count")
    for _ in range(PROVE - 1):
        assert not reads.ran(key, 0.001)
        assert not reads.quick(key)
    assert not reads.ran(key, 0.001)
    assert reads.quick(key)
    assert reads.ran(key, 0.02)  # overstayed: off the loop until it proves itself again
    assert not reads.quick(key)
    for _ in range(PROVE):
        reads.ran(key, 0.0)
    assert reads.quick(key) and not reads.quick(("Reports", "other"))


SLOW = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) "
    "SELECT count(*) FROM n"
)


@pytest.mark.parametrize("caught", [False, True], ids=["raised", "caught by the method"])
def test_sql_past_the_deadline_is_interrupted_and_the_read_discarded(
    tmp_path: Path, caught: bool
) -> None:
    db = CellDatabase(tmp_path / "c.db")
    try:

        def read() -> int:
            try:
                return int(db.conn.execute(SLOW).fetchone()[0])
            except sqlite3.OperationalError:
                if not caught:
                    raise
                return -1  # an incomplete answer: never returned to a caller

        started = time.perf_counter()
        with pytest.raises(ReadInterrupted):
            db.run(read, read_only=True, interrupt_at=started + 0.01)
        assert time.perf_counter() - started < 1.0
        assert db.run(lambda: 2, read_only=True)[0] == 2  # the connection serves on
    finally:
        db.close()
