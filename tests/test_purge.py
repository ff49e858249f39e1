"""Purging a cell: fenced, every object of it deleted from the bucket (own.json last), and
the next call finds an empty new cell; a half-done purge is finished by the next one."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cellactors.actors.node.purging import purge as node_purge
from cellactors.cli import main
from cellactors.cli.status import read_status
from cellactors.core import keys
from cellactors.core.alarms import Wake
from cellactors.errors import CellactorsError, CellPurging, NotDurable, RemoteOwner
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.control.purge import fence_for_purge, purge_cell
from cellactors.persistence.control.wakes import WakeStore, wake_key
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import make_node

CELL = "Counter:a"


def _keys(bucket: S3Bucket, cell_id: str) -> list[str]:
    return sorted(o.key for o in bucket.list(keys.cell_root(cell_id)))


def test_purge_deletes_every_object_and_the_next_call_finds_an_empty_cell(
    seaweed: SeaweedServer, sw_bucket: S3Bucket
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        for _ in range(3):
            node.cell(Counter, "a").increment("x")
        node.cell(Counter, "b").increment("x")
        assert node.passivate(CELL)
        wakes = WakeStore(sw_bucket)
        wakes.put(CELL, Wake(10**12, "n-a"))
        wakes.put("Counter:b", Wake(10**12, "n-b"))
        kept = _keys(sw_bucket, "Counter:b")
        assert len(_keys(sw_bucket, CELL)) >= 2

        args = ["purge", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
        refused = CliRunner().invoke(main, [*args, "--cell", CELL], input="n\n")
        assert refused.exit_code != 0 and _keys(sw_bucket, CELL), "purged without a yes"
        result = CliRunner().invoke(main, [*args, "--cell", CELL, "--yes", "--settle", "0"])
        assert result.exit_code == 0, result.output
        assert "purged Counter:a" in result.stdout

        assert _keys(sw_bucket, CELL) == []
        assert sw_bucket.head(wake_key(CELL, Wake(10**12, "n-a"))) is None
        assert sw_bucket.head(wake_key("Counter:b", Wake(10**12, "n-b"))) is not None
        assert _keys(sw_bucket, "Counter:b") == kept, "another cell was touched"

        assert node.cell(Counter, "a").get("x") == 0  # an empty new cell
        assert node.cell(Counter, "a").increment("x") == 1
        record = OwnershipStore(sw_bucket, "reader").read_owner(CELL)
        assert record is not None and record.epoch == 1  # created anew
        assert node.cell(Counter, "b").get("x") == 1
    finally:
        node.stop()


def test_a_purge_fences_the_live_owner(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        first = purge_cell(sw_bucket, CELL, settle=0)
        # The owner was live: own.json stays, marked purging, a tombstone nobody claims.
        assert first.fenced_live == "n1" and not first.finished
        assert _keys(sw_bucket, CELL) == [keys.owner_key(CELL)]
        # The owner still holds its activation: its next write is never acknowledged (and
        # its batch, which lands, is deleted by the purge that finishes).
        with pytest.raises(CellactorsError) as info:
            cell.increment("x")
        assert getattr(info.value, "outcome", None) in ("unknown", "not_run"), info.value
        record = OwnershipStore(sw_bucket, "reader").read_owner(CELL)
        assert record is not None and record.purging and record.node == ""
        second = purge_cell(sw_bucket, CELL, settle=0)
        assert second.finished and _keys(sw_bucket, CELL) == []
    finally:
        node.stop()


def test_a_half_done_purge_refuses_calls_and_the_next_purge_finishes(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        assert node.cell(Counter, "a").increment("x") == 1
        assert node.passivate(CELL)
        epoch = fence_for_purge(sw_bucket, CELL)  # the purge stopped right after fencing
        record = OwnershipStore(sw_bucket, "reader").read_owner(CELL)
        assert record is not None and record.purging and record.epoch == epoch == 2

        with pytest.raises(CellPurging) as info:
            node.cell(Counter, "a").get("x")
        assert info.value.status == 409 and info.value.outcome == "not_run"
        assert len(_keys(sw_bucket, CELL)) >= 2, "a refused call deleted or wrote something"
        [row] = read_status(sw_bucket, 10).cells
        assert (row.cell, row.state) == (CELL, "purging")

        result = purge_cell(sw_bucket, CELL, settle=0)
        assert result.fenced_epoch == 2
        assert _keys(sw_bucket, CELL) == []
        assert node.cell(Counter, "a").get("x") == 0
    finally:
        node.stop()


def test_purging_a_missing_cell_deletes_nothing(sw_bucket: S3Bucket) -> None:
    sw_bucket.put("cells/Counter:other/own.json", b'{"node":"","epoch":1,"acked_txid":0}')
    result = purge_cell(sw_bucket, "Counter:none", settle=0)
    assert (result.fenced_epoch, result.deleted) == (None, 0)
    assert _keys(sw_bucket, "Counter:other") == ["cells/Counter:other/own.json"]


@pytest.mark.parametrize("idle", ["active", "hibernated"])
def test_a_node_lets_go_of_its_copy_and_purges(sw_bucket: S3Bucket, idle: str) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        assert node.cell(Counter, "a").increment("x") == 1
        if idle == "hibernated":
            assert node.hibernate(CELL)
        result = node_purge(node, Counter, "a", settle=0)
        assert result.fenced_epoch is not None
        assert _keys(sw_bucket, CELL) == []
        assert not [p for p in node.cells_dir.iterdir() if p.name.startswith(CELL)]
        assert node.resident_cells() == 0 and node.hibernated_cells() == 0
        assert node.cell(Counter, "a").increment("x") == 1  # empty and new, and acknowledged
        assert _keys(sw_bucket, CELL)[-1] == keys.owner_key(CELL)
        assert not [k for k in _keys(sw_bucket, CELL) if "/e2/" in k or "/e3/" in k]
    finally:
        node.stop()


def test_a_node_sends_the_purge_of_a_live_peers_cell_to_that_peer(sw_bucket: S3Bucket) -> None:
    n1 = make_node(sw_bucket, "n1")
    n2 = make_node(sw_bucket, "n2")
    try:
        assert n1.cell(Counter, "a").increment("x") == 1
        before = _keys(sw_bucket, CELL)
        with pytest.raises(RemoteOwner) as info:
            node_purge(n2, Counter, "a", settle=0)
        assert info.value.node == "n1"
        assert _keys(sw_bucket, CELL) == before, "a refused purge deleted something"

        result = node_purge(n2, Counter, "a", settle=0, fence_live=True)  # fenced from afar
        assert result.fenced_live == "n1"
        assert _keys(sw_bucket, CELL) == [keys.owner_key(CELL)]  # the tombstone
        with pytest.raises(NotDurable):
            n1.cell(Counter, "a").increment("x")
        with pytest.raises(CellPurging):
            n2.cell(Counter, "a").get("x")
        assert node_purge(n2, Counter, "a", settle=0).finished
        assert _keys(sw_bucket, CELL) == []
        assert n2.cell(Counter, "a").increment("x") == 1  # empty and new
    finally:
        n2.stop()
        n1.stop()


def test_the_command_refuses_a_live_owners_cell_unless_told_to_fence_it(
    seaweed: SeaweedServer, sw_bucket: S3Bucket
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        assert node.cell(Counter, "a").increment("x") == 1
        before = _keys(sw_bucket, CELL)
        args = ["purge", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
        args += ["--cell", CELL, "--yes", "--settle", "0"]
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code != 0 and "live node n1" in refused.output
        assert _keys(sw_bucket, CELL) == before

        fenced = CliRunner().invoke(main, [*args, "--fence-live"])
        assert fenced.exit_code == 0, fenced.output
        assert "run again once that node has let go" in fenced.output
        assert _keys(sw_bucket, CELL) == [keys.owner_key(CELL)]
        with pytest.raises(NotDurable):
            node.cell(Counter, "a").increment("x")
        finished = CliRunner().invoke(main, args)  # the owner let go: no flag needed now
        assert finished.exit_code == 0 and "purged Counter:a" in finished.output
        assert _keys(sw_bucket, CELL) == []
    finally:
        node.stop()
