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
from cellactors.errors import ActivationFailed, BadRequest
from cellactors.persistence.celldb.calls import RESERVED_PREFIX
from cellactors.persistence.celldb.database import CellDatabase, dump
from cellactors.persistence.history.feed import read_changes
from cellactors.persistence.history.restore import restore_at
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter, Sandbox
from tests.helpers.runtime import TTL, cell_dump, make_node

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
# A broad invariant check: passes (kept as evidence of what was checked and found fine).
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
# Confirmed bugs: these fail.
# ------------------------------------------------------------------------------------------


def test_feed_of_a_schema_changing_rollback_lists_the_rows_it_changed_in_kept_tables(
    sw_bucket: S3Bucket,
) -> None:
    """docs/feed.md: a rollback's ``changes`` are the rows that differed; with a schema
    change too, "as above": the rows of every table it left as it was. ``_rebuild`` drops
    and recreates *every* user table, so the capture triggers of an unchanged table go with
    it and its differing rows never reach the feed: a projection that keeps final row
    images keeps the rolled-back row forever."""
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
    """``_same_value`` compares with ``==``: -0.0 == 0.0 in Python, but SQLite keeps them apart
    (``typeof`` real both, sign preserved). A row whose only difference is the sign of a zero
    is not written back: the live cell differs from the state at the target, and the answer
    says nothing was written (``txid`` None: the CLI prints "was already as it was")."""
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
    """A normal activation (CellActor.open_here) sets ``_chain = (cell_id,)`` and
    ``_caller = None`` before on_activate; rollback_run.roll_back does not, so on_activate
    runs with the *last call's* caller (and call chain): ``self.caller`` is that principal,
    and the calls on_activate makes carry its identity and roles (and a stale chain, which
    can refuse them as a CallCycle)."""
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
    """``_image_at`` means to refuse a cell with no ownership record ("no cell ... in the
    bucket"), but step 1 (``edit_runtime``) has already activated the cell here, writing
    own.json and on_activate's txid 1: a typo in an operator's ``--cell`` creates the cell,
    and ``--to-txid 0`` then "rolls it back" (answered 200 with a txid)."""
    node = make_node(sw_bucket, "n1")
    try:
        with pytest.raises(BadRequest):
            roll_back(node, Counter, "never-was", to_txid=0)
        assert list(sw_bucket.list(keys.cell_root("Counter:never-was"))) == []
    finally:
        node.stop()


def test_cli_confirmation_names_txid_zero(tmp_path: Path) -> None:
    """Cosmetic: ``f"... back to {to_txid or at_time}?"`` prints None for --to-txid 0."""
    from click.testing import CliRunner

    from cellactors.cli import main

    args = ["rollback", "--bucket", "s3://b/f", "--endpoint", "http://127.0.0.1:1"]
    args += ["--node", "http://127.0.0.1:1", "--cell", "Counter:a", "--to-txid", "0"]
    result = CliRunner().invoke(main, args, input="n\n")
    assert "back to None?" not in result.output


def test_same_schema_after_an_earlier_rebuild_is_a_rows_only_rollback(sw_bucket: S3Bucket) -> None:
    """rollback.py: "When the schema is the same at both points, only the rows that differ
    are written ... no image is shipped". ``restore_user_state`` compares ``user_objects``
    as lists in sqlite_master rowid order, and ``_rebuild`` recreates tables first and
    indexes after, so once a rollback has rebuilt the schema, the same schema in another
    order counts as different: every later rollback (its undo included) rebuilds and ships
    an image, and (bug above) its feed record has no rows."""
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
