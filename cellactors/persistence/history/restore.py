"""Restoring a cell from the bucket, sealing epochs, and writing snapshots.

Runs after an acquire at epoch E and before the cell's mailbox opens. The plan comes from
:mod:`cellactors.core.restore_plan`; this module does the reads and writes. A lost seal race
fails the activation (the next one will find the seal).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from cellactors.core import feed_plan, keys, restore_plan
from cellactors.errors import (
    BucketError,
    HistoryCollected,
    ListingLags,
    PointNotRestorable,
    RestoreHole,
)
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.history.batches import decode_batch
from cellactors.persistence.history.seals import create_seal, read_seal
from cellactors.persistence.history.snapshots import decode_snapshot
from cellactors.persistence.store.bucket import Bucket, StoredObject

log = logging.getLogger(__name__)


@dataclass
class RestoreResult:
    """Where a restore ended: the last applied txid and what it did on the way."""

    last_txid: int
    snapshot: tuple[int, int] | None = None  # (epoch, txid) of the snapshot used
    sealed: list[int] = field(default_factory=list)
    batches_read: int = 0
    since_bytes: int = 0  # bytes of batches applied on top of the snapshot

    @property
    def since_txids(self) -> int:
        """Transactions applied on top of the snapshot (the chain a next snapshot bounds)."""
        return self.last_txid - (self.snapshot[1] if self.snapshot else 0)


class _Relist(Exception):
    """Something listed is gone, or the plan found a hole: list again."""


class _Lags(Exception):
    """The listing does not reach the txid the ownership record proves: list again later."""


MAX_LISTINGS = 4
#: How long a restore waits for the listing to reach the txid a release recorded.
LAG_WAIT_S = 15.0
FETCH_WORKERS = 16
#: Reads queued ahead of the one being consumed: several per worker, so that one slow read
#: at the head does not leave the other workers idle while the consumer waits on it.
FETCH_WINDOW = 4 * FETCH_WORKERS


def fetch_bodies(
    bucket: Bucket,
    keys_in_order: Sequence[str],
    window: int = FETCH_WINDOW,
    pool: concurrent.futures.Executor | None = None,
) -> Generator[bytes | None, None, None]:
    """GET ``keys_in_order`` on ``pool``, at most ``window`` queued ahead of the reader, and
    yield each body, or None for an object that is gone, in order. A store error is raised
    as it is, where its key comes: it says nothing about the object. Reads queued for a
    reader that stops early (or fails) are cancelled when the generator closes, so close it
    (``contextlib.closing``): only those already under way still run.

    A single key is read in the reader's own thread: there is nothing to overlap, and a
    hand-off to the pool and back costs two thread switches (a released cell's restore
    reads one batch)."""
    if len(keys_in_order) == 1:
        obj = bucket.get(keys_in_order[0])
        yield obj.body if obj is not None else None
        return
    pending: collections.deque[concurrent.futures.Future[StoredObject | None]]
    pending = collections.deque()
    upcoming = iter(keys_in_order)
    own = pool is None  # no pool given (a command, a test): one for this read alone
    if pool is None:
        pool = concurrent.futures.ThreadPoolExecutor(FETCH_WORKERS, thread_name_prefix="fetch")
    try:
        for key in itertools.islice(upcoming, window):
            pending.append(pool.submit(bucket.get, key))
        while pending:
            obj = pending.popleft().result()
            for more in itertools.islice(upcoming, 1):  # keep the window full
                pending.append(pool.submit(bucket.get, more))
            yield obj.body if obj is not None else None
    finally:
        for future in pending:
            future.cancel()
        if own:
            pool.shutdown(wait=False)


def _get(bucket: Bucket, key: str) -> bytes:
    obj = bucket.get(key)
    if obj is None:
        raise _Relist(f"{key} was listed and then vanished")
    return obj.body


Planner = Callable[
    [restore_plan.Listing, int, dict[int, int], set[str]],
    "restore_plan.PlanResult | feed_plan.Collected",
]


def _plan_and_apply(
    bucket: Bucket,
    cell_id: str,
    epoch: int,
    listing: restore_plan.Listing,
    db: CellDatabase,
    planner: Planner = restore_plan.plan_restore,
    until_ms: int | None = None,
    pool: concurrent.futures.Executor | None = None,
) -> tuple[restore_plan.Plan, RestoreResult]:
    """Plan from one listing (reading the seals it asks for), then rebuild ``db`` from the
    plan's snapshot and batches: each batch is applied as it arrives while the later ones
    are still being fetched. An object read back and found malformed (a torn upload) is
    planned without, after ``db`` is emptied again. Raises :class:`_Relist` when an object
    is gone or the plan finds a hole, with ``db`` empty again for the next listing."""
    seals: dict[int, int] = {}
    unusable: set[str] = set()
    while True:
        planned = planner(listing, epoch, seals, unusable)
        if isinstance(planned, feed_plan.Collected):
            raise collected_error(cell_id, planned)
        if isinstance(planned, restore_plan.NeedSeal):
            value = read_seal(bucket, cell_id, planned.epoch)
            if value is None:
                raise _Relist(f"the seal of epoch {planned.epoch} was listed and then vanished")
            seals[planned.epoch] = value
            continue
        if isinstance(planned, restore_plan.Hole):
            raise _Relist(planned.reason)
        if isinstance(planned, restore_plan.Lagging):
            raise _Lags(
                f"the release of the cell recorded txid {planned.floor} acknowledged, but "
                f"the listing rebuilds only through txid {planned.reached}"
            )
        result = RestoreResult(last_txid=0)
        if planned.snapshot is not None:
            snap = planned.snapshot
            body = _get(bucket, snap.key)
            try:
                snap_epoch, txid, image = decode_snapshot(snap.key, body)
            except BucketError as err:
                log.warning("skipping snapshot %s: %s", snap.key, err)
                unusable.add(snap.key)
                continue
            if (snap_epoch, txid) != (snap.epoch, snap.txid):
                log.warning("skipping snapshot %s: it holds txid %d", snap.key, txid)
                unusable.add(snap.key)
                continue
            db.load_image(image)
            result.last_txid = snap.txid
            result.snapshot = (snap.epoch, snap.txid)
        try:
            torn = _apply_batches(bucket, cell_id, planned, db, result, until_ms, pool)
        except _Relist:
            db.clear()  # part of the plan was applied: the next listing starts over
            raise
        if torn is None:
            return planned, result
        unusable.add(torn)
        db.clear()


def _apply_batches(
    bucket: Bucket,
    cell_id: str,
    plan: restore_plan.Plan,
    db: CellDatabase,
    result: RestoreResult,
    until_ms: int | None,
    pool: concurrent.futures.Executor | None = None,
) -> str | None:
    """Fetch the plan's batches (in parallel, in order) and apply each as it arrives, up to
    each step's txid (and, with ``until_ms``, before the first transaction stamped later).
    Returns the key of a batch found malformed, where applying stopped, or None."""
    reads = [ref.key for ref in plan.reads]
    with contextlib.closing(fetch_bodies(bucket, reads, pool=pool)) as bodies:
        for step in plan.steps:
            for ref in step.reads:
                # A store error propagates: only an object read back and found malformed
                # may be planned without.
                body = next(bodies)
                if body is None:
                    raise _Relist(f"{ref.key} was listed and then vanished")
                try:
                    batch = decode_batch(ref.key, body)
                except BucketError as err:
                    log.warning("restore of %s: planning without %s: %s", cell_id, ref.key, err)
                    return ref.key
                result.batches_read += 1
                for txn in batch.txns:
                    if result.last_txid < txn.txid <= step.upto:
                        if txn.txid != result.last_txid + 1:
                            raise BucketError(f"{ref.key}: txid {txn.txid} out of order")
                        if until_ms is not None and txn.ts_ms > until_ms:
                            return None  # the first transaction committed after the point
                        db.apply(txn)
                        result.last_txid = txn.txid
            if result.last_txid != step.upto:
                raise BucketError(
                    f"epoch {step.epoch}: batches rebuilt txid {result.last_txid}, not {step.upto}"
                )
    return None


def restore(
    bucket: Bucket,
    cell_id: str,
    epoch: int,
    db: CellDatabase,
    *,
    seal: bool = True,
    floor: int = 0,
    lag_wait_s: float = LAG_WAIT_S,
    pool: concurrent.futures.Executor | None = None,
) -> RestoreResult:
    """Rebuild ``db`` (expected empty) as of every sealed transaction below ``epoch``, sealing
    each unsealed epoch on the way.

    An object that was listed and then found missing, or a listing that proves more history
    than its objects rebuild, is never restored around: the cell is listed again (a few
    times, with a short backoff: a garbage collection racing this restore finishes and its
    snapshot becomes visible), and otherwise :class:`RestoreHole` fails the activation.

    ``floor`` is the highest txid the ownership record proves acknowledged (the last release
    recorded it). A listing that does not reach it lags behind the store's writes: the
    restore lists again, backing off, for up to ``lag_wait_s`` (holes too, meanwhile), and
    otherwise fails with :class:`ListingLags`. Nothing is sealed below the floor.

    ``pool`` runs the GETs (a node's own; without one, a pool for this restore alone).

    ``seal=False`` is the read-only form for operators (``cellactors restore``): it writes
    nothing, follows unsealed epochs' chains, and so may include writes that were uploaded
    but never acknowledged.
    """
    root = keys.cell_root(cell_id)
    planner = functools.partial(restore_plan.plan_restore, floor=floor)
    patience = time.monotonic() + (lag_wait_s if floor else 0.0)
    holes = lags = 0
    while True:
        infos = list(bucket.list(root))
        listing = restore_plan.parse_listing(root, [info.key for info in infos])
        try:
            plan, result = _plan_and_apply(bucket, cell_id, epoch, listing, db, planner, pool=pool)
        except _Relist as err:
            holes += 1
            if holes >= MAX_LISTINGS and time.monotonic() >= patience:
                raise RestoreHole(
                    f"restore of {cell_id} at epoch {epoch} failed after {holes} listings: {err}"
                ) from None
            log.info("restore of %s: %s; listing again", cell_id, err)
            time.sleep(min(1.0, 0.1 * 2**holes))
            continue
        except _Lags as err:
            lags += 1
            if time.monotonic() >= patience:
                raise ListingLags(
                    f"restore of {cell_id} at epoch {epoch}: {err}, after {lags} listings in "
                    f"{lag_wait_s:g}s; the store's listings lag behind its writes (run "
                    "cellactors qualify)"
                ) from None
            if lags == 1:
                log.warning("restore of %s: %s; waiting for the listing", cell_id, err)
            time.sleep(min(1.0, 0.05 * 2**lags))
            continue
        sizes = {info.key: info.size for info in infos}
        result.since_bytes = sum(sizes.get(ref.key, 0) for ref in plan.reads)
        if seal:
            for step in plan.seals:
                create_seal(bucket, cell_id, step.epoch, step.upto, epoch)
                result.sealed.append(step.epoch)
        if lags:
            log.info("restore of %s reached txid %d after %d listings", cell_id, floor, lags)
        return result


def collected_error(cell_id: str, found: feed_plan.Collected) -> HistoryCollected:
    """The error for history that garbage collection removed, naming where to start."""
    snap = found.snapshot
    where = (
        f"; start from the snapshot at txid {snap.txid} (epoch {snap.epoch}, {snap.key}) "
        f"and read on after txid {snap.txid}"
        if snap is not None
        else ""
    )
    err = HistoryCollected(
        f"the history of {cell_id} after txid {found.requested} was collected: the oldest "
        f"txid still available is {found.oldest_txid}{where}"
    )
    err.requested = found.requested
    err.oldest_txid = found.oldest_txid
    err.snapshot_txid = snap.txid if snap is not None else None
    err.snapshot_epoch = snap.epoch if snap is not None else None
    return err


#: Stores report upload times in whole seconds (S3 listings): a snapshot counts as uploaded
#: before a point in time only when its time plus this much is not after it.
STORE_TIME_RESOLUTION_MS = 1000


def _plan_point(
    listing: restore_plan.Listing,
    current: int,
    seals: dict[int, int],
    unusable: set[str],
    *,
    target: int,
    excluded: frozenset[str],
) -> restore_plan.PlanResult | feed_plan.Collected:
    return feed_plan.plan_point(listing, current, seals, target, unusable, excluded)


def restore_at(
    bucket: Bucket,
    cell_id: str,
    epoch: int,
    db: CellDatabase,
    *,
    txid: int | None = None,
    at_ms: int | None = None,
) -> RestoreResult:
    """Read-only point-in-time restore: rebuild ``db`` (expected empty) exactly as the cell's
    database was right after txid ``txid``, or after the last transaction committed at or
    before ``at_ms`` (stopping before the first one stamped later), from the newest snapshot
    at or below that point plus batches. ``epoch`` is the owner's epoch plus one. Writes
    nothing to the bucket.

    Raises :class:`HistoryCollected` when the point is older than what the bucket still holds
    (retention), :class:`PointNotRestorable` when the history does not reach it, and
    :class:`RestoreHole` as :func:`restore` does."""
    if (txid is None) == (at_ms is None):
        raise ValueError("give exactly one of txid and at_ms")
    if txid is not None and txid < 0:
        raise PointNotRestorable(f"txid {txid} is not a transaction id")
    root = keys.cell_root(cell_id)
    problem = ""
    for attempt in range(MAX_LISTINGS):
        if attempt:
            log.info("restore of %s: %s; listing again", cell_id, problem)
            time.sleep(0.1 * 2**attempt)
        infos = list(bucket.list(root))
        listing = restore_plan.parse_listing(root, [info.key for info in infos])
        target = txid if txid is not None else 2**63
        later = frozenset(
            info.key
            for info in infos
            if at_ms is not None
            and info.key.startswith(root + "snap/")
            and info.last_modified_ms + STORE_TIME_RESOLUTION_MS > at_ms
        )

        planner = functools.partial(_plan_point, target=target, excluded=later)

        try:
            _, result = _plan_and_apply(bucket, cell_id, epoch, listing, db, planner, at_ms)
        except _Relist as err:
            problem = str(err)
            continue
        if txid is not None and result.last_txid < txid:
            raise PointNotRestorable(
                f"{cell_id} has no txid {txid}: its history ends at txid {result.last_txid}"
            )
        if at_ms is not None and result.last_txid == 0:
            raise PointNotRestorable(
                f"{cell_id} has no transaction committed at or before the time asked for"
            )
        return result
    raise RestoreHole(
        f"restore of {cell_id} at epoch {epoch} failed after {MAX_LISTINGS} listings: {problem}"
    )
