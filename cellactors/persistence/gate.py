"""A gate in front of a node's bucket that a self-fence closes.

From the moment a node fences itself it must send nothing more to the bucket: no batch, no
snapshot, no collection, no ``own.json`` or seal write, no lease. Work already queued in
threads (an upload retrying, a snapshot job, a release) reaches the bucket only through this
gate, which then refuses every request at once, without sending it. A request already on the
wire when the gate closes cannot be recalled; ``cellactors serve`` exits right after a fence,
which abandons it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from cellactors.errors import BucketError
from cellactors.persistence.bucket import Bucket, CasResult, Guard, ObjectInfo, StoredObject


class Fenced(BucketError):
    """The node fenced itself: the request was refused before it was sent."""


class GatedBucket(Bucket):
    """Passes requests to ``inner`` until :meth:`close`; refuses every one after it."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self._closed = threading.Event()
        self.reason = ""
        self.refused = 0

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close_gate(self, reason: str) -> None:
        """Refuse every later request (idempotent; the first reason is kept)."""
        if not self._closed.is_set():
            self.reason = reason
            self._closed.set()

    def _check(self, what: str, key: str) -> None:
        if self._closed.is_set():
            self.refused += 1
            raise Fenced(f"{what} {key} refused: the node fenced itself ({self.reason})")

    def get(self, key: str) -> StoredObject | None:
        self._check("GET", key)
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._check("HEAD", key)
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        self._check("PUT", key)
        return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        self._check("conditional PUT", key)
        return self.inner.put_cas(key, body, guard)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._check("LIST", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._check("DELETE", key)
        self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
