"""Restore never restores around a hole (the snapshot-GC race of a takeover), on the real
store: a listing taken before a snapshot landed and before its collection deleted what the
listing shows is listed again; a torn tail batch is dropped whole; a missing middle batch
fails the activation instead of sealing below acknowledged writes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
from collections.abc import Iterator

import pytest

from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.core import keys
from cellactors.errors import BucketError, RestoreHole
from cellactors.persistence.celldb.database import CellDatabase, dump
from cellactors.persistence.history.restore import fetch_bodies, restore
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.bucket import Bucket, ObjectInfo, StoredObject
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.proxy import FaultProxy
from tests.helpers.cells import Counter
from tests.helpers.runtime import cell_dump, eventually, make_node
from tests.helpers.stores import make_s3_bucket

CELL = "Counter:a"
ROOT = keys.cell_root(CELL)


class StaleFirstListing(Bucket):
    """The first listing of the cell answers ``stale`` (what a restorer saw before a
    snapshot landed and its collection ran); every other request goes to the real bucket."""

    def __init__(self, inner: Bucket, stale: list[ObjectInfo]) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.stale: list[ObjectInfo] | None = stale
        self.listings = 0

    def get(self, key: str):  # type: ignore[no-untyped-def]
        return self.inner.get(key)

    def head(self, key: str):  # type: ignore[no-untyped-def]
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        return self.inner.put(key, body)

    def put_cas(self, key, body, guard):  # type: ignore[no-untyped-def]
        return self.inner.put_cas(key, body, guard)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.listings += 1
        if self.stale is not None and prefix == ROOT:
            stale, self.stale = self.stale, None
            return iter(stale)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def listing(bucket: Bucket) -> list[ObjectInfo]:
    return list(bucket.list(ROOT))


def two_epochs_with_snapshots(bucket: S3Bucket) -> tuple[list[ObjectInfo], dict[str, object]]:
    """Epoch 1 writes and snapshots; epoch 2 (another node) writes, snapshots and collects
    epoch 1 and its snapshot. Returns the listing as it stood before epoch 2's snapshot
    landed (epoch 1's objects and epoch 2's batches) and the acknowledged state."""
    policy = SnapshotPolicy(every_txids=4, retain_s=0)
    a = make_node(bucket, "na", snapshots=policy)
    try:
        for _ in range(6):
            a.cell(Counter, "a").increment("x")
        eventually(lambda: any("/snap/" in i.key for i in listing(bucket)), timeout=10)
        a.drain()
    finally:
        a.stop()
    before_second = {i.key: i for i in listing(bucket)}
    b = make_node(bucket, "nb", snapshots=policy)
    try:
        for _ in range(6):
            b.cell(Counter, "a").increment("x")

        def collected() -> bool:
            now = [i.key for i in listing(bucket)]
            return any(".e2.snap" in k for k in now) and not any("/e1/" in k for k in now)

        eventually(collected, timeout=10)
        state = cell_dump(b, CELL)
        e2_batches = [i for i in listing(bucket) if "/e2/" in i.key]
        b.drain()
    finally:
        b.stop()
    stale = sorted([*before_second.values(), *e2_batches], key=lambda i: i.key)
    assert not any(".e2.snap" in i.key for i in stale)
    return stale, state


def test_restore_lists_again_when_a_collection_deleted_what_it_listed(
    sw_bucket: S3Bucket, tmp_path: pytest.TempPathFactory
) -> None:
    stale, state = two_epochs_with_snapshots(sw_bucket)
    # The stale listing names epoch 1's snapshot and batches, all collected since.
    assert not any(i.key == s.key for s in stale if "/e1/" in s.key for i in listing(sw_bucket))
    gated = StaleFirstListing(sw_bucket, stale)
    db = CellDatabase(tmp_path / "r.db")  # type: ignore[operator]
    result = restore(gated, CELL, 4, db)
    assert gated.listings == 2  # the vanished snapshot made it list again
    assert result.snapshot is not None and result.snapshot[0] == 2
    assert dump(db.db) == state  # every acknowledged write, nothing sealed around a hole
    assert result.last_txid == 13  # table creation + 12 increments
    assert read_seal(sw_bucket, CELL, 3) == 13  # epoch 3 (never opened) sealed at the top
    db.close()


def three_writes_then_killed(bucket: Bucket) -> dict[str, object]:
    """Epoch 1 (node ``na``) acknowledges three increments (4 batches with the table's
    creation) and dies without releasing; the cell's state then."""
    a = make_node(bucket, "na")
    try:
        for _ in range(3):
            a.cell(Counter, "a").increment("x")
        return cell_dump(a, CELL)
    finally:
        a.lease.proxy().pause().get()  # dies without releasing
        a.fence("test: killed")


def test_a_torn_tail_batch_is_dropped_whole(sw_bucket: S3Bucket, tmp_path: object) -> None:
    state = three_writes_then_killed(sw_bucket)
    # A crash mid-upload left a torn object where the next batch would be.
    sw_bucket.put(keys.batch_key(CELL, 1, 5, 5), b"\x82\xa1v")
    db = CellDatabase(tmp_path / "t.db")  # type: ignore[operator]
    result = restore(sw_bucket, CELL, 2, db)
    assert result.last_txid == 4 and dump(db.db) == state
    assert read_seal(sw_bucket, CELL, 1) == 4
    db.close()


def test_a_missing_middle_batch_fails_instead_of_sealing_below_it(
    sw_bucket: S3Bucket, tmp_path: object
) -> None:
    three_writes_then_killed(sw_bucket)
    batches = sorted(i.key for i in listing(sw_bucket) if i.key.endswith(".batch"))
    assert len(batches) in (3, 4)  # on_activate's txid 1 rides with the first write's, mostly
    sw_bucket.delete(batches[-2])  # a middle one: a later batch remains
    db = CellDatabase(tmp_path / "m.db")  # type: ignore[operator]
    with pytest.raises(RestoreHole, match="missing"):
        restore(sw_bucket, CELL, 2, db)
    assert read_seal(sw_bucket, CELL, 1) is None  # nothing sealed
    db.discard()


def test_a_store_error_on_the_tail_batch_fails_instead_of_sealing_below_it(
    seaweed: SeaweedServer, tmp_path: object
) -> None:
    # The last acknowledged batch of the previous owner cannot be read (the store answers
    # 500 to every try). It is not torn: nothing proves it was never acknowledged. The
    # restore must fail (and a later one succeed), never drop it and seal epoch 1 below it.
    bucket = make_s3_bucket(seaweed.endpoint)
    state = three_writes_then_killed(bucket)
    last = max(i.key for i in listing(bucket) if i.key.endswith(".batch"))
    with FaultProxy(seaweed.endpoint, "store") as proxy:
        flaky = S3Bucket(bucket.bucket, endpoint=proxy.endpoint, timeout=3)
        rule = proxy.fail(500, "InternalError", method="GET", key=f"^{re.escape(last)}$")
        db = CellDatabase(tmp_path / "e.db")  # type: ignore[operator]
        with pytest.raises(BucketError, match="InternalError"):
            restore(flaky, CELL, 2, db)
        db.discard()
        assert rule.applied > 1
        assert read_seal(bucket, CELL, 1) is None  # nothing sealed
        proxy.remove(rule)
        db = CellDatabase(tmp_path / "ok.db")  # type: ignore[operator]
        result = restore(flaky, CELL, 2, db)
        assert result.last_txid == 4 and dump(db.db) == state
        assert read_seal(bucket, CELL, 1) == 4
        db.close()


class SlowFailingGets:
    """GETs that wait until ``release`` (a store slower than any reader), but the first
    key's fails at once like a store error, so the reader stops while the other reads are
    still under way. Counts them."""

    def __init__(self) -> None:
        self.gets = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def get(self, key: str) -> StoredObject | None:
        with self._lock:
            self.gets += 1
        if key == "k0":
            raise BucketError("GET k0 failed: HTTP 500 (test)")
        self.release.wait(10)
        return StoredObject(body=b"x", token='"e"')


def test_reads_queued_for_a_restore_that_failed_are_cancelled_not_sent() -> None:
    # A store error on the first batch fails the restore; the 63 reads queued behind it
    # must not still be sent (on a shared pool they would delay every other restore).
    store = SlowFailingGets()
    pool = concurrent.futures.ThreadPoolExecutor(4)
    keys_in_order = [f"k{i}" for i in range(200)]
    try:
        with (
            pytest.raises(BucketError, match="k0"),
            contextlib.closing(fetch_bodies(store, keys_in_order, window=64, pool=pool)) as bodies,  # type: ignore[arg-type]
        ):
            for _body in bodies:
                pass
    finally:
        store.release.set()  # the reads under way end only now, after the reader closed
    pool.shutdown(wait=True)
    # The 4 reads under way when it failed, and the one the failed read's worker took
    # next; without the cancel every queued read (64) is sent.
    assert store.gets <= 4 + 4


class VanishesOnce(StaleFirstListing):
    """Reads of ``key`` find nothing the first time (a collection raced the restore), and
    the object is back for the next listing."""

    def __init__(self, inner: Bucket, key: str) -> None:
        super().__init__(inner, [])
        self.stale = None
        self.key: str | None = key

    def get(self, key: str):  # type: ignore[no-untyped-def]
        if key == self.key:
            self.key = None
            return None
        return self.inner.get(key)


def test_a_batch_vanishing_after_others_were_applied_rebuilds_from_empty(
    sw_bucket: S3Bucket, tmp_path: object
) -> None:
    state = three_writes_then_killed(sw_bucket)
    batches = sorted(i.key for i in listing(sw_bucket) if i.key.endswith(".batch"))
    flaky = VanishesOnce(sw_bucket, batches[2])  # after two batches were applied
    db = CellDatabase(tmp_path / "v.db")  # type: ignore[operator]
    emptied: list[list[str]] = []
    clear = db.clear

    def spy() -> None:
        emptied.append(db.db.table_names())
        clear()

    db.clear = spy  # type: ignore[method-assign]
    result = restore(flaky, CELL, 2, db)
    assert flaky.listings == 2 and flaky.key is None
    assert emptied and "counts" in emptied[0]  # part of the chain was applied, then dropped
    assert result.last_txid == 4 and dump(db.db) == state
    db.close()


def test_an_emptied_database_is_a_new_one_and_captures_again(tmp_path: object) -> None:
    db = CellDatabase(tmp_path / "c.db")  # type: ignore[operator]
    db.run(lambda: db.db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)"))
    db.run(lambda: db.db.execute("INSERT INTO t VALUES ('a', 1)"))
    db.clear()
    assert db.db.table_names() == []
    _, changes = db.run(lambda: db.db.execute("CREATE TABLE u (x)"))
    assert changes.schema_changed
    _, changes = db.run(lambda: db.db.execute("INSERT INTO u VALUES (1)"))
    assert not changes.empty  # capture triggers were installed for the new table
    db.close()
