"""The protocol's types: guards and results of conditional writes, and the records the
fleet keeps in the bucket (ownership, node leases).

They live in the pure core so that decisions can be written and tested without any store;
:mod:`cellactors.persistence` encodes them to bytes and re-exports them for convenience.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The peer protocol this version of the node speaks (recorded in every lease).
PEER_PROTOCOL = 1


@dataclass(frozen=True)
class Absent:
    """Guard: write only if the key does not exist (create)."""


@dataclass(frozen=True)
class Match:
    """Guard: write only if the object's token (S3 ETag, GCS generation) is still ``token``."""

    token: str


Guard = Absent | Match


@dataclass(frozen=True)
class Applied:
    """The conditional write committed; ``token`` identifies the new version."""

    token: str


@dataclass(frozen=True)
class Rejected:
    """The precondition failed: the object was not written."""

    reason: str = ""


CasResult = Applied | Rejected


@dataclass(frozen=True)
class OwnerRecord:
    """An ownership record (``own.json``) as read, with the token guarding its next overwrite.

    ``acked_txid`` is the highest txid known acknowledged when the record was written: a
    release writes what its activation acknowledged, a claim carries the previous record's
    forward. The next owner never seals or answers below it, however far the store's
    listings lag (0 in records that predate it). ``purging`` marks a record a purge wrote
    to fence the cell before deleting its objects (docs/protocol.md, "Purging a cell")."""

    node: str
    epoch: int
    token: str
    acked_txid: int = 0
    purging: bool = False

    @property
    def released(self) -> bool:
        return self.node == ""


@dataclass(frozen=True)
class NodeLease:
    """One node's lease record (``nodes/<node>.json``)."""

    node: str
    addr: str
    expires_ms: int
    generation: str
    peer_protocol: int = PEER_PROTOCOL
    load: dict[str, Any] = field(default_factory=dict)

    def is_live(self, at_ms: int) -> bool:
        """Live: not expired by the reader's clock and reachable."""
        return self.expires_ms > at_ms and bool(self.addr)


@dataclass(frozen=True)
class LeaseSnapshot:
    """A lease as read, with the token guarding its next renewal."""

    lease: NodeLease
    token: str
