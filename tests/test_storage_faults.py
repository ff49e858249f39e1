"""Faults of a node's own storage (disk full, I/O error, read-only, unopenable): answered
``storage_unavailable`` (503, ``not_run``, retryable), never as the caller's failure; nothing
of the call is applied or shipped; the node counts the fault, logs the episode once, gives
the cell up and places new cells on healthy peers until a probe of its data directory
passes. The real full disk (a tmpfs under ``cellactors serve``) is in
tests/test_local_disk_full.py."""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cellactors import CellActor, Node
from cellactors.actors import storage as storage_module
from cellactors.actors.storage import probe
from cellactors.core import keys, placement
from cellactors.core.storage import StorageEpisode, storage_fault_reason
from cellactors.errors import (
    NOT_RUN,
    MethodFailed,
    NodeStorageFault,
    RemoteOwner,
)
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.celldb.runtime_tables import ALARM_TABLE
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import delta
from tests.helpers.metrics import parse, value
from tests.helpers.runtime import eventually, host_of, make_node

BIG_ROW = "INSERT INTO t VALUES (randomblob(100000))"  # needs pages the file lacks


class Swallow(CellActor):
    """Catches the error of a statement after which SQLite rolled the whole transaction
    back (``ON CONFLICT ROLLBACK``; some I/O errors do the same) and writes on: without a
    transaction, that write goes straight to the file."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS u (x UNIQUE ON CONFLICT ROLLBACK)")

    def add(self, x: str) -> None:
        self.db.execute("INSERT INTO u VALUES (?)", [x])

    def add_twice(self, x: str) -> None:
        self.db.execute("INSERT INTO u VALUES (?)", [x])
        self.db.execute("INSERT INTO u VALUES (?)", [x])

    def add_twice_then(self, x: str, then: str) -> None:
        self.db.execute("INSERT INTO u VALUES (?)", [x])
        try:
            self.db.execute("INSERT INTO u VALUES (?)", [x])
        except sqlite3.IntegrityError:
            pass
        self.db.execute("INSERT INTO u VALUES (?)", [then])

    def values(self) -> list[str]:
        return [str(r[0]) for r in self.db.execute("SELECT x FROM u ORDER BY x")]


# --- which errors are storage faults --------------------------------------------------------


def sqlite_full_error(tmp_path: Path) -> sqlite3.OperationalError:
    """The error SQLite raises when a database cannot grow (here: ``max_page_count``)."""
    conn = sqlite3.connect(tmp_path / "full.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    try:
        conn.execute(BIG_ROW)
    except sqlite3.OperationalError as err:
        return err
    finally:
        conn.close()
    raise AssertionError("the insert did not fail")


def raised(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except BaseException as err:
        return err
    raise AssertionError("nothing raised")


def test_a_database_that_cannot_grow_raises_what_a_full_disk_raises(tmp_path: Path) -> None:
    err = sqlite_full_error(tmp_path)
    assert str(err) == "database or disk is full"
    if hasattr(err, "sqlite_errorcode"):  # Python 3.11+: the code a full disk gives
        assert err.sqlite_errorcode == 13  # SQLITE_FULL
        assert getattr(err, "sqlite_errorname", None) == "SQLITE_FULL"
    assert storage_fault_reason(err) == "SQLITE_FULL: database or disk is full"


def test_storage_errors_of_sqlite_and_the_os_are_classified(tmp_path: Path) -> None:
    (tmp_path / "ro.db").touch()
    readonly = sqlite3.connect(f"file:{tmp_path / 'ro.db'}?mode=ro", uri=True)
    found = {
        "readonly": raised(lambda: readonly.execute("CREATE TABLE t (x)")),
        "cantopen": raised(lambda: sqlite3.connect(tmp_path / "no" / "such" / "x.db")),
        "full": sqlite_full_error(tmp_path),
    }
    readonly.close()
    reasons = {name: storage_fault_reason(err) for name, err in found.items()}
    assert reasons["readonly"] == "SQLITE_READONLY: attempt to write a readonly database"
    assert reasons["cantopen"] == "SQLITE_CANTOPEN: unable to open database file"
    ioerr = sqlite3.OperationalError("disk I/O error")
    ioerr.sqlite_errorcode = 778  # type: ignore[attr-defined]  # an extended SQLITE_IOERR
    ioerr.sqlite_errorname = "SQLITE_IOERR_WRITE"  # type: ignore[attr-defined]
    assert storage_fault_reason(ioerr) == "SQLITE_IOERR_WRITE: disk I/O error"
    # Python 3.10's errors carry no code: the message decides.
    for message, name in [
        ("database or disk is full", "SQLITE_FULL"),
        ("disk I/O error", "SQLITE_IOERR"),
        ("attempt to write a readonly database", "SQLITE_READONLY"),
        ("unable to open database file", "SQLITE_CANTOPEN"),
    ]:
        assert storage_fault_reason(sqlite3.OperationalError(message)) == f"{name}: {message}"
    for code in (errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT):
        reason = storage_fault_reason(OSError(code, os.strerror(code)))
        assert reason == f"{errno.errorcode[code]}: {os.strerror(code)}"


def test_other_errors_are_not_storage_faults(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE u (x UNIQUE)")
    conn.execute("INSERT INTO u VALUES (1)")
    for err in [
        raised(lambda: conn.execute("INSERT INTO u VALUES (1)")),  # the method's own fault
        raised(lambda: conn.execute("SELECT * FROM missing")),
        raised(lambda: conn.execute("not sql")),
        OSError(errno.ENOENT, "No such file or directory"),
        ValueError("database or disk is full"),
        # Another node's fault raised into a method (a call between cells) is not ours.
        NodeStorageFault("this node's local storage failed (SQLITE_FULL: ...)"),
    ]:
        assert storage_fault_reason(err) is None, err


def test_an_episode_starts_once_and_ends_at_the_first_passing_probe() -> None:
    episode = StorageEpisode(probe_interval=1.0)
    assert not episode.degraded and not episode.probe_due(0.0)
    assert episode.fault("full", 10.0) is True
    assert episode.fault("full again", 10.5) is False  # the same episode: not logged again
    assert episode.degraded and episode.reason == "full"
    assert not episode.probe_due(11.2)  # a fault is fresher evidence than a probe
    assert episode.probe_due(11.5)
    assert episode.probed(False, 11.5) is None and episode.degraded
    assert not episode.probe_due(12.0) and episode.probe_due(12.5)
    assert episode.probed(True, 12.5) == (2, 2.5)
    assert not episode.degraded and episode.faults == 0
    assert episode.fault("again", 20.0) is True  # a new episode


def test_the_probe_writes_syncs_and_deletes(tmp_path: Path) -> None:
    assert probe(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    problem = probe(tmp_path / "gone")
    assert problem is not None and "No such file or directory" in problem


# --- a node meeting storage faults ----------------------------------------------------------


def database_of(node: Node, cell_id: str) -> CellDatabase:
    host = host_of(node, cell_id)
    assert host.active is not None
    return host.active.runtime.database


def cannot_grow(node: Node, cell_id: str) -> None:
    """The cell's database may not grow by a page (as on a full disk): set on the runtime's
    connection from outside, as no cell code may set it."""
    conn = database_of(node, cell_id).conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


class FailingStatements:
    """Make statements of one connection fail once each, as a failing disk would; with
    ``applied`` each runs first (a COMMIT whose pages reached the file, then an error)."""

    def __init__(self, database: CellDatabase, *statements: str, applied: bool = False) -> None:
        self.real = database.conn.execute
        self.pending = list(statements)
        self.applied = applied
        database.conn.execute = self.execute  # type: ignore[method-assign]

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql in self.pending:
            self.pending.remove(sql)
            if self.applied:
                self.real(sql, *args)
            raise sqlite3.OperationalError("disk I/O error")
        return self.real(sql, *args)


def storage_samples(node: Node) -> tuple[float, float]:
    samples = parse(node.metrics_text())
    return (
        value(samples, "cellactors_storage_faults_total"),
        value(samples, "cellactors_storage_degraded"),
    )


def given_up(bucket: S3Bucket, node: Node, cell_id: str, epoch: int) -> bool:
    """The node released the cell at ``epoch`` and holds no file of it."""
    record = OwnershipStore(bucket, "reader").read_owner(cell_id)
    files = [p for p in node.cells_dir.iterdir() if p.name.startswith(cell_id)]
    return record is not None and (record.node, record.epoch) == ("", epoch) and not files


def rows(node: Node, name: str) -> int:
    """Rows of the Sandbox's table ``t``, once a call (re)activated it here."""
    assert node.call("Sandbox", name, "run", {"statements": ["SELECT 1"]}) == 1
    conn = database_of(node, f"Sandbox:{name}").conn
    return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])


@pytest.fixture
def probe_fails(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """While the event is set, every probe of the data directory fails (the disk stays
    full); clear it to free the space."""
    full = threading.Event()
    full.set()
    real = storage_module.probe

    def fake(directory: Path, size: int = storage_module.PROBE_BYTES) -> str | None:
        return "no space left (test)" if full.is_set() else real(directory, size)

    monkeypatch.setattr(storage_module, "probe", fake)
    yield full


def test_a_write_that_fills_the_disk_is_answered_not_run_and_the_cell_is_given_up(
    sw_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cellactors.actors.storage")
    node = make_node(sw_bucket, "s1")
    try:
        for name in ("a", "b"):
            node.call("Sandbox", name, "run", {"statements": ["CREATE TABLE t (x)"]})
            node.call("Sandbox", name, "run", {"statements": ["INSERT INTO t VALUES (1)"]})
            cannot_grow(node, f"Sandbox:{name}")
        assert storage_samples(node) == (0, 0)
        before = node.bucket.snapshot()
        with pytest.raises(NodeStorageFault) as info:
            node.call("Sandbox", "a", "run", {"statements": [BIG_ROW]})
        err = info.value
        assert (err.status, err.code, err.outcome, err.retryable) == (
            503,
            "storage_unavailable",
            NOT_RUN,
            True,
        )
        assert "SQLITE_FULL: database or disk is full" in str(err)
        assert ("put", "batch") not in delta(node, before)  # nothing of it was shipped
        # A second cell failing the same way belongs to the same episode.
        with pytest.raises(NodeStorageFault):
            node.call("Sandbox", "b", "run", {"statements": [BIG_ROW]})
        assert storage_samples(node) == (2, 1)
        assert node.state()["storage"] == "degraded"
        for cell_id in ("Sandbox:a", "Sandbox:b"):
            eventually(functools.partial(given_up, sw_bucket, node, cell_id, 1), timeout=10)
        # The data directory takes writes (the limit was the connection's): the next probe
        # passes, the episode ends, and the cells come back from the bucket, unharmed.
        assert eventually(lambda: rows(node, "a"), timeout=10) == 1
        assert node.state()["cells"][0]["restored_from"] == "bucket"
        assert storage_samples(node) == (2, 0)
        episode = [r for r in caplog.records if r.name == "cellactors.actors.storage"]
        warnings = [r for r in episode if r.levelno == logging.WARNING]
        recoveries = [r for r in episode if r.levelno == logging.INFO]
        assert len(warnings) == 1 and "SQLITE_FULL" in warnings[0].getMessage()
        assert len(recoveries) == 1 and "after 2 storage faults" in recoveries[0].getMessage()
    finally:
        node.stop()


@pytest.mark.parametrize("failing", ["commit applied, then failed", "commit and rollback"])
def test_a_failing_commit_discards_the_file_and_ships_nothing(
    sw_bucket: S3Bucket, failing: str
) -> None:
    """A COMMIT that fails may have written some of its pages (the journal is in memory),
    and a rollback that fails leaves the file unknown: the file is no longer trusted, every
    later call on it is refused, and the cell comes back from the bucket without the
    write, which was never shipped."""
    node = make_node(sw_bucket, "s2")
    try:
        node.call("Sandbox", "c", "run", {"statements": ["CREATE TABLE t (x)"]})
        database = database_of(node, "Sandbox:c")
        if failing == "commit and rollback":
            FailingStatements(database, "COMMIT", "ROLLBACK")
        else:
            FailingStatements(database, "COMMIT", applied=True)
        with pytest.raises(NodeStorageFault) as info:
            node.call("Sandbox", "c", "run", {"statements": ["INSERT INTO t VALUES (1)"]})
        assert info.value.outcome == NOT_RUN and "SQLITE_IOERR" in str(info.value)
        assert database.broken
        with pytest.raises(NodeStorageFault, match="no longer trusted"):
            database.run(lambda: None, read_only=True)
        eventually(lambda: given_up(sw_bucket, node, "Sandbox:c", 1), timeout=10)
        assert eventually(lambda: rows(node, "c") == 0, timeout=10) is True
        assert [k for k in keys_of(sw_bucket, "Sandbox:c") if k.endswith(".batch")] == [
            keys.batch_key("Sandbox:c", 1, 1, 1)  # the CREATE TABLE only
        ]
    finally:
        node.stop()


def keys_of(bucket: S3Bucket, cell_id: str) -> list[str]:
    return [o.key for o in bucket.list(keys.cell_root(cell_id))]


def test_a_transaction_sqlite_rolled_back_under_the_method_never_reaches_a_read(
    sw_bucket: S3Bucket,
) -> None:
    """SQLite rolled the call's transaction back under the method, which caught the error
    and wrote on, outside any transaction, into the file. The call fails (nothing kept),
    nothing ships, and the file is discarded: no later read sees that write."""
    node = make_node(sw_bucket, "s3")
    node.register(Swallow)
    try:
        node.call("Swallow", "w", "add", {"x": "a"})
        # Raised out of the method, the rollback is clean: the cell carries on.
        with pytest.raises(MethodFailed, match="UNIQUE constraint failed"):
            node.call("Swallow", "w", "add_twice", {"x": "z"})
        assert node.call("Swallow", "w", "values", {}) == ["a"]
        assert node.state()["cells"][0]["epoch"] == 1
        with pytest.raises(MethodFailed, match="rolled back under the method") as info:
            node.call("Swallow", "w", "add_twice_then", {"x": "b", "then": "c"})
        assert info.value.outcome == "failed"
        assert eventually(lambda: node.call("Swallow", "w", "values", {}) == ["a"], timeout=10)
        assert node.state()["cells"][0]["restored_from"] == "bucket"
        assert storage_samples(node) == (0, 0)  # not a storage fault: the node is healthy
    finally:
        node.stop()


class Grower(CellActor):
    """Its alarm writes a row the file has no pages for (when it may not grow)."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (x)")

    def arm(self) -> None:
        self.set_alarm(time.time() + 3600)

    def on_alarm(self) -> None:
        self.db.execute(BIG_ROW)

    def rows(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM t").fetchone()[0])


def test_a_storage_fault_in_on_alarm_is_not_counted_as_its_failure(sw_bucket: S3Bucket) -> None:
    """The alarm did not fail, the node's disk did: no failed run is recorded (it would
    back the alarm off and count towards abandoning it), and the alarm stays set."""
    node = make_node(sw_bucket, "s4", alarm_scan_interval=3600)
    node.register(Grower)
    try:
        node.call("Grower", "g", "arm", {})
        cannot_grow(node, "Grower:g")
        conn = database_of(node, "Grower:g").conn
        conn.execute(f"UPDATE {ALARM_TABLE} SET at_ms = 0")  # due now, for this cell only
        with pytest.raises(NodeStorageFault):
            node.fire_alarm("Grower:g")
        eventually(lambda: given_up(sw_bucket, node, "Grower:g", 1), timeout=10)
        assert eventually(lambda: node.call("Grower", "g", "rows", {}) == 0, timeout=10)
        failures = database_of(node, "Grower:g").conn.execute(f"SELECT failures FROM {ALARM_TABLE}")
        assert failures.fetchall() == [(0,)]
    finally:
        node.stop()


def test_a_failing_restore_releases_the_cell_and_a_degraded_node_places_on_healthy_peers(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch, probe_fails: threading.Event
) -> None:
    a = make_node(sw_bucket, "pa")
    b = make_node(sw_bucket, "pb")
    try:
        a.call("Sandbox", "x", "run", {"statements": ["CREATE TABLE t (x)"]})
        assert a.passivate("Sandbox:x")
        real_apply = CellDatabase.apply

        def full_apply(self: CellDatabase, txn: Any) -> None:
            if self.path.parent == b.cells_dir:
                raise sqlite3.OperationalError("database or disk is full")
            real_apply(self, txn)

        monkeypatch.setattr(CellDatabase, "apply", full_apply)
        with pytest.raises(NodeStorageFault, match="activation of Sandbox:x failed") as info:
            b.call("Sandbox", "x", "run", {"statements": ["INSERT INTO t VALUES (1)"]})
        assert info.value.outcome == NOT_RUN
        # own.json is released at once at the claimed epoch: nobody waits for b's lease.
        assert given_up(sw_bucket, b, "Sandbox:x", 2)
        assert storage_samples(b) == (1, 1)
        b.lease.proxy().renew().get()
        lease = LeaseStore(sw_bucket, "reader").read_lease("pb")
        assert lease is not None and lease.lease.load["storage"] == "degraded"
        # Degraded, b sends the cell, and a new one, to its healthy peer; nothing written.
        for name in ("x", "new"):
            with pytest.raises(RemoteOwner) as routed:
                b.call("Sandbox", name, "run", {"statements": ["SELECT 1"]})
            assert routed.value.node == "pa"
        assert OwnershipStore(sw_bucket, "reader").read_owner("Sandbox:new") is None
        assert a.call("Sandbox", "x", "run", {"statements": ["SELECT 1"]}, forwarded=True) == 1
        # A healthy node never places a cell on a degraded peer, even when it is full.
        assert placement.roomy_peer(a.leases.read_capacity_peers(), 10_000) is None
        # A call a peer forwarded to the degraded node is refused there (no third hop).
        with pytest.raises(NodeStorageFault, match="takes no new cells"):
            b.call("Sandbox", "fwd", "run", {"statements": ["SELECT 1"]}, forwarded=True)
        a.stop()  # no healthy peer left: refused, and nothing written
        with pytest.raises(NodeStorageFault, match="takes no new cells"):
            b.call("Sandbox", "lonely", "run", {"statements": ["SELECT 1"]})
        assert OwnershipStore(sw_bucket, "reader").read_owner("Sandbox:lonely") is None
        # Space returns: the next probe passes and b takes cells again.
        monkeypatch.setattr(CellDatabase, "apply", real_apply)
        probe_fails.clear()
        eventually(lambda: b.storage.state == "ok", timeout=10)
        b.lease.proxy().renew().get()
        lease = LeaseStore(sw_bucket, "reader").read_lease("pb")
        assert lease is not None and lease.lease.load["storage"] == "ok"
        assert storage_samples(b) == (1, 0)
        assert b.call("Sandbox", "lonely", "run", {"statements": ["SELECT 1"]}) == 1
        b.forget_route("Sandbox", "x")  # its placement on pa is cached as a route
        assert b.call("Sandbox", "x", "run", {"statements": ["SELECT 1"]}) == 1
    finally:
        a.stop()
        b.stop()


def test_a_cells_directory_removed_under_a_running_node_is_made_again(
    sw_bucket: S3Bucket,
) -> None:
    """An operator's clean-up (or a tmp reaper) that removes the node's cells directory is
    not a storage fault: the next activation makes the directory again, private."""
    node = make_node(sw_bucket, "n1")
    try:
        node.call("Sandbox", "x", "run", {"statements": ["CREATE TABLE t (x)"]})
        assert node.passivate("Sandbox:x")
        shutil.rmtree(node.cells_dir)
        assert node.call("Sandbox", "y", "run", {"statements": ["SELECT 1"]}) == 1
        assert node.cells_dir.stat().st_mode & 0o777 == 0o700
        assert node.storage.state == "ok"
    finally:
        node.stop()
