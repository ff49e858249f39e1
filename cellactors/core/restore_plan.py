"""Planning a restore from a listing of ``cells/<cell>/`` (PROTOCOL.md, "Restore and the
epoch seal").

The plan is pure: given what the listing shows and what the seals say, it names the batch
objects to read for each epoch and the seal to create for each unsealed epoch. The executor
in :mod:`cellactors.persistence.restore` reads and writes accordingly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SEAL = re.compile(r"^e([0-9]+)\.seal\.json$")
_EPOCH_DIR = re.compile(r"^e([0-9]+)$")
_SNAP = re.compile(r"^snap/([0-9a-f]{16})\.e([0-9]+)\.snap$")
_BATCH_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.batch$")


def parse_batch_name(name: str) -> tuple[int, int] | None:
    """``<first:016x>-<last:016x>.batch`` -> (first, last), or None for other names."""
    m = _BATCH_NAME.match(name)
    if not m:
        return None
    first, last = int(m.group(1), 16), int(m.group(2), 16)
    return (first, last) if first <= last else None


@dataclass(frozen=True)
class BatchRef:
    key: str
    first: int
    last: int


@dataclass
class Listing:
    """What a listing of one cell's folder contains, keyed by epoch."""

    batches: dict[int, list[BatchRef]] = field(default_factory=dict)
    seals: set[int] = field(default_factory=set)
    # (txid, epoch, key), newest first
    snapshots: list[tuple[int, int, str]] = field(default_factory=list)


def parse_listing(root: str, keys: list[str]) -> Listing:
    """Classify relative keys under ``root`` (``cells/<cell>/``); unknown names are ignored."""
    listing = Listing()
    for key in keys:
        if not key.startswith(root):
            continue
        rest = key[len(root) :]
        if m := _SEAL.match(rest):
            listing.seals.add(int(m.group(1)))
        elif m := _SNAP.match(rest):
            listing.snapshots.append((int(m.group(1), 16), int(m.group(2)), key))
        elif "/" in rest:
            folder, name = rest.split("/", 1)
            em = _EPOCH_DIR.match(folder)
            span = parse_batch_name(name)
            if em and span:
                listing.batches.setdefault(int(em.group(1)), []).append(
                    BatchRef(key, span[0], span[1])
                )
    listing.snapshots.sort(reverse=True)
    for refs in listing.batches.values():
        refs.sort(key=lambda r: (r.first, -r.last))
    return listing


@dataclass(frozen=True)
class EpochStep:
    """Read ``reads`` (in order) for txids ``after+1..upto``; create a seal if ``seal``."""

    epoch: int
    after: int
    upto: int
    reads: tuple[BatchRef, ...]
    seal: bool


def chain(refs: list[BatchRef], after: int, limit: int | None) -> tuple[list[BatchRef], int]:
    """Batches that extend the contiguous txid chain from ``after`` (at most to ``limit``),
    and the last txid reached. Stops at the first gap; overlapping batches are fine."""
    cur = after
    reads: list[BatchRef] = []
    for ref in sorted(refs, key=lambda r: (r.first, -r.last)):
        if limit is not None and cur >= limit:
            break
        if ref.first > cur + 1:
            break
        if ref.last > cur:
            reads.append(ref)
            cur = ref.last if limit is None else min(ref.last, limit)
    return reads, cur


def plan_epoch(listing: Listing, epoch: int, after: int, seal_max: int | None) -> EpochStep:
    """Plan one epoch: with a seal, read up to its ``max_txid``; without, follow the chain
    and seal at its end."""
    refs = listing.batches.get(epoch, [])
    if seal_max is not None:
        reads, upto = chain(refs, after, seal_max)
        return EpochStep(epoch, after, max(after, upto), tuple(reads), seal=False)
    reads, upto = chain(refs, after, None)
    return EpochStep(epoch, after, upto, tuple(reads), seal=True)


def epochs_to_restore(listing: Listing, from_epoch: int, current: int) -> list[int]:
    """Every epoch from ``from_epoch`` to ``current - 1``: empty ones are sealed too."""
    return list(range(max(1, from_epoch), current))


def needs_seal_read(listing: Listing, epoch: int, after: int) -> bool:
    """A sealed epoch's seal only matters when it has batches beyond ``after``."""
    return any(ref.last > after for ref in listing.batches.get(epoch, []))
