"""The replicator's pipeline: a batch's PUT leaves while the previous batch's re-read is
still out, never before the previous PUT has landed, and acknowledgements stay in txid
order, each after its own batch's re-read."""

from __future__ import annotations

import threading
import time

from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket, HangingBucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import active_of, eventually, make_node

CELL = "Counter:a"


class HeldRereads(CuttableBucket):
    """Holds every read of ``own.json`` while ``armed``, until ``release``; logs the batch
    PUTs that landed."""

    def __init__(self, inner: S3Bucket) -> None:
        super().__init__(inner)
        self.armed = False
        self.release = threading.Event()
        self.held = threading.Event()
        self.batches: list[str] = []

    def get(self, key):  # type: ignore[no-untyped-def]
        if self.armed and key.endswith("own.json"):
            self.held.set()
            self.release.wait(30)
        return self.inner.get(key)

    def put(self, key, body):  # type: ignore[no-untyped-def]
        token = self.inner.put(key, body)
        if key.endswith(".batch"):
            self.batches.append(key)
        return token


def _in_thread(fn: object, results: list[object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.append(fn()))  # type: ignore[operator]
    thread.start()
    return thread


def test_the_next_batch_leaves_during_the_previous_reread(sw_bucket: S3Bucket) -> None:
    store = HeldRereads(sw_bucket)
    node = make_node(store, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        store.armed = True
        first: list[object] = []
        second: list[object] = []
        a = _in_thread(lambda: cell.increment("x"), first)
        assert store.held.wait(10)  # the first batch landed; its re-read is held
        landed = len(store.batches)
        b = _in_thread(lambda: cell.increment("x"), second)
        # The second batch is PUT while the first's re-read is still out ...
        eventually(lambda: len(store.batches) == landed + 1)
        # ... and neither answer leaves before the re-reads return.
        assert first == [] and second == []
        store.armed = False
        store.release.set()
        a.join(10)
        b.join(10)
        assert first == [2] and second == [3]
        assert cell.get("x") == 3
    finally:
        store.release.set()
        node.stop()


def test_a_batch_never_leaves_before_the_previous_put_landed(sw_bucket: S3Bucket) -> None:
    store = HangingBucket(sw_bucket)
    node = make_node(store, "n1")
    puts: list[str] = []
    inner_put = store.put

    def counting_put(key: str, body: bytes) -> str:
        if key.endswith(".batch"):
            puts.append(key)
        return str(inner_put(key, body))  # type: ignore[no-untyped-call]

    store.put = counting_put  # type: ignore[method-assign]
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        channel = active_of(node, CELL).runtime.channel
        sent, base = len(puts), channel.committed
        store.hang = True
        first: list[object] = []
        second: list[object] = []
        a = _in_thread(lambda: cell.increment("x"), first)
        eventually(lambda: len(puts) == sent + 1)  # the first PUT is out, and hangs
        b = _in_thread(lambda: cell.increment("x"), second)
        eventually(lambda: channel.committed == base + 2)  # the second write is committed
        deadline = time.monotonic() + 0.3  # and for a while no second PUT leaves
        while time.monotonic() < deadline:
            assert len(puts) == sent + 1
            time.sleep(0.01)  # polling an absence, not synchronizing
        store.hang = False
        store.release.set()
        a.join(10)
        b.join(10)
        assert first == [2] and second == [3]
        assert len(puts) == sent + 2
    finally:
        store.release.set()
        node.stop()
