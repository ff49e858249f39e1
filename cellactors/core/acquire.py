"""Deciding how to acquire a cell from what the bucket said (docs/protocol.md, "Ownership").

:func:`decide` is called after reading ``own.json`` and, when it names another node, again
after reading that node's lease. It never steals from a live owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellactors.core.types import Absent, Guard, Match, NodeLease, OwnerRecord
from cellactors.errors import CellPurging

MAX_ATTEMPTS = 5
MAX_AMBIGUOUS = 3


@dataclass(frozen=True)
class Claim:
    """Write ``{me, epoch}`` guarded by ``guard``; ``takeover`` when a dead owner is replaced.

    ``floor`` is the highest txid the record proves acknowledged (a release records it, a
    claim carries it forward): the claim writes it again, and the restore after it must
    reach it before it seals or opens, however long the store's listings take to show the
    batches that hold it."""

    epoch: int
    guard: Guard
    takeover: bool = False
    previous_owner: str = ""
    floor: int = 0


@dataclass(frozen=True)
class ReadLease:
    """Read ``nodes/<node>.json`` before deciding."""

    node: str


@dataclass(frozen=True)
class Remote:
    """Another node owns the cell and its lease is live: route there. ``generation`` is
    the owner's process generation from its lease (signed forwards are bound to it)."""

    node: str
    addr: str
    generation: str = ""


@dataclass(frozen=True)
class Defer:
    """The owner's lease cannot be judged now (the store's clock is settling after a jump):
    neither take the cell nor route to the owner; the call fails as not run and is retried
    later."""

    node: str


@dataclass(frozen=True)
class Vacant:
    """The cell has never existed (no ownership record), and the acquire was asked to say
    so rather than create it: nothing was written."""


Decision = Claim | ReadLease | Remote | Defer

_UNREAD = object()


def decide(
    me: str,
    record: OwnerRecord | None,
    now_ms: int | None,
    lease: NodeLease | object | None = _UNREAD,
) -> Decision:
    """Next step of an acquire, given the ownership record and (if read) the owner's lease.

    ``now_ms`` is the store's time, surely reached (:class:`cellactors.clock.StoreClock`),
    or None when it cannot be trusted now: then a lease whose expiry is all that separates
    a live owner from a dead one defers the decision. A lease that is missing, written for
    another node, released (expiry 0) or without an address needs no clock."""
    if record is None:
        return Claim(epoch=1, guard=Absent())
    if record.purging:
        # A purge fenced the cell and deletes its objects: no claim may restore a part of
        # its history; the purge (run again if it stopped) ends with own.json deleted.
        raise CellPurging(f"cell is being purged (epoch {record.epoch}); run the purge again")
    if record.node in (me, ""):
        return Claim(record.epoch + 1, Match(record.token), floor=record.acked_txid)
    if lease is _UNREAD:
        return ReadLease(record.node)
    if (
        isinstance(lease, NodeLease)
        and lease.node == record.node
        and lease.addr
        and lease.expires_ms > 0
    ):
        if now_ms is None:
            return Defer(record.node)
        if lease.is_live(now_ms):
            return Remote(record.node, lease.addr, lease.generation)
    return Claim(
        epoch=record.epoch + 1,
        guard=Match(record.token),
        takeover=True,
        previous_owner=record.node,
        floor=record.acked_txid,
    )


def names(record: OwnerRecord | None, node: str, epoch: int) -> bool:
    """Whether an ownership record names ``node`` at ``epoch``: the one test behind every
    "do I still own this cell" (an acknowledgement's re-read, a release, a collection, a
    claim read back)."""
    return record is not None and record.node == node and record.epoch == epoch


def confirmed(me: str, claim: Claim, read_back: OwnerRecord | None) -> bool:
    """After an ambiguous claim: did it apply? Only if the record names us at the new epoch."""
    return names(read_back, me, claim.epoch)
