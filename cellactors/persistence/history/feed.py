"""The per-cell change feed, read straight from the bucket (docs/feed.md).

Which transactions may appear is decided by :func:`cellactors.core.feed_plan.plan_feed`;
this module lists the cell's folder, reads ``own.json`` *after* the listing, reads the seals
and batches the plan asks for, and turns transactions into :class:`Change` records. Any
process with read access to the bucket can run it: a node serving ``GET .../changes``, the
``cellactors feed`` command, or a test.

Following (:func:`follow`) polls: a listing of the cell (or, once caught up in the current
owner's epoch, of that epoch's folder only) and one ``own.json`` read per round, every
``poll_interval`` seconds while nothing new appears.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cellactors.core import feed_plan, keys, restore_plan
from cellactors.core.changes import Change, RowChange
from cellactors.core.txn import Txn
from cellactors.errors import BucketError, FeedHole, HistoryCollected
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.history.batches import Batch, decode_batch
from cellactors.persistence.history.restore import FETCH_WORKERS, collected_error, fetch_bodies
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.bucket import Bucket

__all__ = [
    "Change",
    "FeedHole",
    "FeedPage",
    "HistoryCollected",
    "RowChange",
    "changes",
    "follow_changes",
    "read_changes",
]

MAX_LISTINGS = 4
DEFAULT_POLL_INTERVAL = 0.25


def to_change(epoch: int, txn: Txn) -> Change:
    """A replicated transaction as a feed record."""
    rows = tuple(
        RowChange(
            table,
            list(key),
            None if row is None else dict(zip(txn.columns[table], row, strict=True)),
        )
        for table, key, row in txn.rows
    )
    return Change(
        txn.txid,
        epoch,
        txn.ts_ms,
        rows,
        schema_change=txn.image is not None,
        sequence=txn.sequence,
        rollback=txn.rollback,
    )


@dataclass
class FeedPage:
    """What one read of the bucket found after ``after``: ``changes`` in txid order,
    ``last_txid`` (``after`` when nothing new), the owner's epoch then, and an epoch the
    history waits on (unsealed below the owner's: it continues once the next owner seals
    it)."""

    after: int
    changes: list[Change]
    owner_epoch: int | None
    waiting_for: int | None = None

    @property
    def last_txid(self) -> int:
        return self.changes[-1].txid if self.changes else self.after


class _Relist(Exception):
    """A listed object vanished, or the plan found a hole: list again."""


class FeedReader:
    """Reads one cell's feed from a bucket. Seals are immutable once written, so the reader
    remembers those it read; a follower that is caught up in the owner's epoch lists only
    that epoch's folder."""

    def __init__(
        self, bucket: Bucket, cell_id: str, pool: concurrent.futures.Executor | None = None
    ) -> None:
        self.pool = pool  # runs the GETs (a node's own; None: one per read)
        self.bucket = bucket
        self.cell_id = keys.validate_cell_id(cell_id)
        self.root = keys.cell_root(cell_id)
        self.owners = OwnershipStore(bucket, "feed-reader")
        self.seals: dict[int, int] = {}
        self._tail_epoch: int | None = None  # caught up at the chain of this owner epoch

    def read(self, after: int, limit: int | None = None) -> FeedPage:
        """The acknowledged transactions after ``after`` that the bucket holds now (at most
        ``limit``). Raises :class:`HistoryCollected` or :class:`FeedHole`."""
        if after < 0:
            raise ValueError(f"after must be a txid (0 or more), not {after}")
        problem = ""
        for attempt in range(MAX_LISTINGS):
            if attempt:
                time.sleep(0.05 * 2**attempt)
            try:
                return self._read_once(after, limit, quick=attempt == 0)
            except _Relist as err:
                problem = str(err)
        raise FeedHole(
            f"feed of {self.cell_id} after txid {after}: {problem} (after {MAX_LISTINGS} listings)"
        )

    def _read_once(self, after: int, limit: int | None, quick: bool) -> FeedPage:
        tail = self._tail_epoch if quick else None
        prefix = keys.epoch_dir(self.cell_id, tail) if tail is not None else self.root
        listed = [info.key for info in self.bucket.list(prefix)]
        owner = self.owners.read_owner(self.cell_id)  # after the listing: see plan_feed
        owner_epoch = owner.epoch if owner is not None else None
        if tail is not None and owner_epoch != tail:
            return self._read_once(after, limit, quick=False)  # the cell moved: look at all
        listing = restore_plan.parse_listing(self.root, listed)
        unusable: set[str] = set()
        while True:
            planned = feed_plan.plan_feed(listing, owner_epoch, self.seals, after, unusable)
            if isinstance(planned, restore_plan.NeedSeal):
                value = read_seal(self.bucket, self.cell_id, planned.epoch)
                if value is None:
                    raise _Relist(f"the seal of epoch {planned.epoch} was listed and vanished")
                self.seals[planned.epoch] = value
                continue
            if isinstance(planned, feed_plan.Collected):
                if tail is not None:
                    return self._read_once(after, limit, quick=False)
                raise collected_error(self.cell_id, planned)
            if isinstance(planned, restore_plan.Hole):
                if tail is not None:
                    return self._read_once(after, limit, quick=False)
                raise _Relist(planned.reason)
            batches = self._fetch(planned, unusable, limit)
            if batches is None:
                continue  # a torn batch: plan without it
            break
        changes: list[Change] = []
        for step in planned.steps:
            for batch in batches.get(step.epoch, []):
                for txn in batch.txns:
                    if step.after < txn.txid <= step.upto and txn.txid == after + len(changes) + 1:
                        changes.append(to_change(step.epoch, txn))
            if limit is not None and len(changes) >= limit:
                changes = changes[:limit]
                break
        caught_up = (limit is None or len(changes) < limit) and planned.waiting_for is None
        # Nothing new keeps the tail it was read from: an idle follower lists one folder.
        last = planned.steps[-1].epoch if planned.steps else tail
        self._tail_epoch = owner_epoch if caught_up and last == owner_epoch else None
        return FeedPage(after, changes, owner_epoch, planned.waiting_for)

    def _fetch(
        self, planned: feed_plan.FeedPlan, unusable: set[str], limit: int | None
    ) -> dict[int, list[Batch]] | None:
        """Read the planned batches (only as many as ``limit`` needs), in order, per epoch;
        None after marking a torn one unusable."""
        found: dict[int, list[Batch]] = {}
        count = 0
        planned_reads = [(step, ref) for step in planned.steps for ref in step.reads]
        if limit is not None:
            # Each planned batch extends the chain by one transaction at least.
            planned_reads = planned_reads[:limit]
        keys_in_order = [ref.key for _step, ref in planned_reads]
        with contextlib.closing(fetch_bodies(self.bucket, keys_in_order, pool=self.pool)) as bodies:
            for (step, ref), body in zip(planned_reads, bodies, strict=True):
                if limit is not None and count >= limit:
                    return found
                if body is None:
                    raise _Relist(f"{ref.key} was listed and then vanished")
                try:
                    batch = decode_batch(ref.key, body)
                except BucketError:
                    unusable.add(ref.key)
                    return None
                found.setdefault(step.epoch, []).append(batch)
                count += sum(1 for t in batch.txns if step.after < t.txid <= step.upto)
        return found


def read_changes(
    bucket: Bucket,
    cell_id: str,
    after: int = 0,
    limit: int | None = None,
    pool: concurrent.futures.Executor | None = None,
) -> FeedPage:
    """One read of the feed: the acknowledged transactions after ``after``, in txid order."""
    return FeedReader(bucket, cell_id, pool).read(after, limit)


def follow_changes(
    bucket: Bucket,
    cell_id: str,
    after: int = 0,
    *,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    wait: float | None = None,
    stop: threading.Event | None = None,
    limit: int | None = None,
    on_idle: Callable[[], None] | None = None,
    pool: concurrent.futures.Executor | None = None,
) -> Iterator[Change]:
    """Yield the acknowledged transactions after ``after`` as they appear, in txid order:
    those already in the bucket first, then each new one within about ``poll_interval`` of
    its upload. Ends after ``wait`` seconds (None: never) or when ``stop`` is set; raises
    :class:`HistoryCollected` or :class:`FeedHole`. ``on_idle`` is called after each round
    that found nothing (a server uses it to keep a connection alive). ``pool`` runs the GETs
    (a node's own; without one, a pool for this follower alone)."""
    own = pool is None
    if pool is None:
        pool = concurrent.futures.ThreadPoolExecutor(FETCH_WORKERS, thread_name_prefix="feed")
    try:
        yield from _follow(
            FeedReader(bucket, cell_id, pool), after, poll_interval, wait, stop, limit, on_idle
        )
    finally:
        if own:
            pool.shutdown(wait=False)


def _follow(
    reader: FeedReader,
    after: int,
    poll_interval: float,
    wait: float | None,
    stop: threading.Event | None,
    limit: int | None,
    on_idle: Callable[[], None] | None,
) -> Iterator[Change]:
    end = None if wait is None else time.monotonic() + wait
    pos = after
    while True:
        page = reader.read(pos, limit)
        yield from page.changes
        pos = page.last_txid
        if page.changes and limit is not None and len(page.changes) >= limit:
            continue  # more may be waiting: read on at once
        if not page.changes and on_idle is not None:
            on_idle()
        now = time.monotonic()
        if end is not None and now >= end:
            return
        pause = poll_interval if end is None else min(poll_interval, end - now)
        if stop is not None:
            if stop.wait(pause):
                return
        else:
            time.sleep(pause)


def changes(
    bucket: Bucket,
    cell_id: str,
    after: int = 0,
    *,
    follow: bool = False,
    wait: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    stop: threading.Event | None = None,
    pool: concurrent.futures.Executor | None = None,
) -> Iterator[Change]:
    """The feed as an iterator: what the bucket holds after ``after`` and, with ``follow``,
    every later transaction as it is acknowledged (for ``wait`` seconds, None: until
    ``stop`` is set)."""
    if not follow:
        return iter(read_changes(bucket, cell_id, after, pool=pool).changes)
    return follow_changes(
        bucket, cell_id, after, poll_interval=poll_interval, wait=wait, stop=stop, pool=pool
    )
