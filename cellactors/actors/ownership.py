"""The ownership actor of one cell: acquires it, restores it, opens its mailbox, releases it.

A cell's mailbox stays closed until :meth:`OwnershipActor.activate` finishes: callers wait on
the host's ``ready`` event, so calls that arrive meanwhile wait instead of being dropped.
The decisions come from :mod:`cellactors.core.acquire`; this actor performs the reads and
conditional writes they ask for.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from cellactors.actors.cell import CellActor
from cellactors.actors.cell_runtime import CellRuntime
from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Flush, Kick, ask_attribute
from cellactors.actors.pools import NodePools
from cellactors.actors.pykka_ext import PooledActor
from cellactors.actors.replicator import EffectSink, Replicator
from cellactors.actors.snapshots import ChainState, SnapshotPolicy, SnapshotWorker
from cellactors.clock import RuntimeClock
from cellactors.core import acquire as acq
from cellactors.core import keys
from cellactors.core.alarms import WakeState
from cellactors.core.storage import storage_fault_reason
from cellactors.core.types import Absent
from cellactors.errors import (
    ActivationFailed,
    ActivationRaised,
    AmbiguousWrite,
    BucketError,
    CallError,
    CellactorsError,
    MethodFailed,
    NodeStorageFault,
    NotDurable,
)
from cellactors.persistence.celldb.database import CellDatabase, remove_db_files
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.files import DIR_MODE
from cellactors.persistence.history.restore import restore
from cellactors.persistence.history.seals import create_seal
from cellactors.persistence.store.bucket import Applied, Bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalCopy:
    """A cleanly passivated activation whose file may be reused if nobody moved since.

    ``identity`` (inode, size, mtime) is taken after the file was closed; a file that no
    longer matches it is never reused."""

    epoch: int
    last_txid: int
    path: Path
    identity: tuple[int, int, int]
    chain: ChainState


def _activation_error(cell_id: str, err: BaseException) -> BaseException:
    """What a failed ``open_here`` is answered with. The cell's own ``on_activate`` raising
    is :class:`ActivationRaised` (not retryable: the same code fails again), unless what it
    raised is a transient refusal of a call it made to another cell (that cell's node was
    unavailable, say): then, like every runtime failure, :class:`ActivationFailed`
    (retryable). A storage fault of this node stays itself."""
    if isinstance(err, NodeStorageFault) or not isinstance(err, CellactorsError):
        return err
    if isinstance(err, MethodFailed):
        cause = err.__cause__
        transient = isinstance(cause, CallError) and cause.retryable
        if not transient:
            return ActivationRaised(err.exc_type, err.exc_message, cell_id)
    return ActivationFailed(f"activation of {cell_id} failed: {err}")


def file_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Active:
    """A finished activation."""

    epoch: int
    cell: pykka.ActorRef[Any]
    replicator: pykka.ActorRef[Any]
    runtime: CellRuntime
    snapshots: SnapshotWorker
    restored_from: str  # "bucket", "local" (a released copy reused) or "hibernated"
    wakes: WakeState  # the alarm and outbox state right after ``on_activate``


class OwnershipActor(PooledActor):
    """Acquire, restore and release one cell on behalf of one node (an actor on a shared
    pool of its node's: an idle cell's ownership actor holds no thread)."""

    def __init__(
        self,
        cell_id: str,
        cls: type[CellActor],
        bucket: Bucket,
        ownership: OwnershipStore,
        leases: LeaseStore,
        cells_dir: Path,
        report_failure: Callable[[BaseException], None],
        deadline_s: float,
        snapshots: SnapshotPolicy,
        on_acked: Callable[[float], None] | None = None,
        services: Any = None,
        sink: Callable[[int], EffectSink] | None = None,
        judge: Callable[[], int | None] | None = None,
        clock: RuntimeClock | None = None,
        on_storage_fault: Callable[[NodeStorageFault], None] | None = None,
        on_broken: Callable[[], None] | None = None,
        *,
        pools: NodePools,
    ) -> None:
        super().__init__()
        self.pools = pools
        self.pool = pools.ownership
        self.clock = clock or RuntimeClock(bucket.clock)
        #: The store time lease expiries are judged against (None: not now), see
        #: :class:`cellactors.actors.lease.LeaseClock`.
        self.judge = judge or bucket.clock.low_ms
        #: Told of each fault of the node's storage met by this cell (its activation or its
        #: database), and when the cell's file is no longer trusted: the node counts the
        #: fault and gives the running cell up.
        self.on_storage_fault = on_storage_fault
        self.on_broken = on_broken
        self.services = services  # what the cell asks of its node (calls to other cells)
        self.sink = sink  # per epoch: the wake entries and outbox around acknowledgements
        self.on_acked = on_acked  # each transaction's commit-to-ack time (metrics)
        self.cell_id = cell_id
        self.cls = cls
        self.bucket = bucket
        self.ownership = ownership
        self.leases = leases
        self.cells_dir = cells_dir
        self.report_failure = report_failure
        self.deadline_s = deadline_s
        self.snapshots = snapshots
        self.active: Active | None = None

    # --- acquire ----------------------------------------------------------------------

    def acquire(
        self, place: Callable[[], acq.Remote | None], vacant_ok: bool = False
    ) -> acq.Claim | acq.Remote | acq.Vacant:
        """Run the acquire protocol; returns the applied claim or where the owner lives.

        ``place`` is asked before claiming an unowned cell: it may send it to a peer. With
        ``vacant_ok``, a cell that has never existed is not created: :class:`acq.Vacant`.
        """
        me = self.ownership.node
        ambiguous = 0
        for _ in range(acq.MAX_ATTEMPTS):
            record = self.ownership.read_owner(self.cell_id)
            if record is None and vacant_ok:
                return acq.Vacant()
            decision = acq.decide(me, record, None)
            if isinstance(decision, acq.ReadLease):
                snap = self.leases.read_lease(decision.node)  # its answer feeds the clock
                decision = acq.decide(me, record, self.judge(), snap.lease if snap else None)
            if isinstance(decision, acq.Defer):
                raise ActivationFailed(
                    f"{self.cell_id} is owned by {decision.node}, whose lease cannot be judged "
                    "while the store's clock settles after a jump; try again shortly"
                )
            if isinstance(decision, acq.Remote):
                return decision
            assert isinstance(decision, acq.Claim)
            if record is None or record.released or decision.takeover:
                elsewhere = place()
                if elsewhere is not None:
                    return elsewhere
            try:
                result = self.ownership.cas_owner(
                    self.cell_id, decision.guard, decision.epoch, decision.floor
                )
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
        """Restore and open the cell at ``claim.epoch``.

        Each activation has its own file (:func:`~cellactors.core.keys.local_db_name`),
        so nothing done to an older activation's file (a reset discarding it, say) can touch
        this one.

        A fault of the node's storage fails the activation with
        :class:`~cellactors.errors.NodeStorageFault` after ``own.json`` is released at the
        claimed epoch, so that another node can take the cell at once.
        """
        try:
            return self._activate(claim, local, previous_epoch)
        except BaseException as err:
            fault = self._as_storage_fault(err)
            if fault is None:
                raise
            self._give_back(claim.epoch, claim.floor)
            if fault is err:
                raise
            raise fault from err

    def _as_storage_fault(self, err: BaseException) -> NodeStorageFault | None:
        """``err`` as a fault of the node's storage met by this activation (reported once),
        or None when it is not one."""
        if isinstance(err, NodeStorageFault):
            return err  # the cell's database raised it, and reported it
        reason = storage_fault_reason(err)
        if reason is None:
            return None
        fault = NodeStorageFault(
            f"activation of {self.cell_id} failed: this node's local storage failed "
            f"({reason}); the call did not run",
            reason,
        )
        if self.on_storage_fault is not None:
            self.on_storage_fault(fault)
        return fault

    def _give_back(self, epoch: int, floor: int) -> None:
        """Release ``own.json`` after a failed activation at ``epoch``: nothing acknowledged
        depends on this activation (the floor it claimed with stays the record's), and a
        live owner's record would keep every other node from serving the cell. A late
        upload of this activation lands beyond the seal the next owner writes."""
        try:
            self.ownership.release_owner(self.cell_id, epoch, floor)
        except (BucketError, AmbiguousWrite) as err:
            log.warning("release of %s after a storage fault failed: %s", self.cell_id, err)

    def _database(self, path: Path) -> CellDatabase:
        """Open the cell's file, reporting its storage faults and distrust to the node. A
        cells directory removed under the running node is made again (0700), as the node
        made it; one that cannot be made fails the open below, as a storage fault."""
        with contextlib.suppress(OSError):
            path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        database = CellDatabase(path)
        database.on_fault = self.on_storage_fault
        database.on_broken = self.on_broken
        return database

    def _activate(
        self, claim: acq.Claim, local: LocalCopy | None, previous_epoch: int | None
    ) -> Active:
        epoch = claim.epoch
        path = self.cells_dir / keys.local_db_name(self.cell_id, epoch)
        remove_db_files(path)
        source = "bucket"
        database: CellDatabase | None = None
        if (
            local is not None
            and previous_epoch == local.epoch == epoch - 1
            and file_identity(local.path) == local.identity
        ):
            # Nobody acquired since our clean release and the file is the one we closed: it
            # is current. Seal the epoch we wrote so "every epoch below the current one is
            # sealed" holds exactly as after a bucket restore.
            try:
                create_seal(self.bucket, self.cell_id, local.epoch, local.last_txid, epoch)
                local.path.replace(path)
                database = self._database(path)
                last_txid, source, chain = local.last_txid, "local", local.chain
            except (CellactorsError, OSError) as err:
                log.info("local copy of %s not reused: %s", self.cell_id, err)
                remove_db_files(path)
        if local is not None:
            remove_db_files(local.path)
        if database is None and isinstance(claim.guard, Absent):
            # Nobody ever owned the cell: its own.json did not exist, and this claim created
            # it (own.json is never deleted). So no batch, seal or snapshot of it can exist:
            # nothing to list, restore or seal.
            database, last_txid, chain, source = self._database(path), 0, ChainState(), "new"
        if database is None:
            database, last_txid, chain = self._restore_from_bucket(path, epoch, claim.floor)
        return self._open(epoch, database, last_txid, chain, source)

    def resume(self, dormant: LocalCopy) -> Active:
        """Wake a hibernated cell: this node still owns it at ``dormant.epoch`` and the file
        is the one it closed, so it opens without a bucket request."""
        if file_identity(dormant.path) != dormant.identity:
            raise ActivationFailed(f"the hibernated file of {self.cell_id} changed")
        try:
            database = self._database(dormant.path)
            return self._open(
                dormant.epoch, database, dormant.last_txid, dormant.chain, "hibernated"
            )
        except BaseException as err:
            fault = self._as_storage_fault(err)
            if fault is None or fault is err:
                raise
            raise fault from err

    def _open(
        self,
        epoch: int,
        database: CellDatabase,
        last_txid: int,
        chain: ChainState,
        source: str,
    ) -> Active:
        """Start the replicator and the cell on an open database and open its mailbox."""
        channel = ReplicaChannel(last_txid)
        channel.on_acked = self.on_acked
        runtime = CellRuntime(
            cell_id=self.cell_id,
            name=self.cell_id.split(":", 1)[1],
            epoch=epoch,
            database=database,
            channel=channel,
            next_txid=last_txid + 1,
            services=self.services,
            clock=self.clock,
        )
        worker = SnapshotWorker(
            self.cell_id,
            epoch,
            self.bucket,
            lambda: self._owns(epoch),
            self.pools.snapshots,
            self.snapshots.retain_s,
        )
        actor = self.cls.start_unopened()
        cell = actor.actor_ref
        replicator: pykka.ActorRef[Any] | None = None
        try:
            replicator, _ = Replicator.start_with(
                lambda actor: setattr(actor, "cell_ref", cell),  # before any message
                self.cell_id,
                epoch,
                self.bucket,
                self.ownership,
                channel,
                self.report_failure,
                self.deadline_s,
                self.snapshots,
                chain,
                worker,
                self.sink(epoch) if self.sink is not None else None,
                pools=self.pools,
            )
            channel.on_commit = functools.partial(replicator.tell, Kick())
            with self.pool.blocking():  # on_activate may activate another cell
                wakes = actor.open_here(runtime)
        except BaseException as err:
            cell.stop(block=False)
            if replicator is not None:
                replicator.stop(block=False)
            database.discard()
            failure = _activation_error(self.cell_id, err)
            # on_activate raising was logged once, with the user's frames, by the executor
            if failure is err:
                raise
            raise failure from err
        self.active = Active(epoch, cell, replicator, runtime, worker, source, wakes)
        return self.active

    def _owns(self, epoch: int) -> bool:
        """A fresh read of ``own.json`` still names this node at ``epoch``."""
        record = self.ownership.read_owner(self.cell_id)
        return acq.names(record, self.ownership.node, epoch)

    def _restore_from_bucket(
        self, path: Path, epoch: int, floor: int
    ) -> tuple[CellDatabase, int, ChainState]:
        """Restore from the bucket, never below ``floor`` (the txid the last release
        recorded: a listing that does not show it yet is waited for)."""
        database = self._database(path)
        try:
            result = restore(
                self.bucket,
                self.cell_id,
                epoch,
                database,
                floor=floor,
                lag_wait_s=self.deadline_s,
                pool=self.pools.fetches,
            )
        except BaseException as err:
            database.discard()
            if isinstance(err, (BucketError, CellactorsError)) and not isinstance(
                err, NodeStorageFault
            ):
                raise ActivationFailed(f"restore of {self.cell_id} failed: {err}") from err
            raise
        chain = ChainState(
            snapshot_txid=result.snapshot[1] if result.snapshot else 0,
            since_txids=result.since_txids,
            since_bytes=result.since_bytes,
        )
        return database, result.last_txid, chain

    # --- release ----------------------------------------------------------------------

    def release(self, timeout: float, keep_ownership: bool = False) -> LocalCopy | None:
        """Stop the cell after its queued calls, ship and acknowledge everything, then release
        ownership. Returns the reusable local copy, or None when anything was not clean or
        the file is no longer trusted (``CellDatabase.broken``).

        ``keep_ownership`` hibernates instead: the same quiescing, but ``own.json`` keeps
        naming this node, so :meth:`resume` can reopen the returned copy at the same epoch
        with no bucket request."""
        active = self.active
        if active is None:
            return None
        self.active = None
        channel = active.runtime.channel
        try:
            with self.pool.blocking():  # its running call may activate another cell
                active.cell.stop(block=True, timeout=timeout)
        except pykka.Timeout:
            # A call is still running: never release under it. Fail what it holds, keep the
            # ownership (peers take over when the lease goes), and drop the file.
            log.warning("cell %s did not stop within %gs; not releasing", self.cell_id, timeout)
            channel.fail(NotDurable(f"{self.cell_id} was stopped while a call was running"))
            active.snapshots.cancel()
            active.replicator.stop(block=False)
            return None
        clean = False
        chain = ChainState()
        try:
            flush = Flush()
            active.replicator.tell(flush)
            clean = bool(flush.done.get(timeout=timeout))
            chain = ask_attribute(active.replicator, "chain").get(timeout=timeout)
        except (pykka.Timeout, pykka.ActorDeadError):
            clean = False
        active.replicator.stop(block=False)
        clean = clean and channel.idle() and channel.failed is None
        # Snapshot work is owner work: it ends (or is cancelled) before own.json is released.
        if not active.snapshots.finish(timeout):
            active.runtime.database.discard()
            return None
        if not keep_ownership:
            try:
                released = self.ownership.release_owner(self.cell_id, active.epoch, channel.acked)
            except (BucketError, AmbiguousWrite) as err:
                log.warning("release of %s failed: %s", self.cell_id, err)
                clean = False
            else:
                clean = clean and isinstance(released, Applied)
        database = active.runtime.database
        database.close()
        identity = file_identity(database.path)
        if not clean or identity is None or database.broken:
            database.discard()
            return None
        return LocalCopy(active.epoch, channel.acked, database.path, identity, chain)

    def abandon(self, error: BaseException) -> None:
        """Stop without releasing (fence or reset): fail held calls, drop the local copy."""
        active = self.active
        self.active = None
        if active is None:
            return
        active.runtime.channel.fail(error)
        active.snapshots.cancel()
        active.cell.stop(block=False)
        active.replicator.stop(block=False)
