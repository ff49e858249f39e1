"""Planning a restore from a listing of ``cells/<cell>/`` (docs/protocol.md, "Restore and the
epoch seal").

The plan is pure: given what the listing shows and what the seals say, it names the batch
objects to read for each epoch and the seal to create for each unsealed epoch. The executor
in :mod:`cellactors.persistence.history.restore` reads and writes accordingly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
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


def plan_epoch(
    listing: Listing, epoch: int, after: int, seal_max: int | None, cap: int | None = None
) -> EpochStep:
    """Plan one epoch: with a seal, read up to its ``max_txid``; without, follow the chain
    and seal at its end. ``cap`` stops an unsealed chain there: such a plan (a read-only
    restore to a point) seals nothing, since the chain's end was not looked at."""
    refs = listing.batches.get(epoch, [])
    if seal_max is not None:
        reads, upto = chain(refs, after, seal_max)
        return EpochStep(epoch, after, max(after, upto), tuple(reads), seal=False)
    reads, upto = chain(refs, after, cap)
    return EpochStep(epoch, after, upto, tuple(reads), seal=cap is None)


def epochs_to_restore(listing: Listing, from_epoch: int, current: int) -> list[int]:
    """Every epoch from ``from_epoch`` to ``current - 1``: empty ones are sealed too."""
    return list(range(max(1, from_epoch), current))


def needs_seal_read(listing: Listing, epoch: int, after: int) -> bool:
    """A sealed epoch's seal only matters when it has batches beyond ``after``."""
    return any(ref.last > after for ref in listing.batches.get(epoch, []))


# --- the whole plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotRef:
    """A listed snapshot: the state through ``txid``, written by the owner at ``epoch``."""

    txid: int
    epoch: int
    key: str


@dataclass(frozen=True)
class NeedSeal:
    """Read the seal of ``epoch`` (its ``max_txid``) and plan again."""

    epoch: int


@dataclass(frozen=True)
class Hole:
    """The listing proves history that the objects listed cannot rebuild: something was
    deleted or is missing. Never restore around it: list again, and fail if it stays."""

    reason: str


@dataclass(frozen=True)
class Lagging:
    """The ownership record proves txid ``floor`` was acknowledged (the last release
    recorded it), but what the listing shows rebuilds history only through ``reached``: the
    store's listing lags behind its writes. List again, later; never seal below the
    floor."""

    floor: int
    reached: int


@dataclass(frozen=True)
class Plan:
    """Start from ``snapshot`` (or an empty database), then run ``steps`` in order."""

    snapshot: SnapshotRef | None
    steps: tuple[EpochStep, ...]

    @property
    def last_txid(self) -> int:
        base = self.snapshot.txid if self.snapshot else 0
        return max([base, *(step.upto for step in self.steps)])

    @property
    def reads(self) -> tuple[BatchRef, ...]:
        return tuple(ref for step in self.steps for ref in step.reads)

    @property
    def seals(self) -> tuple[EpochStep, ...]:
        """The epochs this restore must seal, ascending."""
        return tuple(step for step in self.steps if step.seal)


PlanResult = Plan | NeedSeal | Hole | Lagging


def choose_snapshot(
    listing: Listing, current: int, seals: Mapping[int, int], unusable: AbstractSet[str]
) -> SnapshotRef | NeedSeal | None:
    """The newest snapshot an earlier owner wrote that stands for acknowledged state.

    A snapshot whose txid exceeds the seal of its own epoch is a fenced owner's late one and
    is skipped; ``unusable`` names objects the executor found corrupt."""
    for txid, epoch, key in listing.snapshots:
        if epoch >= current or key in unusable:
            continue
        if epoch in listing.seals:
            if epoch not in seals:
                return NeedSeal(epoch)
            if txid > seals[epoch]:
                continue
        return SnapshotRef(txid, epoch, key)
    return None


def proven_txid(listing: Listing, current: int, seals: Mapping[int, int]) -> int:
    """The highest txid that the listing proves is part of the durable history: a snapshot
    at txid s proves s (unless it lies beyond its own epoch's seal); the owner of an epoch
    wrote its first batch only after restoring everything before it; a seal's ``max_txid``
    was restored by the activation that wrote it."""
    proven = max([0, *(m for e, m in seals.items() if e < current)])
    for txid, epoch, _key in listing.snapshots:
        if epoch < current and not (epoch in seals and txid > seals[epoch]):
            proven = max(proven, txid)
    for epoch, refs in listing.batches.items():
        if epoch < current and refs:
            proven = max(proven, min(ref.first for ref in refs) - 1)
    return proven


def superseded_by(listing: Listing, current: int) -> int | None:
    """An epoch above ``current`` with anything written in it: a later activation claimed
    the cell after this one (which then stalled), so this one must not open."""
    later = [e for e in (*listing.batches, *listing.seals) if e > current]
    later += [epoch for _txid, epoch, _key in listing.snapshots if epoch > current]
    return max(later, default=None)


def plan_restore(
    listing: Listing,
    current: int,
    seals: Mapping[int, int],
    unusable: AbstractSet[str] = frozenset(),
    target: int | None = None,
    floor: int = 0,
) -> PlanResult:
    """Plan the restore of a cell acquired at epoch ``current`` from one listing.

    ``seals`` holds the ``max_txid`` of every seal read so far, ``unusable`` the keys of
    snapshots and batches found corrupt; the result asks for the next seal it needs
    (:class:`NeedSeal`) until it can plan. The plan never seals an epoch below
    a txid the listing proves was acknowledged: a gap at the start or in the middle of an
    epoch's chain, or a chain that ends below its seal or below what a later epoch or a
    snapshot proves, is a :class:`Hole`, never an unacknowledged tail. Only the end of an
    unsealed epoch's chain can be an unacknowledged tail, and it is sealed in whole.

    ``target`` caps the plan at that txid (a read-only restore to a point): history above
    it is neither read nor checked, so an object missing there does not stop the restore,
    and the plan seals nothing.

    ``floor`` is a txid the ownership record proves was acknowledged (a release records
    it): a plan that ends below it is :class:`Lagging` (the listing does not show every
    batch written yet), never sealed.
    """
    newer = superseded_by(listing, current)
    if newer is not None:
        return Hole(
            f"epoch {newer} of this cell was written after this activation's epoch {current}: "
            "another activation superseded this one"
        )
    snap = choose_snapshot(listing, current, seals, unusable)
    if isinstance(snap, NeedSeal):
        return snap
    top = max(listing.seals, default=0)
    if top and top < current and top not in seals and (snap is None or top >= snap.epoch):
        # The newest seal proves how far history reached even if its batches are gone.
        return NeedSeal(top)
    if unusable:
        # A torn object (an upload cut off by a crash, kept by the store) is no batch at
        # all: planning without it drops an unacknowledged tail whole, and turns anything
        # else into a hole.
        listing = Listing(
            batches={
                e: [ref for ref in refs if ref.key not in unusable]
                for e, refs in listing.batches.items()
            },
            seals=listing.seals,
            snapshots=listing.snapshots,
        )
    pos = snap.txid if snap else 0
    steps: list[EpochStep] = []
    # Epochs whose owner restored (so sealed everything below): a batch, a seal or a
    # snapshot (even an unusable one) shows it.
    written = {*listing.batches, *listing.seals, *(e for _t, e, _k in listing.snapshots)}
    for epoch in epochs_to_restore(listing, snap.epoch if snap else 1, current):
        if target is not None and pos >= target:
            break
        refs = listing.batches.get(epoch, [])
        if refs and min(ref.first for ref in refs) - 1 > pos:
            return Hole(
                f"epoch {epoch}'s batches start at txid {min(r.first for r in refs)}, but the "
                f"history before it ends at txid {pos}: batch objects are missing"
            )
        if epoch in listing.seals:
            if not needs_seal_read(listing, epoch, pos):
                continue
            if epoch not in seals:
                return NeedSeal(epoch)
            limit = seals[epoch] if target is None else min(seals[epoch], target)
            step = plan_epoch(listing, epoch, pos, limit)
            if step.upto < limit:
                return Hole(
                    f"epoch {epoch} is sealed at txid {seals[epoch]} but its batches end at "
                    f"txid {step.upto}: batch objects are missing"
                )
        else:
            later = [e for e in range(epoch + 1, current) if e in written]
            if later:
                # Restorers seal epochs in ascending order before an epoch is written to, so
                # an unsealed epoch below a written or sealed one lost its seal.
                return Hole(
                    f"epoch {epoch} is unsealed though epoch {later[0]} was sealed or written "
                    "after it: its seal is missing"
                )
            step = plan_epoch(listing, epoch, pos, None, target)
            beyond = [
                ref
                for ref in refs
                if ref.first > step.upto + 1 and (target is None or step.upto < target)
            ]
            if beyond:
                return Hole(
                    f"epoch {epoch}'s chain breaks after txid {step.upto} (a batch starts at "
                    f"txid {min(r.first for r in beyond)}): batch objects are missing"
                )
        steps.append(step)
        pos = step.upto
    proven = proven_txid(listing, current, seals)
    if target is not None:
        proven = min(proven, target)
    if proven > pos:
        return Hole(
            f"the bucket proves txid {proven} was acknowledged but the objects listed "
            f"rebuild only through txid {pos}"
        )
    if min(floor, target if target is not None else floor) > pos:
        return Lagging(floor, pos)
    return Plan(snap, tuple(steps))
