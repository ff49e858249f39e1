"""``cellactors restore``: a read-only rebuild of one cell into a SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from click.testing import CliRunner

from cellactors.cli import main
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import make_node


def _keys(bucket: S3Bucket) -> list[tuple[str, str]]:
    return [(i.key, i.token) for i in bucket.list("cells/")]


def test_restore_writes_the_acknowledged_state_and_nothing_to_the_bucket(
    seaweed: SeaweedServer, sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        for _ in range(7):
            cell.increment("x")
        cell.increment("y", by=5)
        before = _keys(sw_bucket)
        out = tmp_path / "a.db"
        result = CliRunner().invoke(
            main,
            [
                "restore",
                "--bucket",
                f"s3://{sw_bucket.bucket}",
                "--endpoint",
                seaweed.endpoint,
                "--cell",
                "Counter:a",
                "--output",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        assert "through txid 9" in result.output  # txid 1 created the table
        assert _keys(sw_bucket) == before  # no seal, no ownership change
        with sqlite3.connect(out) as conn:
            assert dict(conn.execute("SELECT name, n FROM counts")) == {"x": 7, "y": 5}
        assert not Path(str(out) + "-wal").exists()
    finally:
        node.stop()


def test_restore_errors(seaweed: SeaweedServer, sw_bucket: S3Bucket, tmp_path: Path) -> None:
    base = ["restore", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
    runner = CliRunner()
    bad = runner.invoke(main, [*base, "--cell", "../x", "--output", str(tmp_path / "o.db")])
    assert bad.exit_code == 2 and "invalid cell id" in bad.output
    missing = runner.invoke(
        main, [*base, "--cell", "Counter:none", "--output", str(tmp_path / "o.db")]
    )
    assert missing.exit_code == 1 and "no cell Counter:none" in missing.output
    (tmp_path / "exists.db").write_bytes(b"")
    exists = runner.invoke(
        main, [*base, "--cell", "Counter:a", "--output", str(tmp_path / "exists.db")]
    )
    assert exists.exit_code == 2 and "exists" in exists.output
