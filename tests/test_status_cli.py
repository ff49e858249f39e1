"""``cellactors status`` reads the fleet from the bucket alone: leases (alive, expired,
stopped) and a page of cells with owner, epoch and state."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cellactors.cli import main
from cellactors.clock import wall_ms as now_ms
from cellactors.core.types import NodeLease
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Absent
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket


def _lease(bucket: S3Bucket, node: str, expires_ms: int, load: int) -> None:
    lease = NodeLease(node, f"10.0.0.{load}:8081", expires_ms, "g1", load={"resident_cells": load})
    LeaseStore(bucket, node).cas_node_lease(Absent(), lease)


def _own(bucket: S3Bucket, cell: str, node: str, epoch: int) -> None:
    OwnershipStore(bucket, node).cas_owner(cell, Absent(), epoch)


def _status(seaweed: SeaweedServer, bucket: S3Bucket, *extra: str) -> dict[str, object]:
    args = ["status", "--bucket", f"s3://{bucket.bucket}", "--endpoint", seaweed.endpoint]
    result = CliRunner().invoke(main, [*args, "--json", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


def test_status_shows_leases_and_pages_cells(seaweed: SeaweedServer, sw_bucket: S3Bucket) -> None:
    now = now_ms()
    _lease(sw_bucket, "n-alive", now + 60_000, 2)
    _lease(sw_bucket, "n-dead", now - 5_000, 1)
    _lease(sw_bucket, "n-drained", 0, 0)
    cells = [f"Counter:c{i:02d}" for i in range(5)]
    for i, cell in enumerate(cells):
        _own(sw_bucket, cell, "n-alive" if i % 2 == 0 else "n-dead", i + 1)
    sw_bucket.put("cells/Counter:c00/e1/0000000000000001-0000000000000001.batch", b"x")
    before = sorted(o.key for o in sw_bucket.list(""))

    status = _status(seaweed, sw_bucket, "--limit", "2")
    nodes = {n["node"]: n for n in status["nodes"]}  # type: ignore[attr-defined]
    assert {k: v["state"] for k, v in nodes.items()} == {
        "n-alive": "alive",
        "n-dead": "expired",
        "n-drained": "stopped",
    }
    assert nodes["n-alive"]["addr"] == "10.0.0.2:8081"
    assert nodes["n-alive"]["load"] == {"resident_cells": 2}
    assert 50 < nodes["n-alive"]["expires_in_s"] <= 60
    assert nodes["n-dead"]["expires_in_s"] < 0

    seen: list[dict[str, object]] = list(status["cells"])  # type: ignore[call-overload]
    assert len(seen) == 2
    while status["next_after"] is not None:
        status = _status(seaweed, sw_bucket, "--limit", "2", "--after", str(status["next_after"]))
        seen += status["cells"]  # type: ignore[arg-type]
    assert [c["cell"] for c in seen] == cells
    by_cell = {c["cell"]: c for c in seen}
    assert by_cell["Counter:c00"] == {
        "cell": "Counter:c00",
        "owner": "n-alive",
        "epoch": 1,
        "state": "owned",
        "problem": None,
    }
    assert by_cell["Counter:c01"]["state"] == "orphaned"  # its owner's lease expired
    assert sorted(o.key for o in sw_bucket.list("")) == before, "status wrote to the bucket"

    table = CliRunner().invoke(
        main, ["status", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
    )
    assert table.exit_code == 0, table.output
    assert "n-dead" in table.stdout and "expired" in table.stdout
    assert "Counter:c04" in table.stdout and "more cells" not in table.stdout
