"""The fleet's peer-auth key: ``fleet/peer-auth.json``, created once by a conditional create.

Every node calls :func:`ensure_peer_key` at start; the first create wins, losers re-read, and
every node ends with the same key.
"""

from __future__ import annotations

import contextlib
import secrets

from cellactors.core import keys
from cellactors.errors import AmbiguousWrite, BucketError
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Absent, Bucket


def _read_key(bucket: Bucket) -> bytes | None:
    obj = bucket.get(keys.PEER_AUTH_KEY)
    if obj is None:
        return None
    value = records.decode(keys.PEER_AUTH_KEY, obj.body, {"version": int, "key": str})
    try:
        key = bytes.fromhex(value["key"])
    except ValueError as err:
        raise BucketError(f"{keys.PEER_AUTH_KEY}: key is not hex") from err
    if value["version"] != 1 or len(key) != 32:
        raise BucketError(f"{keys.PEER_AUTH_KEY}: unsupported version or key length")
    return key


def read_peer_key(bucket: Bucket) -> bytes | None:
    """The fleet key, or None when no node has created it yet (reads only)."""
    return _read_key(bucket)


def ensure_peer_key(bucket: Bucket, attempts: int = 3) -> bytes:
    """Return the fleet key, creating it if this is the first node."""
    for _ in range(attempts):
        existing = _read_key(bucket)
        if existing is not None:
            return existing
        body = records.encode({"version": 1, "key": secrets.token_hex(32)})
        # Applied, Rejected or ambiguous: the stored key, read next, is the answer either way.
        with contextlib.suppress(AmbiguousWrite):
            bucket.put_cas(keys.PEER_AUTH_KEY, body, Absent())
    existing = _read_key(bucket)
    if existing is None:
        raise BucketError(f"could not create or read {keys.PEER_AUTH_KEY}")
    return existing
