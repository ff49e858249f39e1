"""A store far away: latency added to every request of a bucket, as a cloud bucket in the
same region answers (20 ms a PUT, 10 ms a GET), in front of the loopback store.

The latency is added in the client's bucket layer (a wrapper around the node's
:class:`~cellactors.persistence.store.bucket.Bucket`) rather than by an HTTP proxy: the
requests wait exactly as they would on the network, without a proxy process spending the
benchmark's two CPUs to forward them."""

from __future__ import annotations

import time
from collections.abc import Iterator

from cellactors.core.types import Guard
from cellactors.persistence.store.bucket import Bucket, CasResult, ObjectInfo, StoredObject

#: What a cloud bucket in the same region adds to each request (seconds).
PUT_S = 0.020
GET_S = 0.010


class FarBucket(Bucket):
    """``inner`` with ``put_s`` added to each write and ``get_s`` to each read, listing and
    delete (before the request is sent, as the way there and back would)."""

    def __init__(self, inner: Bucket, put_s: float = PUT_S, get_s: float = GET_S) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.put_s = put_s
        self.get_s = get_s

    def get(self, key: str) -> StoredObject | None:
        time.sleep(self.get_s)  # the simulated network's delay, not a synchronization
        return self.inner.get(key)

    def get_once(self, key: str) -> StoredObject | None:
        time.sleep(self.get_s)
        return self.inner.get_once(key)

    def head(self, key: str) -> ObjectInfo | None:
        time.sleep(self.get_s)
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        time.sleep(self.put_s)
        return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        time.sleep(self.put_s)
        return self.inner.put_cas(key, body, guard)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        time.sleep(self.get_s)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        time.sleep(self.get_s)
        self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
