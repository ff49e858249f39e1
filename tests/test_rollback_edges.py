"""Rolling back in place, at its edges: odd values and schemas, races with a purge, who
``on_activate`` runs for, cells that do not exist.

Each test names the invariant it checks. The invariants: after a rollback, (a) the live
cell's database equals what a fresh restore of the history (rollback included) gives, (b)
its user objects, rows, counters and header equal the state restored at the target txid,
(c) the change feed's record of the rollback lists the rows that differed, (d) the answer
says truthfully whether anything was written.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cellactors import CellActor
from cellactors.actors.node import Node, NodeSettings, rolling_back
from cellactors.actors.node.purging import purge
from cellactors.actors.node.rolling_back import roll_back
from cellactors.core import keys
from cellactors.core.principal import Principal
from cellactors.errors import (
    FAILED,
    NOT_RUN,
    UNKNOWN,
    ActivationFailed,
    BadRequest,
    BucketError,
    BucketUnavailable,
    MethodFailed,
    NotDurable,
)
from cellactors.persistence.celldb.calls import RESERVED_PREFIX
from cellactors.persistence.celldb.database import CellDatabase, dump
from cellactors.persistence.history.feed import read_changes
from cellactors.persistence.history.restore import restore_at
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket
from tests.helpers.cells import Counter, Sandbox
from tests.helpers.runtime import TTL, cell_dump, expire_lease, make_node

CELL = "Sandbox:s"


def _latest(bucket: S3Bucket, cell_id: str = CELL) -> int:
    return read_changes(bucket, cell_id).changes[-1].txid


def _header(conn: sqlite3.Connection) -> tuple[int, int]:
    return (
        conn.execute("PRAGMA main.user_version").fetchone()[0],
        conn.execute("PRAGMA main.application_id").fetchone()[0],
    )


def _restored(bucket: S3Bucket, tmp: Path, txid: int, cell_id: str = CELL) -> dict[str, Any]:
    """The database (dump + header) a read-only restore at ``txid`` gives."""
    node_epoch = 10_000  # restore_at wants "the owner's epoch plus one": above any epoch here
    db = CellDatabase(tmp / f"at-{txid}.db")
    try:
        restore_at(bucket, cell_id, node_epoch, db, txid=txid)
        return {**dump(db.db), "header": _header(db.conn)}
    finally:
        db.close()


def _live(node: Any, cell_id: str = CELL) -> dict[str, Any]:
    from tests.helpers.runtime import active_of

    conn = active_of(node, cell_id).runtime.database.conn
    return {**cell_dump(node, cell_id), "header": _header(conn)}


def _user_part(d: dict[str, Any]) -> dict[str, Any]:
    """Only the user's objects, rows and counters (and the header)."""

    def mine(name: str) -> bool:
        return not name.startswith(RESERVED_PREFIX)

    tables = {  # by name: a rollback may leave the tables in another order in sqlite_master
        n: rows for n, rows in sorted(d["tables"].items()) if mine(n) and n != "sqlite_sequence"
    }
    seq = [r for r in d["tables"].get("sqlite_sequence", []) if mine(str(r[1]))]
    schema = [
        s for s in d["schema"] if mine(s[1]) and not s[2].startswith("CREATE TABLE _cellactors")
    ]
    return {"schema": schema, "tables": tables, "sequence": seq, "header": d["header"]}


def _strict(value: Any) -> str:
    """repr: 0.0 and -0.0, 1 and 1.0 differ (== would call them equal)."""
    return repr(value)


# ------------------------------------------------------------------------------------------
# A broad invariant check over many kinds of values and schema objects, both paths.
# ------------------------------------------------------------------------------------------

BASE = [
    "CREATE TABLE r (id INTEGER PRIMARY KEY, a, b BLOB, c REAL, d TEXT)",
    "CREATE TABLE w (k1 TEXT, k2 INTEGER, v, PRIMARY KEY (k1, k2)) WITHOUT ROWID",
    "CREATE TABLE g (id INTEGER PRIMARY KEY, a INTEGER, s AS (a * 2) STORED, v AS (a + 1))",
    "CREATE TABLE ai (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT UNIQUE)",
    "CREATE TABLE p (id INTEGER PRIMARY KEY)",
    "CREATE TABLE ch (pid INTEGER REFERENCES p(id) ON DELETE CASCADE, n)",
    "CREATE TABLE log (what)",
    "CREATE INDEX r_expr ON r (lower(d), a + 1)",
    "CREATE VIEW rv AS SELECT id, a FROM r WHERE a IS NOT NULL",
    "CREATE TRIGGER r_log AFTER INSERT ON r BEGIN INSERT INTO log VALUES (NEW.id); END",
    "INSERT INTO r VALUES (1, 1, X'00FF', 1.5, 'Tea'), (2, NULL, NULL, NULL, NULL)",
    "INSERT INTO w VALUES ('a', 1, 1), ('a', 2, 2.0), ('b', 1, X'01')",
    "INSERT INTO g (id, a) VALUES (1, 3)",
    "INSERT INTO ai (name) VALUES ('x'), ('y')",
    "INSERT INTO p VALUES (1), (2)",
    "INSERT INTO ch VALUES (1, 'one'), (2, 'two')",
    "PRAGMA user_version = 3",
]

SAME_SCHEMA_AFTER = [
    "UPDATE r SET a = 1.0, b = 'text now', c = 2, d = NULL WHERE id = 1",
    "UPDATE r SET a = X'', d = '' WHERE id = 2",
    "INSERT INTO r VALUES (3, 3, 3, 3, '3')",
    "DELETE FROM w WHERE k1 = 'a' AND k2 = 1",
    "UPDATE w SET v = 2 WHERE k1 = 'a'",
    "INSERT INTO w VALUES ('c', 9, NULL)",
    "UPDATE g SET a = 10",
    "INSERT INTO ai (name) VALUES ('z')",
    "DELETE FROM ai WHERE name = 'x'",
    "UPDATE ai SET name = 'x' WHERE name = 'y'",
    "DELETE FROM p WHERE id = 1",
    "INSERT OR REPLACE INTO p VALUES (2)",
    "PRAGMA user_version = 4",
]

SCHEMA_AFTER = [
    "ALTER TABLE r RENAME TO r2",
    "ALTER TABLE w ADD COLUMN extra DEFAULT 'e'",
    "DROP VIEW rv",
    "CREATE VIEW rv AS SELECT id FROM r2",
    "CREATE TABLE newer (x)",
    "INSERT INTO newer VALUES (1)",
    "DROP TRIGGER r_log",
    "CREATE INDEX g_a ON g (a)",
    "INSERT INTO ai (name) VALUES ('q')",
    "PRAGMA application_id = 77",
]


@pytest.mark.parametrize("after", [SAME_SCHEMA_AFTER, SCHEMA_AFTER], ids=["rows", "rebuild"])
def test_broad_invariants_hold(sw_bucket: S3Bucket, tmp_path: Path, after: list[str]) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Sandbox, "s")
        cell.run(BASE)
        point = _latest(sw_bucket)
        for statement in after:
            cell.run([statement])
        back = roll_back(node, Sandbox, "s", to_txid=point)
        assert back.txid is not None
        live = _live(node)
        assert _strict(_user_part(live)) == _strict(
            _user_part(_restored(sw_bucket, tmp_path, point))
        )
        assert _strict(live) == _strict(_restored(sw_bucket, tmp_path, back.txid))
        undo = roll_back(node, Sandbox, "s", to_txid=back.undo_txid)
        assert undo.txid is not None
        assert _strict(_user_part(_live(node))) == _strict(
            _user_part(_restored(sw_bucket, tmp_path, back.undo_txid))
        )
    finally:
        node.stop()


# ------------------------------------------------------------------------------------------
# One edge each.
# ------------------------------------------------------------------------------------------


def test_feed_of_a_schema_changing_rollback_lists_the_rows_it_changed_in_kept_tables(
    sw_bucket: S3Bucket,
) -> None:
    """docs/feed.md: a schema-changing rollback still lists the rows that differed in every
    table whose definition it kept, so a projection of final row images drops the
    rolled-back row."""
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Sandbox, "s")
        cell.run(["CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"])
        cell.run(["INSERT INTO items VALUES (1, 'tea')"])
        point = _latest(sw_bucket)
        cell.run(["INSERT INTO items VALUES (2, 'cake')"])
        cell.run(["CREATE TABLE other (x)"])  # any schema change after the point
        back = roll_back(node, Sandbox, "s", to_txid=point)
        [record] = read_changes(sw_bucket, CELL, after=back.undo_txid).changes
        assert record.rollback == (point, back.undo_txid) and record.schema_change
        # items is the same table at both points; its row 2 is gone after the rollback.
        assert [(r.table, r.key, r.row) for r in record.rows] == [("items", [2], None)]
    finally:
        node.stop()


def test_a_rows_only_rollback_restores_negative_zero(sw_bucket: S3Bucket, tmp_path: Path) -> None:
    """SQLite keeps the sign of a zero (Python's ``==`` does not see it): a row whose only
    difference is -0.0 against 0.0 is written back, and the answer says it wrote."""
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Sandbox, "s")
        cell.run(["CREATE TABLE t (id INTEGER PRIMARY KEY, v)", "INSERT INTO t VALUES (1, -0.0)"])
        point = _latest(sw_bucket)
        cell.run(["UPDATE t SET v = 0.0"])
        target = _user_part(_restored(sw_bucket, tmp_path, point))
        assert _strict(target["tables"]["t"]) == "[(1, 1, -0.0)]"
        back = roll_back(node, Sandbox, "s", to_txid=point)
        assert _strict(_user_part(_live(node))["tables"]["t"]) == "[(1, 1, -0.0)]"
        assert back.txid is not None
    finally:
        node.stop()


def test_a_rollback_to_before_the_first_autoincrement_table_leaves_no_counter(
    sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    """The AUTOINCREMENT table goes and so does its counter; ``sqlite_sequence`` itself stays,
    empty (SQLite never drops it), and a fresh restore of the history has it too."""
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Sandbox, "s")
        cell.run(["CREATE TABLE q (a)"])
        point = _latest(sw_bucket)
        cell.run(["CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, a)"])
        cell.run(["INSERT INTO t (a) VALUES (1)"])
        back = roll_back(node, Sandbox, "s", to_txid=point)
        live = _live(node)
        assert _user_part(live)["sequence"] == []
        assert "t" not in _user_part(live)["tables"]
        assert _strict(live) == _strict(_restored(sw_bucket, tmp_path, back.undo_txid + 1))
    finally:
        node.stop()


def test_a_purge_racing_a_rollback_does_not_bring_the_purged_data_back(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge (and a new cell under the same id, at the same epoch) between the image's
    read from the bucket and its application is refused: the image is applied only to the
    activation the rollback began with. The race is forced: the purge runs inside
    ``_image_at`` after the image is read."""
    node = make_node(sw_bucket, "n1")
    real_image_at = rolling_back._image_at
    try:
        old = node.cell(Counter, "a")
        for _ in range(3):
            old.increment("secret")  # txids 2, 3, 4

        def image_then_purge(*args: Any, **kw: Any) -> tuple[int, bytes]:
            found = real_image_at(*args, **kw)
            purge(node, Counter, "a")  # the purged cell's data must be gone for good
            new = node.cell(Counter, "a")
            for _ in range(4):
                new.increment("fresh")  # the new cell: txids 1..5
            return found

        monkeypatch.setattr(rolling_back, "_image_at", image_then_purge)
        with pytest.raises(ActivationFailed, match="purged"):
            roll_back(node, Counter, "a", to_txid=3)
        assert node.cell(Counter, "a").get("secret") == 0
        assert node.cell(Counter, "a").get("fresh") == 4
    finally:
        node.stop()


class Audited(CellActor):
    """on_activate records who it runs for: ``self.caller`` is None there (cell.py: "None for
    an anonymous caller, ``on_activate`` and ``on_alarm``")."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS seen (who TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS notes (n TEXT)")
        who = self.caller.name if self.caller is not None else "nobody"
        self.db.execute("INSERT INTO seen VALUES (?)", [who])

    def note(self, n: str) -> None:
        self.db.execute("INSERT INTO notes VALUES (?)", [n])

    def seen(self) -> list[str]:
        return [str(r[0]) for r in self.db.execute("SELECT who FROM seen ORDER BY rowid")]


def test_on_activate_in_a_rollback_runs_for_nobody(sw_bucket: S3Bucket) -> None:
    """``on_activate`` in a rollback runs as at an activation: for no caller and with a call
    chain of the cell alone, never with the last call's principal (whose roles its calls
    would carry) or chain (which could refuse them as a cycle)."""
    settings = NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:12")
    node = Node(sw_bucket, "n1", [Audited], settings).start()
    try:
        node.call("Audited", "a", "note", {"n": "first"})
        point = _latest(sw_bucket, "Audited:a")
        alice = Principal("alice", frozenset({"admin"}))
        node.call("Audited", "a", "note", {"n": "second"}, caller=alice)
        roll_back(node, Audited, "a", to_txid=point)
        assert node.call("Audited", "a", "seen") == ["nobody", "nobody"]
    finally:
        node.stop()


def test_rolling_back_a_cell_that_never_existed_is_refused_and_creates_nothing(
    sw_bucket: S3Bucket,
) -> None:
    """A cell the bucket has no record of is refused before anything activates it: a typo
    in an operator's ``--cell`` creates no cell (not even with ``--to-txid 0``)."""
    node = make_node(sw_bucket, "n1")
    try:
        with pytest.raises(BadRequest):
            roll_back(node, Counter, "never-was", to_txid=0)
        assert list(sw_bucket.list(keys.cell_root("Counter:never-was"))) == []
    finally:
        node.stop()


def test_cli_confirmation_names_txid_zero(tmp_path: Path) -> None:
    """The confirmation names the point asked for, txid 0 included."""
    from click.testing import CliRunner

    from cellactors.cli import main

    args = ["rollback", "--bucket", "s3://b/f", "--endpoint", "http://127.0.0.1:1"]
    args += ["--node", "http://127.0.0.1:1", "--cell", "Counter:a", "--to-txid", "0"]
    result = CliRunner().invoke(main, args, input="n\n")
    assert "back to None?" not in result.output


def test_same_schema_after_an_earlier_rebuild_is_a_rows_only_rollback(sw_bucket: S3Bucket) -> None:
    """The same schema in another order in sqlite_master (as a rebuilding rollback leaves
    it) is the same schema: a later rollback between two points of it writes rows only and
    ships no image."""
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Sandbox, "s")
        cell.run(["CREATE TABLE a (x)", "CREATE INDEX a_x ON a (x)", "CREATE TABLE b (y)"])
        point = _latest(sw_bucket)
        cell.run(["CREATE TABLE c (z)"])
        roll_back(node, Sandbox, "s", to_txid=point)  # rebuilds: now a, b, a_x
        cell.run(["INSERT INTO a VALUES (1)"])
        back = roll_back(node, Sandbox, "s", to_txid=point)  # same schema as the point
        [record] = read_changes(sw_bucket, CELL, after=back.undo_txid).changes
        assert not record.schema_change
        assert [(r.table, r.row) for r in record.rows] == [("a", None)]
    finally:
        node.stop()


# ------------------------------------------------------------------------------------------
# Faults: what an operator is told is what happened.
# ------------------------------------------------------------------------------------------


class _FailingHistory(CuttableBucket):
    """Fails every listing (a restore's first request) while ``failing``."""

    failing = False

    def list(self, prefix):  # type: ignore[no-untyped-def]
        if self.failing:
            raise BucketError("the store failed the listing (test)")
        return self.inner.list(prefix)


def test_a_store_that_fails_the_restore_leaves_the_cell_as_it_was(sw_bucket: S3Bucket) -> None:
    store = _FailingHistory(sw_bucket)
    node = make_node(store, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        cell.increment("x")
        store.failing = True
        with pytest.raises(BucketUnavailable) as refused:
            roll_back(node, Counter, "a", to_txid=2)
        assert refused.value.outcome == NOT_RUN and refused.value.retryable
        store.failing = False
        assert cell.get("x") == 2
        assert read_changes(sw_bucket, "Counter:a").changes[-1].txid == 3
    finally:
        node.stop()


class Fragile(CellActor):
    """A counter whose ``on_activate`` raises while ``broken``."""

    broken = False

    def on_activate(self) -> None:
        if Fragile.broken:
            raise RuntimeError("on_activate is broken")
        self.db.execute("CREATE TABLE IF NOT EXISTS n (v INTEGER)")

    def add(self) -> int:
        self.db.execute("INSERT INTO n VALUES (1)")
        return int(self.db.execute("SELECT count(*) FROM n").fetchone()[0])


def test_a_rollback_whose_transaction_raises_failed_and_changed_nothing(
    sw_bucket: S3Bucket,
) -> None:
    node = Node(sw_bucket, "n1", [Fragile], NodeSettings(lease_ttl=TTL, advertise="x:1")).start()
    try:
        cell = node.cell(Fragile, "f")
        cell.add()
        assert cell.add() == 2
        Fragile.broken = True
        with pytest.raises(MethodFailed) as failed:
            roll_back(node, Fragile, "f", to_txid=2)
        assert failed.value.outcome == FAILED  # it ran, and was rolled back
        Fragile.broken = False
        assert cell.add() == 3
        assert [c.rollback for c in read_changes(sw_bucket, "Fragile:f").changes] == [None] * 4
    finally:
        Fragile.broken = False
        node.stop()


def test_a_rollback_whose_batch_never_lands_is_answered_unknown(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CuttableBucket(sw_bucket)
    node = make_node(store, "n1")
    real_image_at = rolling_back._image_at

    def image_then_cut(*args: Any, **kw: Any) -> tuple[int, bytes]:
        found = real_image_at(*args, **kw)
        store.cut = True  # the rollback commits on the cell, but its batch cannot land
        return found

    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        cell.increment("x")
        monkeypatch.setattr(rolling_back, "_image_at", image_then_cut)
        with pytest.raises(NotDurable) as lost:
            roll_back(node, Counter, "a", to_txid=2)
        assert lost.value.outcome == UNKNOWN
    finally:
        node.stop()
    expire_lease(sw_bucket, "n1")
    other = make_node(sw_bucket, "n2")
    try:  # its batch never left: the next owner finds the cell as it was before
        assert other.cell(Counter, "a").get("x") == 2
    finally:
        other.stop()
