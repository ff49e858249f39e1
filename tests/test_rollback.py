"""Rolling a live cell back in place: its user tables go back to an earlier txid (or time)
in one new transaction that the change feed shows as a rollback, the runtime's bookkeeping
stays (answered calls stay answered), and rolling back to the txid before it undoes it."""

from __future__ import annotations

import time
from collections import Counter as Tally

import pytest

from cellactors import CellActor
from cellactors.actors.node import Node, NodeSettings
from cellactors.actors.node.rolling_back import roll_back
from cellactors.errors import BadRequest, RemoteOwner
from cellactors.persistence.history.feed import read_changes
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.testing import Fleet
from tests.helpers.buckets import delta
from tests.helpers.cells import Counter
from tests.helpers.runtime import TTL, crash, make_node


class Shop(CellActor):
    """A cell whose schema grows: a later migration adds a table, an index and a trigger."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)"
        )

    def add(self, name: str) -> int:
        return int(self.db.execute("INSERT INTO items (name) VALUES (?)", [name]).lastrowid or 0)

    def migrate(self) -> None:
        self.db.execute("CREATE TABLE log (what TEXT)")
        self.db.execute("CREATE INDEX items_name ON items (name)")
        self.db.execute(
            "CREATE TRIGGER logged AFTER INSERT ON items BEGIN "
            "INSERT INTO log VALUES (NEW.name); END"
        )
        self.db.execute("PRAGMA user_version = 7")

    def state(self) -> dict[str, object]:
        tables = [
            r[0]
            for r in self.db.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger') "
                "AND name NOT LIKE 'sqlite%' AND name NOT LIKE '_cellactors%' ORDER BY name"
            )
        ]
        items = [list(r) for r in self.db.execute("SELECT id, name FROM items ORDER BY id")]
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        return {"objects": tables, "items": items, "user_version": version}


def test_a_rollback_goes_back_in_one_transaction_and_its_undo_goes_forward(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        for _ in range(3):
            cell.increment("x")
        cell.increment("y")
        changes = read_changes(sw_bucket, "Counter:a").changes
        latest = changes[-1].txid
        x_is_1 = {"rowid": 1, "name": "x", "n": 1}
        after_first = next(c.txid for c in changes if any(r.row == x_is_1 for r in c.rows))

        back = roll_back(node, Counter, "a", to_txid=after_first)
        assert (back.to_txid, back.undo_txid, back.txid) == (after_first, latest, latest + 1)
        assert cell.get("x") == 1 and cell.get("y") == 0

        feed = read_changes(sw_bucket, "Counter:a", after=latest).changes
        [record] = feed
        assert record.txid == latest + 1 and record.rollback == (after_first, latest)
        assert not record.schema_change
        assert [r.row for r in record.rows if r.row is not None] == [x_is_1]
        assert [r.table for r in record.rows if r.row is None] == ["counts"]  # y's row
        assert record.to_wire()["rollback"] == {"to_txid": after_first, "undo_txid": latest}

        forward = roll_back(node, Counter, "a", to_txid=back.undo_txid)
        assert forward.undo_txid == latest + 1
        assert cell.get("x") == 3 and cell.get("y") == 1
    finally:
        node.stop()


def _shop_node(bucket: S3Bucket, node_id: str) -> Node:
    settings = NodeSettings(lease_ttl=TTL, advertise=f"127.0.0.1:1{len(node_id)}")
    return Node(bucket, node_id, [Shop], settings).start()


def test_a_rollback_across_a_migration_rebuilds_the_schema_and_survives_a_crash(
    sw_bucket: S3Bucket,
) -> None:
    node, other = _shop_node(sw_bucket, "n1"), _shop_node(sw_bucket, "n2")
    try:
        shop = node.cell(Shop, "s")
        shop.add("tea")
        before = shop.state()
        point = read_changes(sw_bucket, "Shop:s").changes[-1].txid
        shop.migrate()
        assert shop.add("cake") == 2
        after = shop.state()
        assert after["objects"] == ["items", "items_name", "log", "logged"]

        back = roll_back(node, Shop, "s", to_txid=point)
        assert shop.state() == before
        record = read_changes(sw_bucket, "Shop:s", after=back.undo_txid).changes[0]
        assert record.schema_change and record.rollback == (point, back.undo_txid)
        assert shop.add("jam") == 2  # the AUTOINCREMENT counter went back too
        rolled = shop.state()

        crash(node, sw_bucket)  # the next owner restores the history, rollback included
        moved = other.cell(Shop, "s")
        assert moved.state() == rolled
        undo = roll_back(other, Shop, "s", to_txid=back.undo_txid)
        assert moved.state() == after and undo.undo_txid == back.undo_txid + 2
    finally:
        node.stop()
        other.stop()


def test_rows_go_back_without_firing_the_users_triggers(sw_bucket: S3Bucket) -> None:
    node = _shop_node(sw_bucket, "n1")
    try:
        shop = node.cell(Shop, "s")
        shop.migrate()
        shop.add("tea")
        point = read_changes(sw_bucket, "Shop:s").changes[-1].txid
        shop.add("cake")
        roll_back(node, Shop, "s", to_txid=point)
        state = shop.state()
        assert state["items"] == [[1, "tea"]]
        assert state["objects"] == ["items", "items_name", "log", "logged"]
        assert shop.add("jam") == 2  # the trigger still fires for new rows
    finally:
        node.stop()


def test_answered_calls_stay_answered_after_a_rollback(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        assert node.call("Counter", "a", "increment", {"name": "x"}, key="k1") == 1
        assert node.call("Counter", "a", "increment", {"name": "x"}, key="k2") == 2
        roll_back(node, Counter, "a", to_txid=1)  # before either call
        assert node.cell(Counter, "a").get("x") == 0
        # Their keys are the runtime's: a retry is answered from the record, not run again.
        assert node.call("Counter", "a", "increment", {"name": "x"}, key="k2") == 2
        assert node.cell(Counter, "a").get("x") == 0
    finally:
        node.stop()


def test_a_rollback_to_a_time_and_the_points_it_refuses(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        first = read_changes(sw_bucket, "Counter:a").changes[-1]
        deadline = time.monotonic() + 5
        while node.clock.now_ms() <= first.ts_ms + 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # the next commit gets a later stamp
        cell.increment("x")
        latest = read_changes(sw_bucket, "Counter:a").changes[-1].txid

        for bad in ({"to_txid": latest}, {"to_txid": latest + 5}, {}, {"to_txid": -1}):
            with pytest.raises(BadRequest):
                roll_back(node, Counter, "a", **bad)
        with pytest.raises(BadRequest):
            roll_back(node, Counter, "a", to_txid=1, at_ms=first.ts_ms)
        assert cell.get("x") == 2
        assert read_changes(sw_bucket, "Counter:a").changes[-1].txid == latest

        back = roll_back(node, Counter, "a", at_ms=first.ts_ms)
        assert back.to_txid == first.txid and cell.get("x") == 1
    finally:
        node.stop()


def test_a_node_that_does_not_own_the_cell_names_its_owner(sw_bucket: S3Bucket) -> None:
    owner, other = make_node(sw_bucket, "n1"), make_node(sw_bucket, "n2")
    try:
        owner.cell(Counter, "a").increment("x")
        owner.cell(Counter, "a").increment("x")
        with pytest.raises(RemoteOwner) as found:
            roll_back(other, Counter, "a", to_txid=2)
        assert found.value.node == "n1"
        assert owner.cell(Counter, "a").get("x") == 2
    finally:
        other.stop()
        owner.stop()


def test_a_fleet_rolls_a_cell_back_on_its_owner() -> None:
    with Fleet([Counter], nodes=2) as fleet:
        fleet.cell(Counter, "a").increment("x")
        fleet.cell(Counter, "a").increment("x")
        back = fleet.roll_back(Counter, "a", to_txid=2)
        assert fleet.cell(Counter, "a").get("x") == 1
        assert fleet.changes(Counter, "a", after=back.undo_txid)[0].rollback == (2, 3)
        fleet.roll_back(Counter, "a", to_txid=back.undo_txid)
        assert fleet.acknowledged(Counter, "a")["counts"] == [{"name": "x", "n": 2}]


def test_a_rollback_to_before_the_first_write_leaves_what_on_activate_makes(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        back = roll_back(node, Counter, "a", to_txid=0)  # before on_activate's own txid 1
        assert back.to_txid == 0
        assert cell.get("x") == 0
        assert cell.increment("x") == 1  # its table is there: on_activate ran again
    finally:
        node.stop()


def test_the_bucket_requests_of_a_rollback(sw_bucket: S3Bucket) -> None:
    """On an active cell whose history is one batch: one read of ``own.json`` (the cell
    exists; the epoch the restore needs comes from the cell itself), the restore's listing
    and batch read, then the rollback's own batch PUT and re-read. The probe of step 1 asks
    nothing of the bucket (everything was durable)."""
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")  # one batch: on_activate's txid 1 and this txid 2
        before = node.bucket.snapshot()
        roll_back(node, Counter, "a", to_txid=1)
        assert delta(node, before) == Tally(
            {("get", "own"): 2, ("list", "other"): 1, ("get", "batch"): 1, ("put", "batch"): 1}
        )
    finally:
        node.stop()
