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
        assert out.stat().st_mode & 0o777 == 0o600  # one cell's rows: its owner's only
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
    assert not (tmp_path / "o.db").exists()  # a refused restore leaves no file behind
    # A dangling link is not followed (it would write wherever it points), and no missing
    # folder is created.
    target = tmp_path / "elsewhere.db"
    (tmp_path / "link.db").symlink_to(target)
    linked = runner.invoke(
        main, [*base, "--cell", "Counter:a", "--output", str(tmp_path / "link.db")]
    )
    assert linked.exit_code == 2 and "exists" in linked.output and not target.exists()
    deep = tmp_path / "no" / "such" / "dir" / "o.db"
    nested = runner.invoke(main, [*base, "--cell", "Counter:a", "--output", str(deep)])
    assert nested.exit_code == 2 and "not a directory" in nested.output
    assert not (tmp_path / "no").exists()


def test_a_nodes_data_directory_and_cell_files_are_its_own(
    sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    node = make_node(sw_bucket, "n1", data_dir=data)
    try:
        node.cell(Counter, "a").increment("x")
        cell_files = list(node.cells_dir.iterdir())
        assert cell_files and all(f.stat().st_mode & 0o777 == 0o600 for f in cell_files)
        for folder in (data, data / "n1", node.cells_dir):
            assert folder.stat().st_mode & 0o777 == 0o700, folder
    finally:
        node.stop()
