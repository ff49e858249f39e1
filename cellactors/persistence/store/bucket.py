"""The one interface every bucket dialect implements.

A bucket is the fleet's control plane and durability root. Keys passed to a :class:`Bucket`
are relative to the fleet prefix; the dialect adds the prefix, so no caller can build a key
outside it.

Conditional writes have three outcomes (see docs/protocol.md, "Conditional writes"):
:class:`Applied` (written, with the new token), :class:`Rejected` (the precondition failed),
and :class:`~cellactors.errors.AmbiguousWrite` raised when the write may or may not have
committed.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cellactors.clock import StoreClock
from cellactors.core.types import Absent, Applied, CasResult, Guard, Match, Rejected

__all__ = [
    "MAX_CAS_BODY",
    "Absent",
    "Applied",
    "Bucket",
    "CasResult",
    "Guard",
    "Match",
    "ObjectInfo",
    "Rejected",
    "StoredObject",
    "join_prefix",
    "strip_prefix",
]

# Conditional bodies are tiny JSON records; a cap keeps GCS on single-request uploads.
MAX_CAS_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class StoredObject:
    """An object's body with the token that guards its next conditional overwrite."""

    body: bytes
    token: str


@dataclass(frozen=True)
class ObjectInfo:
    """Listing/head metadata for one object; ``key`` is relative to the fleet prefix."""

    key: str
    token: str
    size: int
    last_modified_ms: int


def folder_cursor(prefix: str, name: str) -> str:
    """Where a listing resumes after folder ``prefix + name + "/"``: a key above every key
    in it. Stores that order folders by byte (S3, GCS) and by name (SeaweedFS) both resume
    right after that folder."""
    return f"{prefix}{name}/\uffff"


def join_prefix(prefix: str, key: str) -> str:
    """Return the absolute store key for ``key`` under ``prefix`` (which may be empty)."""
    return f"{prefix}/{key}" if prefix else key


def strip_prefix(prefix: str, full_key: str) -> str:
    """Inverse of :func:`join_prefix` for keys returned by a listing."""
    if not prefix:
        return full_key
    head = prefix + "/"
    if not full_key.startswith(head):
        raise ValueError(f"key {full_key!r} is outside prefix {prefix!r}")
    return full_key[len(head) :]


class Bucket(abc.ABC):
    """A bucket (plus key prefix) in one dialect.

    Implementations create their network clients once and reuse them; they are safe to call
    from several threads at once.
    """

    #: Human-readable location, e.g. ``s3://bucket/prefix``.
    spec: str

    @property
    def clock(self) -> StoreClock:
        """The store's clock as this process knows it, fed by the ``Date`` of this store's
        answers (:mod:`cellactors.clock`). A wrapper (an object with an ``inner`` bucket)
        shares its inner bucket's; a dialect that feeds none has one that knows nothing, so
        its readings fall back to the wall clock."""
        inner = getattr(self, "inner", None)
        if isinstance(inner, Bucket):
            return inner.clock
        own = self.__dict__.get("_own_clock")
        if own is None:
            own = self.__dict__["_own_clock"] = StoreClock(getattr(self, "spec", "bucket"))
        return own

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject | None:
        """Read an object, or ``None`` when it does not exist."""

    def get_once(self, key: str) -> StoredObject | None:
        """Like :meth:`get`, but one request without the client's own retries, for callers
        that retry on a schedule of their own (the lease must not block past its deadline)."""
        return self.get(key)

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Read an object's metadata, or ``None`` when it does not exist."""

    @abc.abstractmethod
    def put(self, key: str, body: bytes) -> str:
        """Write unconditionally (retries allowed); return the new token."""

    @abc.abstractmethod
    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        """Write only if ``guard`` holds. Never retried by the client.

        Raises :class:`~cellactors.errors.AmbiguousWrite` when the outcome is unknown.
        """

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """List objects whose relative key starts with ``prefix``, in key order."""

    def list_pages(self, prefix: str, page_size: int) -> Iterator[Sequence[ObjectInfo]]:
        """The listing of ``prefix`` as the store pages it, at most ``page_size`` objects a
        page (``cellactors qualify`` checks that continuation loses nothing). This generic
        version is one page; the dialects ask the store for pages of that size."""
        yield list(self.list(prefix))

    def list_folders(self, prefix: str, start_after: str = "") -> Iterator[str]:
        """The distinct names one level below ``prefix`` (``cells/`` gives each cell id),
        in key order, starting after the folder ``start_after``. This generic version reads
        the whole listing; the dialects override it with a delimiter listing that starts at
        the cursor."""
        last: str | None = None
        for info in self.list(prefix):
            name, sep, _ = info.key[len(prefix) :].partition("/")
            if not sep or name == last or (start_after and name + "/" <= start_after + "/"):
                continue
            last = name
            yield name

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""

    def exists(self) -> bool:
        """Whether the bucket itself exists. Some stores (SeaweedFS) create a bucket on its
        first PUT, so ``cellactors qualify`` asks before writing anything. This generic
        version (a bucket held in memory) always exists."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release network resources (optional)."""
