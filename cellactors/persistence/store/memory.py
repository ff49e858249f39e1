"""An in-memory bucket that enforces conditional writes atomically.

For the pure-core simulations and single-process unit tests only: it has no network, so it
cannot show what a real store does; the integration tests use real servers.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

from cellactors.persistence.store.bucket import (
    Absent,
    Applied,
    Bucket,
    CasResult,
    Guard,
    ObjectInfo,
    Rejected,
    StoredObject,
)


class MemoryBucket(Bucket):
    """A dict of key -> (body, token, modified ms) behind one lock."""

    def __init__(self, name: str = "memory") -> None:
        self.spec = f"memory://{name}"
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, str, int]] = {}
        self._tokens = itertools.count(1)

    def _stamp(self, body: bytes) -> tuple[bytes, str, int]:
        return (bytes(body), f"m{next(self._tokens)}", int(time.time() * 1000))

    def get(self, key: str) -> StoredObject | None:
        with self._lock:
            item = self._objects.get(key)
        return None if item is None else StoredObject(item[0], item[1])

    def head(self, key: str) -> ObjectInfo | None:
        with self._lock:
            item = self._objects.get(key)
        return None if item is None else ObjectInfo(key, item[1], len(item[0]), item[2])

    def put(self, key: str, body: bytes) -> str:
        with self._lock:
            item = self._objects[key] = self._stamp(body)
        return item[1]

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        with self._lock:
            current = self._objects.get(key)
            if isinstance(guard, Absent):
                if current is not None:
                    return Rejected("exists")
            elif current is None or current[1] != guard.token:
                return Rejected("mismatch")
            item = self._objects[key] = self._stamp(body)
        return Applied(item[1])

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._lock:
            items = sorted((k, v) for k, v in self._objects.items() if k.startswith(prefix))
        for key, (body, token, modified) in items:
            yield ObjectInfo(key, token, len(body), modified)

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)
