"""A store whose listings lag behind its writes (the fault proxy leaves out of every listing
the objects modified in the last 4 s), behind real ``cellactors serve`` processes.

Before, a cell drained from one node and taken by another a moment later was restored
without its newest acknowledged batches: the new owner sealed the epoch below them (a
permanent loss), keyed retries ran again, and ``cellactors restore`` exited 0 with the same
hole. Now a release records the highest txid it acknowledged in ``own.json``, and no restore
seals, opens or writes a file below it: it lists again until the listing shows it."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultNode, warm

pytestmark = pytest.mark.faults

TTL = 3.0
LAG = 4.0


def keyed_append(node: FaultNode, cell: str, entry: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{node.public_url}/cells/Ledger/{cell}/append",
        json={"entry": entry},
        headers={"Idempotency-Key": key},
        timeout=40,
    )


def entries(node: FaultNode, cell: str) -> list[str]:
    resp = httpx.post(f"{node.public_url}/cells/Ledger/{cell}/entries", json={}, timeout=40)
    assert resp.status_code == 200, resp.text
    result: list[str] = resp.json()["result"]
    return result


def drain(node: FaultNode) -> None:
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 0, node.tail()


def cli_restore(fleet_bucket: str, endpoint: str, cell: str, out: Path) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cellactors.cli",
            "restore",
            "--bucket",
            f"s3://{fleet_bucket}",
            "--endpoint",
            endpoint,
            "--cell",
            f"Ledger:{cell}",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(out) as conn:
        return [r[0] for r in conn.execute("SELECT entry FROM entries ORDER BY seq")]


def test_a_drained_cell_taken_at_once_through_a_lagging_listing_loses_nothing(
    make_fault_fleet: MakeFaultFleet, tmp_path: Path
) -> None:
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="lag")
    first, second = fleet[0], fleet[1]
    warm(fleet, first, "cl")
    answers = {}
    for i in range(10):
        resp = keyed_append(first, "cl", f"k{i}", f"key-{i}")
        assert resp.status_code == 200 and resp.headers["X-Cellactors-Node"] == first.node_id
        answers[i] = resp.json()["result"]
    before = entries(first, "cl")
    assert len(before) == 11
    second.proxy.lag_listings(LAG)
    drain(first)

    # The next owner lists through the lag at once: it waits for what the release recorded.
    resp = keyed_append(second, "cl", "after", "key-after")
    assert resp.status_code == 200 and resp.headers["X-Cellactors-Node"] == second.node_id
    assert entries(second, "cl") == [*before, "after"]
    assert [line for line in second.lines() if "waiting for the listing" in line], second.tail()
    # Keyed retries find their records: none runs again.
    for i in range(5, 10):
        again = keyed_append(second, "cl", f"k{i}", f"key-{i}")
        assert again.status_code == 200 and again.json()["result"] == answers[i]
    assert entries(second, "cl") == [*before, "after"]

    # Drained again: `cellactors restore` through a lagging listing waits the same way.
    third = keyed_append(second, "cl", "last", "key-last")
    assert third.status_code == 200
    drain(second)
    first.proxy.lag_listings(LAG)
    restored = cli_restore(fleet.bucket.bucket, first.proxy.endpoint, "cl", tmp_path / "cl.db")
    assert restored == [*before, "after", "last"]
