"""A gate in front of a node's bucket that a self-fence closes.

From the moment a node fences itself it must send nothing more to the bucket: no batch, no
snapshot, no collection, no ``own.json`` or seal write, no lease. Work already queued in
threads (an upload retrying, a snapshot job, a release) reaches the bucket only through this
gate, which then refuses every request at once, without sending it. A request already on the
wire when the gate closes cannot be recalled; ``cellactors serve`` exits right after a fence,
which abandons it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from cellactors.errors import Fenced
from cellactors.persistence.store.bucket import Bucket, CasResult, Guard, ObjectInfo, StoredObject

# The gate of the request this thread is making, so that a dialect's own retries (botocore
# retries a failed PUT inside one call) are refused too once the gate closes mid-call.
_local = threading.local()


def refuse_if_fenced(**_kwargs: Any) -> None:
    """A hook a dialect runs before sending each HTTP request (retries included)."""
    gate: GatedBucket | None = getattr(_local, "gate", None)
    if gate is not None and gate.closed:
        gate.refused += 1
        raise Fenced(f"request refused: the node fenced itself ({gate.reason})")


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

    @contextlib.contextmanager
    def _through(self, what: str, key: str) -> Iterator[None]:
        """Refuse at once when closed; else mark this thread's request as passing through
        this gate, so the dialect's own retries check it too."""
        if self._closed.is_set():
            self.refused += 1
            raise Fenced(f"{what} {key} refused: the node fenced itself ({self.reason})")
        previous = getattr(_local, "gate", None)
        _local.gate = self
        try:
            yield
        finally:
            _local.gate = previous

    def get(self, key: str) -> StoredObject | None:
        with self._through("GET", key):
            return self.inner.get(key)

    def get_once(self, key: str) -> StoredObject | None:
        with self._through("GET", key):
            return self.inner.get_once(key)

    def head(self, key: str) -> ObjectInfo | None:
        with self._through("HEAD", key):
            return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        with self._through("PUT", key):
            return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        with self._through("conditional PUT", key):
            return self.inner.put_cas(key, body, guard)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._through("LIST", prefix):
            # Materialised inside the gate: pages are fetched as the listing is read.
            return iter(list(self.inner.list(prefix)))

    def delete(self, key: str) -> None:
        with self._through("DELETE", key):
            self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
