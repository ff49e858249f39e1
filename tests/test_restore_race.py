"""The restore executor (:func:`cellactors.persistence.history.restore.restore`) against holes and a
racing garbage collection, on an in-memory bucket with real batch, snapshot and seal
objects: a listed object that vanishes sends it back to listing; a hole that stays fails
the activation without writing a seal."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from cellactors.core import keys
from cellactors.core.txn import Txn
from cellactors.errors import RestoreHole
from cellactors.persistence.celldb.capture import database_image
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.history import restore as restore_module
from cellactors.persistence.history.batches import Batch, encode_batch
from cellactors.persistence.history.restore import MAX_LISTINGS, RestoreResult, restore
from cellactors.persistence.history.seals import read_seal, seal_body
from cellactors.persistence.history.snapshots import collect_garbage, encode_snapshot
from cellactors.persistence.store.bucket import ObjectInfo, StoredObject
from cellactors.persistence.store.memory import MemoryBucket

CELL = "Counter:a"
ROOT = keys.cell_root(CELL)
# txid -> value: epoch 1 wrote 1-2, epoch 2 wrote 3-4, epoch 3 wrote 5.
VALUES = {1: "e1:1", 2: "e1:2", 3: "e2:3", 4: "e2:4", 5: "e3:5"}


@cache
def image(upto: int) -> bytes:
    """A database holding the rows of txids 1..upto (each transaction carries an image)."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (txid INTEGER PRIMARY KEY, v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(t, VALUES[t]) for t in range(1, upto + 1)])
    conn.commit()
    return database_image(conn)


class RacingBucket(MemoryBucket):
    """A memory bucket that runs ``on_get[key]`` (once) just before reading ``key``, and
    counts the listings of the cell made outside those hooks."""

    def __init__(self) -> None:
        super().__init__("holes")
        self.on_get: dict[str, Callable[[], None]] = {}
        self.listings = 0
        self._hooked = False

    def get(self, key: str) -> StoredObject | None:
        hook = self.on_get.pop(key, None)
        if hook is not None:
            self._hooked = True
            try:
                hook()
            finally:
                self._hooked = False
        return super().get(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix == ROOT and not self._hooked:
            self.listings += 1
        return super().list(prefix)

    def keys(self) -> set[str]:
        return {info.key for info in MemoryBucket.list(self, ROOT)}


def put_batch(bucket: MemoryBucket, epoch: int, first: int, last: int) -> str:
    key = keys.batch_key(CELL, epoch, first, last)
    txns = [Txn(txid=t, image=image(t)) for t in range(first, last + 1)]
    bucket.put(key, encode_batch(Batch(CELL, epoch, txns)))
    return key


def put_snapshot(bucket: MemoryBucket, epoch: int, txid: int, body: bytes | None = None) -> str:
    key = keys.snapshot_key(CELL, txid, epoch)
    bucket.put(key, encode_snapshot(CELL, epoch, txid, image(txid)) if body is None else body)
    return key


def put_seal(bucket: MemoryBucket, epoch: int, max_txid: int) -> str:
    key = keys.seal_key(CELL, epoch)
    bucket.put(key, seal_body(epoch, max_txid, epoch + 1))
    return key


def history(bucket: MemoryBucket, snapshot: bool = True) -> str:
    """Epoch 1 wrote txids 1-2 and snapshotted at 2 (S0); epoch 2 restored (sealing epoch 1
    at 2) and wrote 3-4. Returns S0's key."""
    put_batch(bucket, 1, 1, 1)
    put_batch(bucket, 1, 2, 2)
    s0 = put_snapshot(bucket, 1, 2) if snapshot else ""
    put_seal(bucket, 1, 2)
    put_batch(bucket, 2, 3, 3)
    put_batch(bucket, 2, 4, 4)
    return s0


def run(bucket: MemoryBucket, epoch: int, tmp_path: Path) -> tuple[RestoreResult, list[str]]:
    db = CellDatabase(tmp_path / f"e{epoch}.db")
    try:
        result = restore(bucket, CELL, epoch, db)
        tables = db.conn.execute("SELECT name FROM sqlite_master WHERE name = 't'").fetchall()
        rows = [r[0] for r in db.conn.execute("SELECT v FROM t ORDER BY txid")] if tables else []
    finally:
        db.discard()
    return result, rows


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The executor's backoff between listings, recorded instead of slept."""
    slept: list[float] = []
    fake = SimpleNamespace(sleep=slept.append, monotonic=time.monotonic)
    monkeypatch.setattr(restore_module, "time", fake)
    return slept


def collection_by_epoch_2(bucket: RacingBucket) -> Callable[[], None]:
    """Epoch 2's owner lands its snapshot S1 at txid 4, then its collection deletes epoch 1
    and S0 (its ownership check passed before the takeover)."""

    def collect() -> None:
        put_snapshot(bucket, 2, 4)
        assert collect_garbage(bucket, CELL, 2, 4, owns=lambda: True) >= 3

    return collect


@pytest.mark.parametrize("vanishes", ["the snapshot", "a batch", "a seal"])
def test_a_listed_object_that_vanishes_sends_the_restore_back_to_listing(
    tmp_path: Path, sleeps: list[float], vanishes: str
) -> None:
    """The acknowledged-write loss that the planner fixes: the restore at epoch 3 listed
    S0 and epoch 1; epoch 2's collection deletes them before the fetch. The executor lists
    again, finds S1, and restores every write."""
    bucket = RacingBucket()
    s0 = history(bucket, snapshot=vanishes != "a batch")
    trigger = {
        "the snapshot": s0,
        "a batch": keys.batch_key(CELL, 1, 1, 1),
        "a seal": keys.seal_key(CELL, 1),  # S0's epoch is sealed: its seal is read first
    }[vanishes]
    bucket.on_get[trigger] = collection_by_epoch_2(bucket)
    result, rows = run(bucket, 3, tmp_path)
    assert rows == [VALUES[t] for t in range(1, 5)]
    assert result.last_txid == 4 and result.snapshot == (2, 4)
    assert result.sealed == [2] and read_seal(bucket, CELL, 2) == 4
    assert bucket.listings == 2 and len(sleeps) == 1
    assert read_seal(bucket, CELL, 1) is None  # collected, never re-created


def test_restore_without_a_race_reads_the_chain(tmp_path: Path, sleeps: list[float]) -> None:
    bucket = RacingBucket()
    history(bucket)
    result, rows = run(bucket, 3, tmp_path)
    assert rows == [VALUES[t] for t in range(1, 5)]
    assert result.snapshot == (1, 2) and result.sealed == [2] and result.batches_read == 2
    assert bucket.listings == 1 and sleeps == []


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(
            lambda b: put_batch(b, 2, 3, 4), id="epochs below a snapshot deleted, no snapshot"
        ),
        pytest.param(
            lambda b: (put_snapshot(b, 2, 4, b"not a snapshot"), put_batch(b, 2, 5, 5)),
            id="the only snapshot corrupt, the chain below collected",
        ),
        pytest.param(
            lambda b: (put_batch(b, 1, 1, 2), put_seal(b, 1, 4)),
            id="a sealed epoch ending below its seal",
        ),
    ],
)
def test_a_hole_that_stays_fails_the_restore_and_seals_nothing(
    tmp_path: Path, sleeps: list[float], setup: Callable[[RacingBucket], object]
) -> None:
    bucket = RacingBucket()
    setup(bucket)
    before = bucket.keys()
    with pytest.raises(RestoreHole, match=r"missing|rebuild only"):
        run(bucket, 3, tmp_path)
    assert bucket.keys() == before
    assert bucket.listings == MAX_LISTINGS and len(sleeps) == MAX_LISTINGS - 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not a snapshot", id="corrupt"),
        pytest.param(encode_snapshot(CELL, 2, 3, image(3)), id="holds another txid"),
    ],
)
def test_an_unusable_snapshot_is_skipped_when_the_chain_is_there(
    tmp_path: Path, sleeps: list[float], body: bytes
) -> None:
    bucket = RacingBucket()
    history(bucket)
    put_snapshot(bucket, 2, 4, body)
    result, rows = run(bucket, 3, tmp_path)
    assert rows == [VALUES[t] for t in range(1, 5)]
    assert result.snapshot == (1, 2) and bucket.listings == 1


def test_collection_checks_ownership_then_deletes_in_order(sleeps: list[float]) -> None:
    """Nothing is deleted unless own.json still names the snapshot's activation; the
    deletes go batches, seals, older snapshots, and stop when cancelled."""
    bucket = RacingBucket()
    s0 = history(bucket)
    put_seal(bucket, 2, 4)
    s1 = put_snapshot(bucket, 3, 4)
    put_batch(bucket, 3, 5, 5)
    everything = bucket.keys()
    assert collect_garbage(bucket, CELL, 3, 4, owns=lambda: False) == 0
    assert bucket.keys() == everything
    checks = iter(range(100))
    assert collect_garbage(
        bucket, CELL, 3, 4, owns=lambda: True, cancelled=lambda: next(checks) > 2
    )
    assert everything - bucket.keys() == {
        keys.batch_key(CELL, 1, 1, 1),
        keys.batch_key(CELL, 1, 2, 2),
    }
    assert collect_garbage(bucket, CELL, 3, 4, owns=lambda: True) == 5
    assert bucket.keys() == {s1, keys.batch_key(CELL, 3, 5, 5)}
    assert s0 not in everything - {s0} and s0 not in bucket.keys()  # noqa: SIM118


def test_a_superseded_restore_fails_instead_of_sealing_at_zero(
    tmp_path: Path, sleeps: list[float]
) -> None:
    bucket = RacingBucket()
    put_snapshot(bucket, 4, 4)
    put_batch(bucket, 4, 5, 5)
    before = bucket.keys()
    try:
        with pytest.raises(RestoreHole):
            run(bucket, 3, tmp_path)
    finally:
        assert bucket.keys() == before, sorted(bucket.keys() - before)
