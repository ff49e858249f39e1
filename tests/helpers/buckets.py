"""Buckets that misbehave on purpose (cut off, hanging) and request tallies of a node."""

from __future__ import annotations

import threading
from collections import Counter as Tally

from cellactors import Node
from cellactors.persistence.store.bucket import Bucket


def delta(node: Node, before: Tally[tuple[str, str]]) -> Tally[tuple[str, str]]:
    after = node.bucket.snapshot()
    after.subtract(before)
    return Tally({k: v for k, v in after.items() if v and k[1] != "lease"})


#: What the bucket requests of a feed are counted as (``key_kind``): LISTs of the cell's
#: folder are "other"; the rest are the cell's own objects.
FEED_KINDS = ("other", "own", "batch", "seal", "snapshot")


def feed_requests(tally: Tally[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The requests of ``tally`` that a change feed's reads make."""
    return {k: v for k, v in tally.items() if k[1] in FEED_KINDS}


class CuttableBucket(Bucket):
    """Delegates to a real bucket until ``cut``; then every request fails like a partition."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            from cellactors.errors import BucketError

            raise BucketError("partitioned from the store (test)")

    def get(self, key):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.get(key)

    def head(self, key):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.head(key)

    def put(self, key, body):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.put(key, body)

    def put_cas(self, key, body, guard):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.put_cas(key, body, guard)

    def list(self, prefix):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.list(prefix)

    def delete(self, key):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.delete(key)


class HangingBucket(CuttableBucket):
    """Batch uploads hang until ``release`` is set, like a store that stops answering."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.hang = False
        self.release = threading.Event()

    def put(self, key, body):  # type: ignore[no-untyped-def]
        if self.hang and key.endswith(".batch"):
            self.release.wait(30)
        return self.inner.put(key, body)


class GatedLists(CuttableBucket):
    """While ``closed``, a LIST under ``prefix`` waits for a pass the test gives
    (:meth:`allow`), so the test decides when each polling round goes on; ``waiting`` and
    ``passed`` say how many LISTs wait now and went through the closed gate."""

    def __init__(self, inner: Bucket, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix
        self.closed = False
        self.waiting = 0
        self.passed = 0
        self._passes = 0
        self._cond = threading.Condition()

    def close(self) -> None:
        with self._cond:
            self.closed = True

    def open(self) -> None:
        with self._cond:
            self.closed = False
            self._cond.notify_all()

    def allow(self, n: int = 1) -> None:
        """Let ``n`` more waiting (or future) LISTs through."""
        with self._cond:
            self._passes += n
            self._cond.notify_all()

    def list(self, prefix):  # type: ignore[no-untyped-def]
        if prefix.startswith(self.prefix):
            with self._cond:
                if self.closed:
                    self.waiting += 1
                    self._cond.wait_for(lambda: self._passes > 0 or not self.closed, timeout=60)
                    self.waiting -= 1
                    if self._passes > 0:
                        self._passes -= 1
                        self.passed += 1
        return self.inner.list(prefix)
