"""Snapshots and garbage collection of one activation: owner work.

A snapshot bounds the next restore; the collection that follows deletes what a snapshot
covers once that snapshot is older than the retention period (so the change feed and
point-in-time restores reach back that far). Both run only while the activation owns the
cell: the collection reads ``own.json`` fresh before deleting anything, and release waits
for the work (bounded) and cancels what is left *before* ``own.json`` is released, so a
deposed owner's collection can never delete what a later restore needs. After a fence the
node's write gate refuses whatever is still queued.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cellactors.core import keys
from cellactors.errors import BucketError
from cellactors.persistence.history.snapshots import collect_garbage, encode_snapshot
from cellactors.persistence.store.bucket import Bucket

log = logging.getLogger(__name__)

# Snapshot uploads and collections of every cell; they never hold an answer back.


#: How long history covered by a snapshot stays in the bucket by default (7 days), so the
#: change feed and point-in-time restore reach back that far.
DEFAULT_RETAIN_S = 7 * 24 * 3600.0


@dataclass
class SnapshotPolicy:
    """Write a snapshot when the chain since the last one is long (txids or bytes); keep the
    history a snapshot covers for ``retain_s`` seconds before collecting it (0: collect at
    once, as soon as a newer snapshot covers it)."""

    every_txids: int = 1000
    every_bytes: int = 64 * 1024 * 1024
    retain_s: float = DEFAULT_RETAIN_S

    def __post_init__(self) -> None:
        if self.retain_s < 0:
            raise ValueError(f"retain_s must not be negative, not {self.retain_s}")

    def due(self, since_txids: int, since_bytes: int) -> bool:
        return since_txids >= self.every_txids or since_bytes >= self.every_bytes


@dataclass
class ChainState:
    """Where the chain of a cell stands: the last snapshot's txid and what came after it
    (carried from restore to replicator to the next activation, so the policy counts the
    chain across activations)."""

    snapshot_txid: int = 0
    since_txids: int = 0
    since_bytes: int = 0


class SnapshotWorker:
    """Runs one snapshot (upload, then collection) at a time for one activation."""

    def __init__(
        self,
        cell_id: str,
        epoch: int,
        bucket: Bucket,
        owns: Callable[[], bool],
        executor: concurrent.futures.Executor,
        retain_s: float = DEFAULT_RETAIN_S,
    ) -> None:
        self.executor = executor  # the node's snapshot pool
        self.cell_id = cell_id
        self.retain_s = retain_s
        self.epoch = epoch
        self.bucket = bucket
        self.owns = owns
        self._cancelled = threading.Event()
        self._lock = threading.Lock()  # held while the job writes or deletes
        self._job: concurrent.futures.Future[None] | None = None
        self.written: list[int] = []  # txids of snapshots written (tests, metrics)

    def busy(self) -> bool:
        return self._job is not None and not self._job.done()

    def submit(self, txid: int, image: bytes) -> bool:
        """Start a snapshot of acknowledged state at ``txid``; False when one is running or
        the worker was cancelled."""
        if self._cancelled.is_set() or self.busy():
            return False
        self._job = self.executor.submit(self._run, txid, image)
        return True

    def _run(self, txid: int, image: bytes) -> None:
        with self._lock:
            if self._cancelled.is_set():
                return
            try:
                self.bucket.put(
                    keys.snapshot_key(self.cell_id, txid, self.epoch),
                    encode_snapshot(self.cell_id, self.epoch, txid, image),
                )
                self.written.append(txid)
                if self._cancelled.is_set():
                    return
                deleted = collect_garbage(
                    self.bucket,
                    self.cell_id,
                    self.epoch,
                    txid,
                    owns=self.owns,
                    cancelled=self._cancelled.is_set,
                    retain_s=self.retain_s,
                )
                log.debug(
                    "cell %s: snapshot at txid %d, %d objects collected",
                    self.cell_id,
                    txid,
                    deleted,
                )
            except BucketError as err:  # an optimisation: the chain is intact without it
                log.warning("cell %s: snapshot at txid %d failed: %s", self.cell_id, txid, err)

    def cancel(self) -> None:
        """Nothing new starts; a running job stops before its next write or delete."""
        self._cancelled.set()

    def finish(self, timeout: float) -> bool:
        """Let a running job finish (at most ``timeout``), then cancel the rest. True when
        nothing of this worker can write any more, so ``own.json`` may be released."""
        deadline = time.monotonic() + timeout
        job = self._job
        if job is not None:
            concurrent.futures.wait([job], timeout=timeout)
        self._cancelled.set()
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            log.warning("cell %s: snapshot work still running; not releasing", self.cell_id)
            return False
        self._lock.release()
        return True
