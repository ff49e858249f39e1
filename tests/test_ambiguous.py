"""Ambiguous conditional writes (timeouts, resets, 5xx) are reconciled by reading back, in
every place the runtime makes one: acquire, seal, lease renewal. Against SeaweedFS, with a
wrapper that commits the write and then loses the answer, or loses the request outright."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cellactors.core import keys
from cellactors.errors import AmbiguousWrite
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.bucket import Bucket, CasResult, Guard
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually, make_node, owner_epoch

CELL = "Counter:a"


class LossyBucket(CuttableBucket):
    """Conditional writes to keys matching ``which`` become ambiguous ``times`` times: with
    ``commit`` the write lands and only the answer is lost, without it nothing lands."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.which: Callable[[str], bool] = lambda key: False
        self.times = 0
        self.commit = True
        self.lost = 0
        self._lock = threading.Lock()

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        with self._lock:
            lose = self.which(key) and self.times > 0
            if lose:
                self.times -= 1
                self.lost += 1
        if not lose:
            return self.inner.put_cas(key, body, guard)
        if self.commit:
            self.inner.put_cas(key, body, guard)
        raise AmbiguousWrite(f"answer to the conditional PUT of {key} lost (test)")


def test_acquire_whose_answer_is_lost_is_confirmed_by_reading_back(sw_bucket: S3Bucket) -> None:
    lossy = LossyBucket(sw_bucket)
    node = make_node(lossy, "n1")
    try:
        lossy.which, lossy.times = (lambda key: key.endswith("/own.json")), 1
        assert node.cell(Counter, "a").increment("x") == 1
        assert lossy.lost == 1
        assert owner_epoch(node, CELL) == ("n1", 1)  # applied once, not twice
    finally:
        node.stop()


def test_acquire_whose_request_is_lost_tries_again(sw_bucket: S3Bucket) -> None:
    lossy = LossyBucket(sw_bucket)
    node = make_node(lossy, "n1")
    try:
        lossy.which, lossy.times, lossy.commit = (lambda key: key.endswith("/own.json")), 2, False
        assert node.cell(Counter, "a").increment("x") == 1
        assert lossy.lost == 2
        assert owner_epoch(node, CELL) == ("n1", 1)
    finally:
        node.stop()


def test_seal_whose_answer_is_lost_is_confirmed_by_reading_back(sw_bucket: S3Bucket) -> None:
    lossy = LossyBucket(sw_bucket)
    a = make_node(lossy, "na")
    try:
        a.cell(Counter, "a").increment("x")
        a.drain()
        b = make_node(lossy, "nb")
        lossy.which, lossy.times = (lambda key: key.endswith(".seal.json")), 1
        assert b.cell(Counter, "a").get("x") == 1
        assert lossy.lost == 1
        assert read_seal(sw_bucket, CELL, 1) == 2
        b.stop()
    finally:
        a.stop()


def test_lease_renewal_whose_answer_is_lost_does_not_fence(sw_bucket: S3Bucket) -> None:
    lossy = LossyBucket(sw_bucket)
    fenced = threading.Event()
    node = make_node(lossy, "n1")
    node.on_fence = lambda reason: fenced.set()
    try:
        renewals = node.lease.proxy().renewals.get()
        lossy.which, lossy.times = (lambda key: key == keys.lease_key("n1")), 2
        eventually(lambda: lossy.lost == 2, timeout=15)
        eventually(lambda: node.lease.proxy().renewals.get() >= renewals + 3, timeout=15)
        assert not fenced.is_set()
        assert node.status == "serving"
    finally:
        node.stop()
