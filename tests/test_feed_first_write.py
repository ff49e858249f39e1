"""The change feed shows a first write's rows even when that transaction also created the
table, and ``cellactors feed`` on a cell that does not exist says so and exits 1. (That the
runtime's tables a first call creates stay hidden from a feed reader who is not an admin:
tests/security/test_auth_http.py.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from cellactors import CellActor, Node, NodeSettings
from cellactors.cli.failures import EXIT_FAILURE
from cellactors.persistence.history.feed import read_changes
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.runtime import TTL


class Ledger(CellActor):
    """Creates its table in the call that first writes to it (no on_activate)."""

    def add(self, entry: str) -> int:
        self.db.execute("CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, entry TEXT)")
        self.db.execute("INSERT INTO entries (entry) VALUES (?)", [entry])
        return int(self.db.execute("SELECT count(*) FROM entries").fetchone()[0])

    def alter_and_add(self, entry: str) -> None:
        self.db.execute("ALTER TABLE entries ADD COLUMN note TEXT")
        self.db.execute("INSERT INTO entries (entry, note) VALUES (?, 'n')", [entry])


def _rows(change: Any) -> list[tuple[str, Any]]:
    return [(r.table, r.row) for r in change.rows if not r.table.startswith("_cellactors_")]


def test_a_first_write_that_creates_its_table_shows_its_rows(sw_bucket: S3Bucket) -> None:
    settings = NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:12")
    node = Node(sw_bucket, "na", [Ledger], settings).start()
    try:
        ledger = node.cell(Ledger, "l")
        assert ledger.add("first") == 1
        assert ledger.add("second") == 2
        ledger.alter_and_add("third")
    finally:
        node.stop()
    first, second, third = read_changes(sw_bucket, "Ledger:l", 0).changes
    assert first.schema_change
    assert _rows(first) == [("entries", {"rowid": 1, "id": 1, "entry": "first"})]
    assert not second.schema_change
    assert _rows(second) == [("entries", {"rowid": 2, "id": 2, "entry": "second"})]
    # A table the transaction altered shows no rows (the image has them), yet it is flagged.
    assert third.schema_change and _rows(third) == []


def test_cli_feed_on_a_cell_that_does_not_exist(
    sw_bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    args = ["feed", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
    done = subprocess.run(
        [sys.executable, "-m", "cellactors.cli", *args, "--cell", "Ledger:nobody"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_FAILURE, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: no cell Ledger:nobody in s3://{sw_bucket.bucket}"
    )
