"""Cloning a cell: a new cell starting from another's database, now or at a txid; the
source is untouched and an existing target is refused."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cellactors.cli import main
from cellactors.core import keys
from cellactors.errors import CellactorsError, CellPurging
from cellactors.persistence.control.purge import purge_cell
from cellactors.persistence.history.clone import clone_cell
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import make_node


def test_a_clone_starts_from_the_source_now_or_at_a_txid(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        for _ in range(3):
            node.cell(Counter, "a").increment("x")
        source_keys = sorted(o.key for o in sw_bucket.list(keys.cell_root("Counter:a")))

        now = clone_cell(sw_bucket, "Counter:a", "Counter:b")
        earlier = clone_cell(sw_bucket, "Counter:a", "Counter:c", at_txid=now.txid - 1)
        assert earlier.txid == now.txid - 1
        assert node.cell(Counter, "b").get("x") == 3
        assert node.cell(Counter, "c").get("x") == 2
        assert node.cell(Counter, "b").increment("x") == 4
        assert node.cell(Counter, "a").get("x") == 3  # the source is its own cell
        assert sorted(o.key for o in sw_bucket.list(keys.cell_root("Counter:a"))) == source_keys

        with pytest.raises(CellactorsError, match="exists"):
            clone_cell(sw_bucket, "Counter:a", "Counter:b")
        assert node.cell(Counter, "b").get("x") == 4
        with pytest.raises(CellactorsError, match="no cell"):
            clone_cell(sw_bucket, "Counter:none", "Counter:d")
    finally:
        node.stop()


def test_a_clone_that_stops_half_way_is_finished_off_by_a_purge(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        node.cell(Counter, "a").increment("x")
        with pytest.raises(CellactorsError):
            clone_cell(sw_bucket, "Counter:a", "Counter:b", at_txid=10**6)  # not restorable
        with pytest.raises(CellPurging):
            node.cell(Counter, "b").get("x")  # half built: refused, never half restored
        purge_cell(sw_bucket, "Counter:b", settle=0)
        assert list(sw_bucket.list(keys.cell_root("Counter:b"))) == []
        assert node.cell(Counter, "b").get("x") == 0
    finally:
        node.stop()


def test_cellactors_clone(seaweed: SeaweedServer, sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        node.cell(Counter, "a").increment("x")
        node.cell(Counter, "a").increment("x")
        store = ["--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
        args = ["clone", *store, "--cell", "Counter:a", "--to", "Counter:b"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "cloned Counter:a at txid" in result.stdout
        assert node.cell(Counter, "b").get("x") == 2
        again = CliRunner().invoke(main, args)
        assert again.exit_code != 0 and "exists" in again.output
    finally:
        node.stop()
