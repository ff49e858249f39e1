"""``cellactors cells`` and :func:`list_cells`: cells listed from the bucket alone, a page at
a time, with owner, epoch, size and last activity; nothing is activated or written."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

from click.testing import CliRunner

from cellactors.cli import main
from cellactors.clock import wall_ms
from cellactors.core import keys
from cellactors.persistence.control.cell_listing import list_cells
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Absent, Bucket, ObjectInfo, StoredObject
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter as CounterCell
from tests.helpers.cells import Sandbox
from tests.helpers.runtime import make_node

COUNTERS = [f"Counter:c{i}" for i in range(5)]


def _cells_cli(seaweed: SeaweedServer, bucket: S3Bucket, *extra: str) -> dict[str, Any]:
    args = ["cells", "--bucket", f"s3://{bucket.bucket}", "--endpoint", seaweed.endpoint]
    result = CliRunner().invoke(main, [*args, "--json", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def _own_bodies(bucket: S3Bucket) -> dict[str, bytes]:
    found = {}
    for cell in [*COUNTERS, "Sandbox:s"]:
        obj = bucket.get(keys.owner_key(cell))
        assert obj is not None
        found[cell] = obj.body
    return found


def test_cells_are_listed_page_by_page_without_activation(
    seaweed: SeaweedServer, sw_bucket: S3Bucket
) -> None:
    started = wall_ms()
    node = make_node(sw_bucket, "n1")
    try:
        for i, cell in enumerate(COUNTERS):
            for _ in range(i + 1):
                node.cell(CounterCell, cell.partition(":")[2]).increment("x")
        node.cell(Sandbox, "s").run(["CREATE TABLE t (x)"])
        for cell in [*COUNTERS, "Sandbox:s"]:
            assert node.passivate(cell)
        assert node.resident_cells() == 0
        before = _own_bodies(sw_bucket)

        page = _cells_cli(seaweed, sw_bucket, "--class", "Counter", "--limit", "2")
        seen = list(page["cells"])
        assert len(seen) == 2
        pages = 1
        while page["next_after"] is not None:
            page = _cells_cli(
                seaweed,
                sw_bucket,
                "--class",
                "Counter",
                "--limit",
                "2",
                "--after",
                page["next_after"],
            )
            seen += page["cells"]
            pages += 1
        assert [c["cell"] for c in seen] == COUNTERS  # every cell once, in order
        assert pages == 3
        for row in seen:
            record = node.ownership.read_owner(row["cell"])
            assert record is not None
            assert (row["owner"], row["epoch"]) == (record.node, record.epoch)
            assert row["acked_txid"] == record.acked_txid
            assert row["purging"] is False
            objects = list(sw_bucket.list(keys.cell_root(row["cell"])))
            assert row["objects"] == len(objects) >= 2  # own.json and at least one batch
            assert row["size_bytes"] == sum(o.size for o in objects)
            assert row["last_activity_ms"] == max(o.last_modified_ms for o in objects)
            assert row["last_activity_ms"] >= started - 5_000
        assert seen[4]["size_bytes"] > seen[0]["size_bytes"]  # five writes against one

        everything = list_cells(sw_bucket, limit=100)
        assert [c.cell for c in everything.cells] == [*COUNTERS, "Sandbox:s"]
        assert everything.next_after is None
        assert list_cells(sw_bucket, "Sandbox", after="Counter:c4").cells[0].cell == "Sandbox:s"
        assert list_cells(sw_bucket, "Counter", after="Sandbox:s").cells == []

        assert node.resident_cells() == 0, "listing activated a cell"
        assert _own_bodies(sw_bucket) == before, "listing changed an own.json"
    finally:
        node.stop()


def test_cells_table_prints_the_next_cursor(seaweed: SeaweedServer, sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        node.cell(CounterCell, "a").increment("x")
        node.cell(CounterCell, "b").increment("x")
    finally:
        node.stop()
    args = ["cells", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
    result = CliRunner().invoke(main, [*args, "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert "Counter:a" in result.stdout and "(released)" in result.stdout
    assert "more cells: --after Counter:a" in result.stdout


class _Counting:
    """Counts the bucket calls a listing makes (each a request here: cells are small)."""

    def __init__(self, inner: S3Bucket) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def list_folders(self, prefix: str, start_after: str = "") -> Iterator[str]:
        self.calls["list_folders"] += 1
        return self.inner.list_folders(prefix, start_after)

    def get(self, key: str) -> StoredObject | None:
        self.calls["get"] += 1
        return self.inner.get(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        return self.inner.list(prefix)


def test_a_page_costs_requests_in_proportion_to_the_page(sw_bucket: S3Bucket) -> None:
    for i in range(12):
        OwnershipStore(sw_bucket, "n1").cas_owner(f"Counter:k{i:02d}", Absent(), 1)
    counting = _Counting(sw_bucket)
    page = list_cells(cast(Bucket, counting), "Counter", limit=3, after="Counter:k04")
    assert [c.cell for c in page.cells] == ["Counter:k05", "Counter:k06", "Counter:k07"]
    assert page.next_after == "Counter:k07"
    assert counting.calls == Counter({"list_folders": 1, "get": 3, "list": 3})
