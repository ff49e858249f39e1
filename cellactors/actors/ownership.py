"""The ownership actor of one cell: acquires it, restores it, opens its mailbox, releases it.

A cell's mailbox stays closed until :meth:`OwnershipActor.activate` finishes: callers wait on
the host's ``ready`` event, so calls that arrive meanwhile wait instead of being dropped.
The decisions come from :mod:`cellactors.core.acquire`; this actor performs the reads and
conditional writes they ask for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from cellactors.actors.cell import CellActor, CellRuntime
from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Flush, Kick, Open
from cellactors.actors.replicator import Replicator, SnapshotPolicy
from cellactors.core import acquire as acq
from cellactors.errors import ActivationFailed, AmbiguousWrite, BucketError, CellactorsError
from cellactors.persistence.bucket import Applied, Bucket
from cellactors.persistence.celldb import CellDatabase
from cellactors.persistence.leases import LeaseStore, now_ms
from cellactors.persistence.ownership import OwnershipStore
from cellactors.persistence.restore import create_seal, restore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalCopy:
    """A cleanly passivated activation whose file may be reused if nobody moved since."""

    epoch: int
    last_txid: int
    path: Path


@dataclass
class Active:
    """A finished activation."""

    epoch: int
    cell: pykka.ActorRef[Any]
    replicator: pykka.ActorRef[Any]
    runtime: CellRuntime
    restored_from: str  # "bucket" or "local"


class OwnershipActor(pykka.ThreadingActor):
    """Acquire, restore and release one cell on behalf of one node."""

    use_daemon_thread = True  # a stuck cell must not keep the process alive

    def __init__(
        self,
        cell_id: str,
        cls: type[CellActor],
        bucket: Bucket,
        ownership: OwnershipStore,
        leases: LeaseStore,
        db_path: Path,
        report_failure: Callable[[BaseException], None],
        deadline_s: float,
        snapshots: SnapshotPolicy,
    ) -> None:
        super().__init__()
        self.cell_id = cell_id
        self.cls = cls
        self.bucket = bucket
        self.ownership = ownership
        self.leases = leases
        self.db_path = db_path
        self.report_failure = report_failure
        self.deadline_s = deadline_s
        self.snapshots = snapshots
        self.active: Active | None = None

    # --- acquire ----------------------------------------------------------------------

    def acquire(self, place: Callable[[], acq.Remote | None]) -> acq.Claim | acq.Remote:
        """Run the acquire protocol; returns the applied claim or where the owner lives.

        ``place`` is asked before claiming an unowned cell: it may send it to a peer.
        """
        me = self.ownership.node
        ambiguous = 0
        for _ in range(acq.MAX_ATTEMPTS):
            record = self.ownership.read_owner(self.cell_id)
            decision = acq.decide(me, record, now_ms())
            if isinstance(decision, acq.ReadLease):
                snap = self.leases.read_lease(decision.node)
                decision = acq.decide(me, record, now_ms(), snap.lease if snap else None)
            if isinstance(decision, acq.Remote):
                return decision
            assert isinstance(decision, acq.Claim)
            if record is None or record.released or decision.takeover:
                elsewhere = place()
                if elsewhere is not None:
                    return elsewhere
            try:
                result = self.ownership.cas_owner(self.cell_id, decision.guard, decision.epoch)
            except AmbiguousWrite:
                ambiguous += 1
                if acq.confirmed(me, decision, self.ownership.read_owner(self.cell_id)):
                    return decision
                if ambiguous >= acq.MAX_AMBIGUOUS:
                    break
                continue
            if isinstance(result, Applied):
                if decision.takeover:
                    log.info(
                        "took over %s from expired node %s at epoch %d",
                        self.cell_id,
                        decision.previous_owner,
                        decision.epoch,
                    )
                return decision
        raise ActivationFailed(f"could not acquire {self.cell_id}: too many conflicting attempts")

    # --- activation -------------------------------------------------------------------

    def activate(
        self, claim: acq.Claim, local: LocalCopy | None, previous_epoch: int | None
    ) -> Active:
        """Restore and open the cell at ``claim.epoch``."""
        epoch = claim.epoch
        source = "bucket"
        if (
            local is not None
            and previous_epoch == local.epoch == epoch - 1
            and local.path == self.db_path
        ):
            # Nobody acquired since our clean release: the local file is current. Seal the
            # epoch we wrote so the invariant "every epoch below the current one is sealed"
            # holds exactly as after a bucket restore.
            try:
                create_seal(self.bucket, self.cell_id, local.epoch, local.last_txid, epoch)
                database = CellDatabase(self.db_path)
                last_txid, source = local.last_txid, "local"
            except CellactorsError:
                database, last_txid = self._restore_from_bucket(epoch)
        else:
            database, last_txid = self._restore_from_bucket(epoch)
        channel = ReplicaChannel(last_txid)
        runtime = CellRuntime(
            cell_id=self.cell_id,
            name=self.cell_id.split(":", 1)[1],
            epoch=epoch,
            database=database,
            channel=channel,
            next_txid=last_txid + 1,
        )
        replicator = Replicator.start(
            self.cell_id,
            epoch,
            self.bucket,
            self.ownership,
            channel,
            self.report_failure,
            self.deadline_s,
            self.snapshots,
        )
        channel.on_commit = lambda: replicator.tell(Kick())
        cell = self.cls.start()
        replicator.proxy().cell_ref = cell
        try:
            cell.ask(Open(runtime), timeout=self.deadline_s + 5)
        except BaseException as err:
            cell.stop(block=False)
            replicator.stop(block=False)
            database.discard()
            if isinstance(err, CellactorsError):
                raise ActivationFailed(f"activation of {self.cell_id} failed: {err}") from err
            raise
        self.active = Active(epoch, cell, replicator, runtime, source)
        return self.active

    def _restore_from_bucket(self, epoch: int) -> tuple[CellDatabase, int]:
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.db_path) + suffix).unlink(missing_ok=True)
        database = CellDatabase(self.db_path)
        try:
            result = restore(self.bucket, self.cell_id, epoch, database)
        except BaseException as err:
            database.discard()
            if isinstance(err, (BucketError, CellactorsError)):
                raise ActivationFailed(f"restore of {self.cell_id} failed: {err}") from err
            raise
        return database, result.last_txid

    # --- release ----------------------------------------------------------------------

    def release(self, timeout: float) -> LocalCopy | None:
        """Stop the cell after its queued calls, ship and acknowledge everything, then release
        ownership. Returns the reusable local copy, or None when anything was not clean."""
        active = self.active
        if active is None:
            return None
        self.active = None
        try:
            active.cell.stop(block=True, timeout=timeout)
        except pykka.Timeout:
            pass
        clean = False
        try:
            flush = Flush()
            active.replicator.tell(flush)
            clean = bool(flush.done.get(timeout=timeout))
        except (pykka.Timeout, pykka.ActorDeadError):
            clean = False
        active.replicator.stop(block=False)
        channel = active.runtime.channel
        clean = clean and channel.idle() and channel.failed is None
        try:
            released = self.ownership.release_owner(self.cell_id, active.epoch)
        except (BucketError, AmbiguousWrite) as err:
            log.warning("release of %s failed: %s", self.cell_id, err)
            clean = False
        else:
            clean = clean and isinstance(released, Applied)
        active.runtime.database.close()
        if not clean:
            active.runtime.database.discard()
            return None
        return LocalCopy(active.epoch, channel.acked, self.db_path)

    def abandon(self, error: BaseException) -> None:
        """Stop without releasing (fence or reset): fail held calls, drop the local copy."""
        active = self.active
        self.active = None
        if active is None:
            return
        active.runtime.channel.fail(error)
        active.cell.stop(block=False)
        active.replicator.stop(block=False)

    def discard_local(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.db_path) + suffix).unlink(missing_ok=True)
