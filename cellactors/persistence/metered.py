"""A bucket wrapper that counts requests by kind, for metrics and exact operation-count
tests (reads per call, writes per call, requests per idle second)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from cellactors.persistence.bucket import Bucket, CasResult, Guard, ObjectInfo, StoredObject


def key_kind(key: str) -> str:
    """A coarse class of key: own, lease, batch, seal, snapshot, peer-auth, probe, other."""
    if key.endswith("/own.json"):
        return "own"
    if key.startswith("nodes/"):
        return "lease"
    if key.endswith(".batch"):
        return "batch"
    if key.endswith(".seal.json"):
        return "seal"
    if "/snap/" in key:
        return "snapshot"
    if key.startswith("fleet/"):
        return "peer-auth"
    if key.startswith("probe/"):
        return "probe"
    return "other"


class MeteredBucket(Bucket):
    """Counts ``(operation, key kind)`` pairs of every request passed to ``inner``."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str, key: str) -> None:
        with self._lock:
            self.counts[(op, key_kind(key))] += 1

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.counts)

    def get(self, key: str) -> StoredObject | None:
        self._count("get", key)
        return self.inner.get(key)

    def get_once(self, key: str) -> StoredObject | None:
        self._count("get", key)
        return self.inner.get_once(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._count("head", key)
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        self._count("put", key)
        return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        self._count("put_cas", key)
        return self.inner.put_cas(key, body, guard)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._count("list", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._count("delete", key)
        self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
