"""Point-in-time restore against a real store (SeaweedFS): ``--at-txid`` and ``--at-time``
rebuild the database exactly as it was (compared with copies taken at each point), across a
takeover and snapshots; a point older than what collection kept is a clear error. And the
retention rule of garbage collection."""

from __future__ import annotations

import functools
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.cli import main
from cellactors.clock import wall_ms as time_ms
from cellactors.core import keys
from cellactors.errors import HistoryCollected, PointNotRestorable
from cellactors.persistence.celldb.database import CellDatabase, dump
from cellactors.persistence.history.restore import restore_at
from cellactors.persistence.history.snapshots import collect_garbage
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Sandbox
from tests.helpers.runtime import cell_dump, crash, eventually, make_node

CELL = "Sandbox:s"

STEPS: list[list[str]] = [
    ["CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB)"],
    ["INSERT INTO t (v, b) VALUES ('a', x'00ff'), ('b', NULL)"],
    ["UPDATE t SET v = 'A' WHERE id = 1"],
    ["CREATE TABLE kv (k TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID"],
    ["INSERT INTO kv VALUES ('x', 1), ('y', 2)", "DELETE FROM t WHERE id = 2"],
    ["UPDATE kv SET n = n + 10"],
    ["INSERT INTO t (v) VALUES ('c')"],
    ["DELETE FROM kv WHERE k = 'x'"],
    ["ALTER TABLE t ADD COLUMN w INTEGER DEFAULT 7"],
    ["UPDATE t SET w = id * 3"],
    ["INSERT INTO kv VALUES ('z', 5)"],
    ["DELETE FROM t"],
    ["INSERT INTO t (v) VALUES ('again')"],
]


def later_than(node: Any, stamp: int) -> bool:
    return int(node.clock.now_ms()) > stamp


def acked_txid(node: Any) -> int:
    (cell,) = [c for c in node.state()["cells"] if c["cell"] == CELL]
    return int(cell["acked_txid"])


def restored(bucket: S3Bucket, path: Path, epoch: int, **point: Any) -> dict[str, Any]:
    db = CellDatabase(path)
    try:
        restore_at(bucket, CELL, epoch, db, **point)
        return dump(db.db)
    finally:
        db.close()


def test_point_in_time_restores_equal_copies_taken_at_each_point(
    seaweed: SeaweedServer, sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    policy = SnapshotPolicy(every_txids=4)  # default retention: nothing collected
    a = make_node(sw_bucket, "na", snapshots=policy)
    b = None
    copies: dict[int, dict[str, Any]] = {}
    times: list[tuple[int, int]] = []  # (a time after txid t's ack and before t+1's, t)
    try:
        node = a
        for index, statements in enumerate(STEPS):
            if index == 7:  # a takeover in the middle
                crash(a, sw_bucket)
                node = b = make_node(sw_bucket, "nb", snapshots=policy)
            node.cell(Sandbox, "s").run(statements)
            txid = acked_txid(node)
            copies[txid] = cell_dump(node, CELL)
            stamp = node.clock.now_ms()  # transactions are stamped in the store's time
            times.append((stamp, txid))
            eventually(functools.partial(later_than, node, stamp), timeout=2, interval=0.001)
        eventually(lambda: len(list(sw_bucket.list(keys.cell_root(CELL) + "snap/"))) >= 2)
        assert sorted(copies) == list(range(1, len(STEPS) + 1))
        epoch = 3  # the owner's epoch (2) plus one
        for txid, copy in copies.items():
            got = restored(sw_bucket, tmp_path / f"t{txid}.db", epoch, txid=txid)
            assert got == copy, f"txid {txid}"
        for stamp, txid in times:
            got = restored(sw_bucket, tmp_path / f"m{stamp}.db", epoch, at_ms=stamp)
            assert got == copies[txid], f"time {stamp} (txid {txid})"
        with pytest.raises(PointNotRestorable, match="history ends at txid"):
            restored(sw_bucket, tmp_path / "beyond.db", epoch, txid=len(STEPS) + 1)
        with pytest.raises(PointNotRestorable, match="no transaction committed"):
            restored(sw_bucket, tmp_path / "before.db", epoch, at_ms=times[0][0] - 60_000)

        # The command: --at-txid and --at-time (ISO 8601) write the same database.
        base = ["restore", "--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
        runner = CliRunner()
        out = tmp_path / "cli-txid.db"
        result = runner.invoke(
            main, [*base, "--cell", CELL, "--output", str(out), "--at-txid", "5"]
        )
        assert result.exit_code == 0, result.output
        assert "through txid 5" in result.output
        assert _file_dump(out) == copies[5]
        stamp, txid = times[9]
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp / 1000))
        iso += f".{stamp % 1000:03d}Z"
        out = tmp_path / "cli-time.db"
        result = runner.invoke(
            main, [*base, "--cell", CELL, "--output", str(out), "--at-time", iso]
        )
        assert result.exit_code == 0, result.output
        assert _file_dump(out) == copies[txid]
        both = runner.invoke(
            main,
            [
                *base,
                "--cell",
                CELL,
                "--output",
                str(tmp_path / "x.db"),
                "--at-txid",
                "1",
                "--at-time",
                iso,
            ],
        )
        assert both.exit_code == 2 and "at most one" in both.output
        bad = runner.invoke(
            main, [*base, "--cell", CELL, "--output", str(tmp_path / "y.db"), "--at-time", "soon"]
        )
        assert bad.exit_code == 2 and "ISO 8601" in bad.output

        # Collect everything the newest snapshot covers (retention 0): older points are gone,
        # with a clear error naming where history starts; newer ones still restore.
        snaps = sorted(
            keys_of(sw_bucket, keys.cell_root(CELL) + "snap/"),
        )
        newest_txid, newest_epoch = _parse_snap(snaps[-1])
        assert collect_garbage(sw_bucket, CELL, newest_epoch, newest_txid, owns=lambda: True)
        with pytest.raises(HistoryCollected) as info:
            restored(sw_bucket, tmp_path / "old.db", epoch, txid=1)
        assert info.value.oldest_txid == newest_txid
        assert f"txid {newest_txid}" in str(info.value)
        got = restored(sw_bucket, tmp_path / "new.db", epoch, txid=len(STEPS))
        assert got == copies[len(STEPS)]
        old = runner.invoke(
            main, [*base, "--cell", CELL, "--output", str(tmp_path / "z.db"), "--at-txid", "1"]
        )
        assert old.exit_code == 1 and "collected" in old.output
        assert not (tmp_path / "z.db").exists()
    finally:
        if b is not None:
            b.stop()
        a.stop()


def keys_of(bucket: S3Bucket, prefix: str) -> list[str]:
    return [i.key for i in bucket.list(prefix)]


def _parse_snap(key: str) -> tuple[int, int]:
    name = key.rsplit("/", 1)[1]
    txid, epoch = name.split(".")[0], name.split(".")[1]
    return int(txid, 16), int(epoch[1:])


def _file_dump(path: Path) -> dict[str, Any]:
    import sqlite_utils

    conn = sqlite3.connect(path)
    try:
        return dump(sqlite_utils.Database(conn))
    finally:
        conn.close()


# --- retention of garbage collection -------------------------------------------------------


def test_collection_keeps_history_until_a_covering_snapshot_has_aged() -> None:
    bucket = MemoryBucket()
    root = keys.cell_root("Counter:a")
    for key in [
        keys.batch_key("Counter:a", 1, 1, 4),
        keys.seal_key("Counter:a", 1),
        keys.snapshot_key("Counter:a", 4, 1),
        keys.batch_key("Counter:a", 2, 5, 9),
        keys.snapshot_key("Counter:a", 9, 2),
    ]:
        bucket.put(key, b"{}")
    bucket.put(keys.seal_key("Counter:a", 1), b'{"epoch":1,"max_txid":4,"sealed_by_epoch":2}')
    now = time_ms()
    hour = 3600.0

    def collect(at: int) -> int:
        return collect_garbage(
            bucket, "Counter:a", 2, 9, owns=lambda: True, retain_s=hour, now_ms=at
        )

    assert collect(now) == 0  # both snapshots are younger than the retention
    assert len(list(bucket.list(root))) == 5
    # An hour on: the epoch-2 snapshot has aged, so what it covers goes.
    assert collect(now + int(hour * 1000) + 5_000) == 3
    assert sorted(i.key for i in bucket.list(root)) == sorted(
        [keys.batch_key("Counter:a", 2, 5, 9), keys.snapshot_key("Counter:a", 9, 2)]
    )
    # A deposed owner's collection deletes nothing.
    assert collect_garbage(bucket, "Counter:a", 2, 9, owns=lambda: False) == 0


def test_snapshot_policy_defaults_to_seven_days_and_refuses_negative() -> None:
    assert SnapshotPolicy().retain_s == 7 * 24 * 3600
    with pytest.raises(ValueError):
        SnapshotPolicy(retain_s=-1)
