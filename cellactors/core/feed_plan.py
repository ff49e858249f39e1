"""Which transactions a change feed may return, and what a point-in-time restore reads
(docs/feed.md).

Pure decisions over a listing of ``cells/<cell>/`` (see :mod:`cellactors.core.restore_plan`)
and the seals read so far:

- :func:`plan_feed`: the batches holding the cell's durable history after a txid. A sealed
  epoch is read up to its seal (a fenced owner's late batches above it never appear); the
  current owner's epoch (named by ``own.json`` read *after* the listing) is read to the end
  of its chain, because whatever its owner uploaded before that read is either acknowledged
  or sealed in whole by the next restore; an unsealed epoch below the owner's is not read at
  all until the next owner seals it.
- :func:`plan_point`: the restore plan as of one txid (the newest usable snapshot at or below
  it, then batches up to it), or :class:`Collected` when that point is older than what the
  bucket still holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from cellactors.core.restore_plan import (
    BatchRef,
    Hole,
    Listing,
    NeedSeal,
    Plan,
    SnapshotRef,
    chain,
    plan_restore,
    proven_txid,
)


@dataclass(frozen=True)
class FeedStep:
    """Read ``reads`` (in order) and return their transactions ``after+1..upto`` of
    ``epoch``."""

    epoch: int
    after: int
    upto: int
    reads: tuple[BatchRef, ...]


@dataclass(frozen=True)
class FeedPlan:
    """The durable history after ``after`` that this listing shows, in steps.

    ``waiting_for`` names an unsealed epoch below the owner's: history continues there only
    once the next owner has sealed it (at its activation)."""

    after: int
    steps: tuple[FeedStep, ...]
    waiting_for: int | None = None

    @property
    def last_txid(self) -> int:
        return max([self.after, *(step.upto for step in self.steps)])

    @property
    def reads(self) -> tuple[BatchRef, ...]:
        return tuple(ref for step in self.steps for ref in step.reads)


@dataclass(frozen=True)
class Collected:
    """History after the requested txid was garbage-collected. ``oldest_txid`` is the first
    txid the bucket still holds in batches (read the feed from ``oldest_txid - 1``);
    ``snapshot`` is the oldest usable snapshot from which that is possible (restore it, then
    read the feed after its txid), or None when there is none."""

    requested: int
    oldest_txid: int
    snapshot: SnapshotRef | None


FeedResult = FeedPlan | NeedSeal | Collected | Hole
PointResult = Plan | NeedSeal | Collected | Hole


def _without(listing: Listing, unusable: AbstractSet[str]) -> Listing:
    if not unusable:
        return listing
    return Listing(
        batches={
            e: [ref for ref in refs if ref.key not in unusable]
            for e, refs in listing.batches.items()
        },
        seals=listing.seals,
        snapshots=[s for s in listing.snapshots if s[2] not in unusable],
    )


def oldest_batch_txid(listing: Listing, upto_epoch: int) -> int | None:
    """The first txid any listed batch of an epoch at or below ``upto_epoch`` holds."""
    firsts = [ref.first for e, refs in listing.batches.items() if e <= upto_epoch for ref in refs]
    return min(firsts, default=None)


def usable_snapshots(
    listing: Listing, current: int, seals: Mapping[int, int]
) -> list[SnapshotRef] | NeedSeal:
    """Snapshots written below epoch ``current`` that stand for acknowledged state (not a
    fenced owner's late one above its own epoch's seal), newest first. A snapshot of an
    unsealed epoch below ``current`` counts only when that epoch is ``current - 1`` (the
    owner's, for readers that pass the owner's epoch plus one)."""
    found: list[SnapshotRef] = []
    for txid, epoch, key in listing.snapshots:
        if epoch >= current:
            continue
        if epoch in listing.seals:
            if epoch not in seals:
                return NeedSeal(epoch)
            if txid > seals[epoch]:
                continue
        elif epoch != current - 1:
            continue
        found.append(SnapshotRef(txid, epoch, key))
    return found


def _collected(
    listing: Listing, owner_epoch: int, seals: Mapping[int, int], after: int, oldest: int
) -> Collected | NeedSeal:
    snaps = usable_snapshots(listing, owner_epoch + 1, seals)
    if isinstance(snaps, NeedSeal):
        return snaps
    start = [s for s in snaps if s.txid >= oldest - 1]
    return Collected(after, oldest, min(start, key=lambda s: s.txid) if start else None)


def plan_feed(
    listing: Listing,
    owner_epoch: int | None,
    seals: Mapping[int, int],
    after: int,
    unusable: AbstractSet[str] = frozenset(),
) -> FeedResult:
    """Plan reading the durable history after txid ``after``.

    ``owner_epoch`` is the epoch of ``own.json`` read *after* the listing (None when the cell
    has none). ``seals`` holds the ``max_txid`` of every seal read so far (the result asks
    for the next one it needs); ``unusable`` names batch objects that did not decode (a torn
    upload: never acknowledged, planned without).

    A gap where the history after ``after`` would start, below every batch still listed, is
    :class:`Collected`; any other gap (a missing object, a sealed epoch whose batches stop
    short of its seal) is a :class:`Hole`.
    """
    if owner_epoch is None:
        return FeedPlan(after, ())
    listing = _without(listing, unusable)
    oldest = oldest_batch_txid(listing, owner_epoch)
    snaps = usable_snapshots(listing, owner_epoch + 1, seals)
    if isinstance(snaps, NeedSeal):
        return snaps
    # Epochs below a usable snapshot the reader has passed hold nothing it still needs, and
    # a seal a deposed restorer re-created there is never read (as a restore never does).
    floor = max((s.epoch for s in snaps if s.txid <= after), default=0)
    epochs = sorted(e for e in {*listing.batches, *listing.seals} if floor <= e <= owner_epoch)
    top_seal = max((e for e in listing.seals if e <= owner_epoch), default=None)
    pos = after
    steps: list[FeedStep] = []

    def gap(epoch: int, first: int) -> FeedResult:
        if not steps and oldest is not None and pos + 1 < oldest and first == oldest:
            return _collected(listing, owner_epoch, seals, after, oldest)
        return Hole(
            f"epoch {epoch}'s batches continue at txid {first}, but the history read so far "
            f"ends at txid {pos}: batch objects are missing"
        )

    for epoch in epochs:
        refs = listing.batches.get(epoch, [])
        limit: int | None
        if epoch in listing.seals:
            if epoch not in seals:
                if not any(ref.last > pos for ref in refs) and epoch != top_seal:
                    continue  # nothing here beyond pos; the newest seal is always read
                return NeedSeal(epoch)
            limit = seals[epoch]
            if limit <= pos:
                continue
        elif epoch == owner_epoch:
            limit = None
        else:
            # An owner seals the epochs below its own before it writes anything, so an
            # unsealed epoch below a sealed or written one lost its seal (as for a restore).
            written = {*listing.batches, *listing.seals, *(e for _t, e, _k in listing.snapshots)}
            later = sorted(e for e in written if epoch < e <= owner_epoch)
            if later:
                return Hole(
                    f"epoch {epoch} is unsealed though epoch {later[0]} was sealed or written "
                    "after it: its seal is missing"
                )
            # Its end is decided by the seal the next owner writes at its activation.
            return FeedPlan(after, tuple(steps), waiting_for=epoch)
        useful = [ref for ref in refs if ref.last > pos]
        if useful and min(ref.first for ref in useful) > pos + 1:
            return gap(epoch, min(ref.first for ref in useful))
        reads, upto = chain(refs, pos, limit)
        beyond = [
            ref for ref in refs if ref.first > upto + 1 and (limit is None or ref.first <= limit)
        ]
        if beyond:
            return gap(epoch, min(ref.first for ref in beyond))
        if limit is not None and upto < limit:
            if not useful:
                # A sealed epoch with nothing listed beyond pos: its transactions are in an
                # earlier epoch's batches that are gone, or collected.
                if not steps and oldest is not None and pos + 1 < oldest:
                    return _collected(listing, owner_epoch, seals, after, oldest)
                if not steps and oldest is None:
                    return _collected(listing, owner_epoch, seals, after, limit + 1)
            return Hole(
                f"epoch {epoch} is sealed at txid {limit} but its batches end at txid {upto}: "
                "batch objects are missing"
            )
        if reads:
            steps.append(FeedStep(epoch, pos, upto, tuple(reads)))
        pos = upto
    proven = proven_txid(listing, owner_epoch + 1, seals)
    if proven > pos:
        if not steps and (oldest is None or pos + 1 < oldest):
            return _collected(listing, owner_epoch, seals, after, oldest or proven + 1)
        return Hole(
            f"the bucket proves txid {proven} is history but the batches listed reach only "
            f"txid {pos}"
        )
    return FeedPlan(after, tuple(steps))


def plan_point(
    listing: Listing,
    current: int,
    seals: Mapping[int, int],
    target: int,
    unusable: AbstractSet[str] = frozenset(),
    excluded: AbstractSet[str] = frozenset(),
) -> PointResult:
    """Plan a read-only restore of the database as it was right after txid ``target``
    (``current`` is the owner's epoch plus one): the newest usable snapshot at or below
    ``target``, then batches, every step capped at ``target``. Snapshots named in
    ``excluded`` are not used (a restore as of a time skips those uploaded after it). When no
    usable snapshot remains and no batch chain from the start either, the point was collected
    (:class:`Collected` names the oldest snapshot still restorable)."""
    kept = [s for s in listing.snapshots if s[0] <= target and s[2] not in excluded]
    below = Listing(batches=listing.batches, seals=listing.seals, snapshots=kept)
    planned = plan_restore(below, current, seals, unusable, target=target)
    if isinstance(planned, NeedSeal):
        return planned
    if isinstance(planned, Hole):
        snaps = usable_snapshots(listing, current, seals)
        if isinstance(snaps, NeedSeal):
            return snaps
        later = [s for s in snaps if s.txid > target or s.key in excluded]
        if later and len(later) == len(snaps):
            oldest = min(later, key=lambda s: s.txid)
            return Collected(target, oldest.txid, oldest)
        return planned
    assert isinstance(planned, Plan), "no floor was given: a plan never lags"
    return planned  # capped at the target: it seals nothing
