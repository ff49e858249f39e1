"""A bucket wrapper that counts requests by kind, for metrics and exact operation-count
tests (reads per call, writes per call, requests per idle second)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

from cellactors.errors import AmbiguousWrite
from cellactors.persistence.store.bucket import (
    Bucket,
    CasResult,
    Guard,
    ObjectInfo,
    Rejected,
    StoredObject,
)

T = TypeVar("T")

#: Outcomes of one request, as :meth:`MeteredBucket.outcomes` counts them.
OK = "ok"
ABSENT = "absent"  # a read of a key that does not exist
REJECTED = "rejected"  # a conditional write whose precondition failed
AMBIGUOUS = "ambiguous"  # a write that may or may not have committed
ERROR = "error"  # any other failure (refused, unreachable, fenced)
OUTCOMES = (OK, ABSENT, REJECTED, AMBIGUOUS, ERROR)


def key_kind(key: str) -> str:
    """A coarse class of key: own, lease, batch, seal, snapshot, peer-auth, probe, wake,
    other."""
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
    if key.startswith("wake/"):
        return "wake"
    return "other"


class MeteredBucket(Bucket):
    """Counts ``(operation, key kind)`` pairs of every request passed to ``inner`` when it is
    sent, and ``(operation, key kind, outcome)`` triples when it finishes."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.counts: Counter[tuple[str, str]] = Counter()
        self.finished: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str, key: str) -> str:
        kind = key_kind(key)
        with self._lock:
            self.counts[(op, kind)] += 1
        return kind

    def _finish(self, op: str, kind: str, outcome: str) -> None:
        with self._lock:
            self.finished[(op, kind, outcome)] += 1

    def _metered(self, op: str, key: str, send: Callable[[], T], judge: Callable[[T], str]) -> T:
        kind = self._count(op, key)
        try:
            result = send()
        except AmbiguousWrite:
            self._finish(op, kind, AMBIGUOUS)
            raise
        except BaseException:
            self._finish(op, kind, ERROR)
            raise
        self._finish(op, kind, judge(result))
        return result

    def snapshot(self) -> Counter[tuple[str, str]]:
        """Requests sent so far, by ``(operation, key kind)``."""
        with self._lock:
            return Counter(self.counts)

    def outcomes(self) -> Counter[tuple[str, str, str]]:
        """Requests finished so far, by ``(operation, key kind, outcome)``."""
        with self._lock:
            return Counter(self.finished)

    def get(self, key: str) -> StoredObject | None:
        return self._metered("get", key, lambda: self.inner.get(key), _found)

    def get_once(self, key: str) -> StoredObject | None:
        return self._metered("get", key, lambda: self.inner.get_once(key), _found)

    def head(self, key: str) -> ObjectInfo | None:
        return self._metered("head", key, lambda: self.inner.head(key), _found)

    def put(self, key: str, body: bytes) -> str:
        return self._metered("put", key, lambda: self.inner.put(key, body), _ok)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        return self._metered("put_cas", key, lambda: self.inner.put_cas(key, body, guard), _cas)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        kind = self._count("list", prefix)
        return self._listing(prefix, kind)

    def _listing(self, prefix: str, kind: str) -> Iterator[ObjectInfo]:
        """The inner listing; its outcome is known once it is exhausted, fails or is
        abandoned (an abandoned listing counts as ``ok``: what was read, was read)."""
        outcome = OK
        try:
            yield from self.inner.list(prefix)
        except BaseException as err:
            outcome = ERROR if not isinstance(err, GeneratorExit) else OK
            raise
        finally:
            self._finish("list", kind, outcome)

    def delete(self, key: str) -> None:
        self._metered("delete", key, lambda: self.inner.delete(key), _ok)

    def close(self) -> None:
        self.inner.close()


def _ok(_result: object) -> str:
    return OK


def _found(result: object) -> str:
    return ABSENT if result is None else OK


def _cas(result: CasResult) -> str:
    return REJECTED if isinstance(result, Rejected) else OK
