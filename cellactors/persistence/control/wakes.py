"""Wake entries in the bucket: ``wake/<at_ms:016d>/<cell id>/<nonce>``, an empty object per
alarm (and one per non-empty outbox, at time 0) that must fire even when its cell is not
resident anywhere.

Keys sort by due time (zero-padded milliseconds), so a scan lists ``wake/`` in key order and
stops at the first entry not yet due: with nothing due it costs one LIST request, and one
more per page of 1000 due entries. Entries are written after the transaction that needs them
is proven durable and before its answer is released, and deleted after the transaction that
consumed them is acknowledged (:mod:`cellactors.actors.alarms`).
"""

from __future__ import annotations

from collections.abc import Iterator

from cellactors.core import keys
from cellactors.core.alarms import Wake
from cellactors.errors import InvalidCellId
from cellactors.persistence.store.bucket import Bucket

WAKE_PREFIX = "wake/"
#: At most this many due entries are taken by one scan (the rest wait for the next one).
SCAN_LIMIT = 1000


def wake_key(cell_id: str, wake: Wake) -> str:
    """The key of one entry (the cell id is validated: it cannot reach outside ``wake/``)."""
    return f"{WAKE_PREFIX}{wake.at_ms:016d}/{keys.validate_cell_id(cell_id)}/{wake.nonce}"


def parse_wake_key(key: str) -> tuple[str, Wake] | None:
    """(cell id, wake) of a key :func:`wake_key` built; None for anything else."""
    if not key.startswith(WAKE_PREFIX):
        return None
    at, sep, rest = key[len(WAKE_PREFIX) :].partition("/")
    cell_id, sep2, nonce = rest.rpartition("/")
    if not (sep and sep2 and at.isdigit() and len(at) == 16 and nonce):
        return None
    try:
        keys.validate_cell_id(cell_id)
    except InvalidCellId:
        return None
    return cell_id, Wake(int(at), nonce)


class WakeStore:
    """Writes, deletes and scans wake entries through one node's (gated) bucket."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket

    def put(self, cell_id: str, wake: Wake) -> None:
        self.bucket.put(wake_key(cell_id, wake), b"")

    def delete(self, cell_id: str, wake: Wake) -> None:
        self.bucket.delete(wake_key(cell_id, wake))

    def due(self, now_ms: int, limit: int = SCAN_LIMIT) -> Iterator[tuple[str, Wake]]:
        """Entries due by ``now_ms``, oldest first, at most ``limit``; the listing is
        abandoned at the first entry not yet due (so its later pages are never read)."""
        listing = self.bucket.list(WAKE_PREFIX)
        taken = 0
        try:
            for info in listing:
                parsed = parse_wake_key(info.key)
                if parsed is None:
                    continue
                if parsed[1].at_ms > now_ms or taken >= limit:
                    return
                taken += 1
                yield parsed
        finally:
            close = getattr(listing, "close", None)
            if close is not None:
                close()
