"""The call log: idempotency keys recorded in the cell's own database.

A keyed call that writes records ``key -> (method, digest of its arguments, msgpack of its
result)`` in ``_cellactors_calls``, inside the call's own transaction. The row is captured
like any other, so it ships in the same batch as the call's writes (no extra request) and is
restored with them on any node: a retry after a failover finds it. A call whose key is
recorded is answered from the record without running.

The table is the runtime's: user SQL may read it, but :mod:`cellactors.persistence.celldb.database`
refuses user writes to it. Retention is bounded by a window and a per-cell cap; expired and
excess rows are collected inside ordinary write transactions, a bounded number at a time.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Any

import msgpack

from cellactors.errors import ConfigError

#: The runtime's table in every cell database that has recorded a key.
CALLS_TABLE = "_cellactors_calls"
#: Names starting with this are the runtime's: user code may not create objects under it.
RESERVED_PREFIX = "_cellactors_"
#: Created by the first keyed write of a cell (a schema change: that batch carries an image).
#: ``seq`` orders rows by recording (oldest first); ``at_ms`` is the recording node's clock.
CALLS_SQL = (
    f"CREATE TABLE {CALLS_TABLE} ("
    "seq INTEGER PRIMARY KEY, "
    "key TEXT NOT NULL UNIQUE, "
    "method TEXT NOT NULL, "
    "args_sha256 TEXT NOT NULL, "
    "result BLOB NOT NULL, "
    "at_ms INTEGER NOT NULL)"
)
_T = f"main.{CALLS_TABLE}"

DEFAULT_WINDOW_S = 24 * 3600.0
DEFAULT_MAX_KEYS = 10_000
#: At most this many rows are collected per write transaction (bounded work per call).
COLLECT_PER_TXN = 64


@dataclass(frozen=True)
class Retention:
    """How long keys are remembered: ``window_s`` after recording, and at most ``max_keys``
    per cell (the oldest go first); ``per_txn`` bounds the rows one transaction collects."""

    window_s: float = DEFAULT_WINDOW_S
    max_keys: int = DEFAULT_MAX_KEYS
    per_txn: int = COLLECT_PER_TXN

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ConfigError(f"idempotency window must be positive, not {self.window_s}")
        if self.max_keys < 1:
            raise ConfigError(f"idempotency key cap must be at least 1, not {self.max_keys}")
        if self.per_txn < 2:  # one keyed write adds a row; collection must outpace it
            raise ConfigError(f"keys collected per transaction must be >= 2, not {self.per_txn}")

    def cutoff_ms(self, now: int) -> int:
        """Rows stamped at or before this are expired."""
        return now - int(self.window_s * 1000)


@dataclass(frozen=True)
class Recorded:
    """A recorded call: what ran under the key, and its msgpack-encoded result."""

    method: str
    args_sha256: str
    result: bytes


def encode(value: Any) -> bytes:
    """msgpack of ``value``; raises ``TypeError``/``ValueError``/``OverflowError`` when msgpack
    cannot carry it."""
    return bytes(msgpack.packb(value, use_bin_type=True, strict_types=False))


def decode(data: bytes) -> Any:
    """The value :func:`encode` encoded (tuples come back as lists)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _canonical(value: Any) -> Any:
    """``value`` with every map's entries in a fixed order (by their encoded key), so equal
    arguments digest equally whatever order a client wrote them in."""
    if isinstance(value, dict):
        items = [(_canonical(k), _canonical(v)) for k, v in value.items()]
        return dict(sorted(items, key=lambda kv: encode(kv[0])))
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def args_digest(
    arguments: dict[str, Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """SHA-256 (hex) of the call's arguments: of ``arguments`` (parameter name -> value, as
    bound to the method's signature, so positional and keyword spellings agree) when given,
    else of the raw ``args``/``kwargs``."""
    if arguments is not None:
        body = encode(["bound", _canonical(arguments)])
    else:
        body = encode(["raw", _canonical(list(args)), _canonical(kwargs)])
    return hashlib.sha256(body).hexdigest()


class CallLog:
    """Reads and writes ``_cellactors_calls`` for the runtime, over one cell's connection.

    Writes run inside the caller's transaction, with no authorizer installed. The row count
    is cached (the cap is checked on every keyed write); :meth:`forget` drops the cache
    whenever the table may have changed behind it (rollback, replay, image load).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._exists: bool | None = None  # None: unknown, read it again
        self._count = 0

    def forget(self) -> None:
        """The table may have changed outside this log: re-read it when next needed."""
        self._exists = None

    def exists(self) -> bool:
        """Whether the table exists (cached; read again after :meth:`forget`)."""
        if self._exists is None:
            found = self.conn.execute(
                "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                (CALLS_TABLE,),
            ).fetchone()
            self._exists = found is not None
            self._count = (
                int(self.conn.execute(f"SELECT count(*) FROM {_T}").fetchone()[0])
                if self._exists
                else 0
            )
        return self._exists

    def count(self) -> int:
        """Rows in the table (0 when it does not exist)."""
        return self._count if self.exists() else 0

    def lookup(self, key: str, retention: Retention, now: int) -> Recorded | None:
        """The unexpired record of ``key``, if any (an expired one counts as absent even
        before it is collected)."""
        if not self.exists():
            return None
        row = self.conn.execute(
            f"SELECT method, args_sha256, result FROM {_T} WHERE key = ? AND at_ms > ?",
            (key, retention.cutoff_ms(now)),
        ).fetchone()
        if row is None:
            return None
        return Recorded(str(row[0]), str(row[1]), bytes(row[2]))

    def record(self, key: str, method: str, digest: str, result: bytes, now: int) -> None:
        """Record a keyed call (inside its transaction). An expired, uncollected row of the
        same key is replaced."""
        if not self.exists():
            self.conn.execute(CALLS_SQL)
            self._exists, self._count = True, 0
        count = self._count
        gone = self.conn.execute(f"DELETE FROM {_T} WHERE key = ?", (key,)).rowcount
        self.conn.execute(
            f"INSERT INTO {_T} (key, method, args_sha256, result, at_ms) VALUES (?, ?, ?, ?, ?)",
            (key, method, digest, result, now),
        )
        self._count = count - gone + 1

    def collect(self, retention: Retention, now: int) -> int:
        """Delete expired rows and rows beyond the cap, oldest first, at most
        ``retention.per_txn`` of them (inside a write transaction). Returns how many.

        Walks from the oldest row and stops at the first one that is neither expired nor
        excess, so the work is bounded and nothing younger than the window goes (except by
        the cap)."""
        count = self.count()
        if count == 0:
            return 0
        excess = count - retention.max_keys
        cutoff = retention.cutoff_ms(now)
        victims: list[int] = []
        rows = self.conn.execute(
            f"SELECT seq, at_ms FROM {_T} ORDER BY seq LIMIT ?", (retention.per_txn,)
        )
        for seq, at_ms in rows:
            if len(victims) >= excess and at_ms > cutoff:
                break
            victims.append(int(seq))
        rows.close()
        if victims:
            self.conn.executemany(f"DELETE FROM {_T} WHERE seq = ?", [(s,) for s in victims])
            self._count = count - len(victims)
        return len(victims)
