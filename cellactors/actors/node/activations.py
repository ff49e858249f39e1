"""The activation catalogue: every cell this node holds, in one place, under one lock.

A cell here is *activating or active* (a :class:`CellHost`: its ownership actor acquires
and restores it, then the host holds the open cell), *closing* (being released or
hibernated; a new activation waits for it), *dormant* (hibernated: owned, file closed; the
next call resumes it with no bucket request) or a *local copy* (released, its file kept).

The catalogue starts activations, resets and gives up cells whose writes or storage failed,
and puts idle ones away; it tells its :class:`ActivationListener` (alarms, outbox) when a
cell opens or leaves. Placement of an unowned cell is :mod:`cellactors.core.placement`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka

from cellactors.actors.cell import CellActor
from cellactors.actors.host import CellHost
from cellactors.actors.messages import ask_method
from cellactors.actors.metrics import NodeMetrics
from cellactors.actors.node.held import Dormant, Stores
from cellactors.actors.node.listener import ActivationListener
from cellactors.actors.node.placement import Placement
from cellactors.actors.node.routes import RouteCache
from cellactors.actors.node.settings import NodeSettings
from cellactors.actors.node.status import WORKING, NodeStatus
from cellactors.actors.ownership import Active, LocalCopy, OwnershipActor
from cellactors.actors.pools import NodePools
from cellactors.actors.storage import StorageHealth
from cellactors.clock import RuntimeClock
from cellactors.core import acquire
from cellactors.errors import (
    ActivationFailed,
    AmbiguousWrite,
    BucketError,
    CallError,
    CellVacant,
    NodeStorageFault,
    NodeUnavailable,
    RemoteOwner,
    StaleRoute,
)
from cellactors.persistence.celldb.database import remove_db_files
from cellactors.persistence.store.bucket import Applied
from cellactors.tracing import spans

log = logging.getLogger(__name__)


class Activations:
    """The cells of one node (see the module's docstring)."""

    def __init__(
        self,
        node_id: str,
        settings: NodeSettings,
        status: Callable[[], NodeStatus],
        stores: Stores,
        cells_dir: Path,
        metrics: NodeMetrics,
        storage: StorageHealth,
        clock: RuntimeClock,
        judge: Callable[[], Any],
        routes: RouteCache,
        placement: Placement,
        services: Any,
        pools: NodePools,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self._status = status
        self.stores = stores
        self.cells_dir = cells_dir
        self.metrics = metrics
        self.storage = storage
        self.clock = clock
        self.judge = judge
        self.routes = routes
        self.placement = placement
        self.pools = pools
        self.services = services  # what a cell asks of its node (calls to other cells)
        self.listener: ActivationListener | None = None
        #: Guards the tables below, and the node's status changes that must agree with them.
        self.lock = threading.RLock()
        self._hosts: dict[str, CellHost] = {}
        self._closing: dict[str, threading.Event] = {}
        self._local: dict[str, LocalCopy] = {}
        self._dormant: dict[str, Dormant] = {}

    # --- what is here ---------------------------------------------------------------------

    def host(self, cell_id: str) -> CellHost | None:
        """The cell's activation here (activating or active), if any."""
        with self.lock:
            return self._hosts.get(cell_id)

    def active(self, cell_id: str) -> Active | None:
        """The cell, if it is open here and ready for calls."""
        host = self.host(cell_id)
        return host.active if host is not None and host.ready.is_set() else None

    def dormant(self, cell_id: str) -> Dormant | None:
        """The cell, if it hibernates here."""
        with self.lock:
            return self._dormant.get(cell_id)

    def local_copy(self, cell_id: str) -> LocalCopy | None:
        """The file a released cell left here for a quick reactivation, if any."""
        with self.lock:
            return self._local.get(cell_id)

    def resident(self) -> list[tuple[str, Active]]:
        """Every open cell, by id."""
        with self.lock:
            return sorted((cid, h.active) for cid, h in self._hosts.items() if h.active is not None)

    def resident_count(self) -> int:
        """Active cells (a thread, a connection and a file each); hibernated ones not counted."""
        with self.lock:
            return sum(1 for h in self._hosts.values() if h.active is not None)

    def has_room(self, limit: int) -> bool:
        """Whether fewer than ``limit`` cells are active. Asked on every activation of an
        unowned cell: while fewer than ``limit`` are hosted at all (activating included) it
        answers without scanning the catalogue, so the lock every call takes stays short."""
        with self.lock:
            if len(self._hosts) < limit:
                return True
            return sum(1 for h in self._hosts.values() if h.active is not None) < limit

    def dormant_count(self) -> int:
        with self.lock:
            return len(self._dormant)

    def dormant_since(self) -> Iterator[tuple[str, float]]:
        """Every hibernated cell with when it was last used."""
        with self.lock:
            items = [(cid, d.last_used) for cid, d in self._dormant.items()]
        yield from items

    # --- activation -----------------------------------------------------------------------

    def activate(
        self,
        cell_id: str,
        cls: type[CellActor],
        forwarded: bool,
        timeout: float,
        vacant_ok: bool = False,
    ) -> Active:
        """The cell open here, activating it if it is not: raises ``RemoteOwner`` (a cached
        route) or the activation's error (``CellVacant`` for a cell never created, with
        ``vacant_ok``: it stays uncreated; without, a read's such try is waited out)."""
        inline = False
        thread: threading.Thread | None = None
        with self.lock:
            status = self._status()
            if status is not NodeStatus.SERVING:
                raise NodeUnavailable(f"node {self.node_id} is {status}")
            host = self._hosts.get(cell_id)
            if host is None:
                route = None if forwarded else self.routes.get(cell_id)
                if route is not None:
                    raise RemoteOwner(route.node, route.addr, route.generation)
                host = CellHost(cell_id, cls)
                self._hosts[cell_id] = host
                # A hibernated cell wakes from its file (no bucket request) in this thread;
                # others in their own, so a slow store cannot keep the caller past its timeout.
                inline = cell_id in self._dormant
                if not inline:  # the caller's trace context goes along (it is a thread's)
                    run = functools.partial(self._run, host, forwarded, vacant_ok, spans.current())
                    thread = threading.Thread(target=run, daemon=True, name=f"activate-{cell_id}")
        if thread is not None:  # started outside the lock: a start waits for the new thread
            thread.start()
        if inline:
            self._run(host, forwarded, False, None)  # in this thread: its context
        try:
            return host.wait(timeout)
        except CellVacant:
            if vacant_ok:
                raise
            return self.activate(cell_id, cls, forwarded, timeout)  # joined a read's try

    def _run(
        self, host: CellHost, forwarded: bool, vacant_ok: bool, trace: spans.Context | None
    ) -> None:
        """Activate ``host``'s cell in its span, under ``trace`` (the caller's context)."""
        with spans.child("cellactors.activate", trace, cell=host.cell_id) as span:
            self._start(host, forwarded, vacant_ok)
            span.outcome(host.error if isinstance(host.error, CallError) else None)
            if host.active is not None:
                span.set(spans.EPOCH, host.active.epoch)
                span.set("cellactors.restored_from", host.active.restored_from)

    def _start(self, host: CellHost, forwarded: bool, vacant_ok: bool) -> None:
        cell_id = host.cell_id
        if (closing := self._closing.get(cell_id)) is not None:
            closing.wait(self.settings.op_deadline)
        own: pykka.ActorRef[Any] | None = None
        try:
            own, host.active = self._start_ownership(host)
            host.ownership = own
            if host.active is None:
                place = functools.partial(self.placement.place, forwarded)  # asked if free
                with spans.child("cellactors.acquire", cell=cell_id):
                    outcome = ask_method(own, "acquire", place, vacant_ok).get()
                if isinstance(outcome, acquire.Vacant):
                    raise CellVacant(cell_id)
                if isinstance(outcome, acquire.Remote):
                    self.routes.remember(cell_id, outcome)
                    raise (
                        StaleRoute(f"{cell_id} is owned by {outcome.node}")
                        if forwarded
                        else RemoteOwner(outcome.node, outcome.addr, outcome.generation)
                    )
                with self.lock:
                    local = self._local.pop(cell_id, None)
                prev = None if outcome.takeover else outcome.epoch - 1
                with spans.child("cellactors.restore", cell=cell_id, epoch=outcome.epoch):
                    host.active = ask_method(own, "activate", outcome, local, prev).get()
            self.metrics.activations.labels(host.cls.__name__, host.active.restored_from).inc()
            status = self._status()
            if status in (NodeStatus.FENCED, NodeStatus.STOPPED):  # draining releases it
                raise NodeUnavailable(f"node {self.node_id} is {status}")
            self._tell().opened(host.active)
        except BaseException as err:
            known = isinstance(err, (CallError, CellVacant))
            host.error = (
                err if known else ActivationFailed(f"activation of {cell_id} failed: {err}")
            )
            if not known:
                log.exception("activation of %s failed", cell_id)
            with self.lock:
                if self._hosts.get(cell_id) is host:
                    del self._hosts[cell_id]
            self._tell().released(cell_id)  # hosted nowhere here: scans treat it as such
            try:
                if own is not None and host.active is not None:
                    ask_method(own, "abandon", host.error).get()
            except pykka.ActorDeadError:
                pass  # a fence already stopped the ownership actor and failed the cell
            finally:
                if own is not None:
                    own.stop(block=False)
        else:
            self.routes.forget(cell_id)
        finally:
            host.ready.set()

    def _start_ownership(self, host: CellHost) -> tuple[pykka.ActorRef[Any], Active | None]:
        """Start the cell's ownership actor. A cell hibernating here is resumed first, in
        this thread, before the actor starts (no bucket request, no hand-off): the actor
        and the active cell. Otherwise, or when the hibernated file cannot be resumed (its
        copy is then offered to the ordinary acquire path, which claims the next epoch and
        reuses the file if it is intact), the actor and None."""
        cell_id = host.cell_id
        listener = self._tell()
        args = (
            cell_id,
            host.cls,
            self.stores.gate,
            self.stores.ownership,
            self.stores.leases,
            self.cells_dir,
            lambda err: self.reset(host, err),
            self.settings.op_deadline,
            self.settings.snapshots,
        )
        kwargs: dict[str, Any] = {
            "on_acked": self.metrics.ack_latency.observe,
            "services": self.services,
            "sink": lambda epoch: listener.sink(cell_id, epoch),
            "judge": self.judge,
            "clock": self.clock,
            "on_storage_fault": lambda fault: self._storage_fault(host, fault),
            "on_broken": lambda: self._give_up(host),
            "pools": self.pools,
        }
        with self.lock:
            dormant = self._dormant.pop(cell_id, None)
        if dormant is not None:
            try:
                return OwnershipActor.start_with(
                    lambda actor: actor.resume(dormant.copy), *args, **kwargs
                )
            except (ActivationFailed, NodeStorageFault) as err:
                log.info("hibernated %s not resumed: %s", cell_id, err)
                with self.lock:
                    self._local[cell_id] = dormant.copy
        return OwnershipActor.start(*args, **kwargs), None

    def _tell(self) -> ActivationListener:
        assert self.listener is not None, "the node sets the listener before any activation"
        return self.listener

    # --- failure --------------------------------------------------------------------------

    def reset(self, host: CellHost, error: BaseException) -> None:
        """The replicator could not prove a write: drop this activation and its local copy
        (in the background)."""

        def run() -> None:
            with self.lock:
                if self._hosts.get(host.cell_id) is host:
                    del self._hosts[host.cell_id]
                self._local.pop(host.cell_id, None)
            self._tell().released(host.cell_id)
            if host.ownership is not None:
                try:
                    ask_method(host.ownership, "abandon", error).get(
                        timeout=self.settings.op_deadline
                    )
                    if host.active is not None:
                        host.active.cell.stop(block=True, timeout=self.settings.op_deadline)
                        host.active.runtime.database.discard()
                except (pykka.Timeout, pykka.ActorDeadError):
                    pass
                host.ownership.stop(block=False)
            log.warning("cell %s reset: %s", host.cell_id, error)

        threading.Thread(target=run, name=f"reset-{host.cell_id}", daemon=True).start()

    def _storage_fault(self, host: CellHost, fault: NodeStorageFault) -> None:
        """A cell (or its activation) met a fault of this node's storage: counted, the
        episode begins if it had not, and a running cell is given up."""
        self.storage.fault(fault.reason)
        self._give_up(host)

    def _give_up(self, host: CellHost) -> None:
        """Release a running cell whose storage failed or whose file is no longer trusted,
        in the background (the cell's own thread reports it): its queued calls are answered,
        what it committed is shipped and acknowledged, ``own.json`` is released and its file
        discarded, so that any node restores it from the bucket."""
        with self.lock:
            if self._hosts.get(host.cell_id) is not host or host.active is None:
                return  # activating (that fails on its own), or already going
        threading.Thread(
            target=self.put_away,
            args=(host.cell_id, False, False, host),
            name=f"give-up-{host.cell_id}",
            daemon=True,
        ).start()

    # --- putting cells away ---------------------------------------------------------------

    def put_away(
        self,
        cell_id: str,
        hibernate: bool,
        keep_copy: bool = True,
        expected: CellHost | None = None,
    ) -> bool:
        """Release (or hibernate) one active cell; ``keep_copy=False`` discards its file
        instead of keeping it as a local copy. ``expected``: only that activation."""
        with self.lock:
            host = self._hosts.get(cell_id)
            if host is None or host.active is None or expected not in (None, host):
                return False
            del self._hosts[cell_id]
            done = self._closing[cell_id] = threading.Event()
        try:
            last_used = host.active.runtime.last_used
            local = self.release(host, keep_ownership=hibernate)
            if local is None or not hibernate:
                self._tell().released(cell_id)
            if local is not None and not keep_copy:
                with contextlib.suppress(OSError):
                    remove_db_files(local.path)
            elif local is not None:
                with self.lock:
                    if not hibernate:
                        self._local[cell_id] = local
                    elif self._status() in WORKING:
                        self._dormant[cell_id] = Dormant(local, last_used)
            return True
        finally:
            self._closed(cell_id, done)

    def _closed(self, cell_id: str, done: threading.Event) -> None:
        done.set()
        with self.lock:
            if self._closing.get(cell_id) is done:
                del self._closing[cell_id]

    def release(self, host: CellHost, keep_ownership: bool = False) -> LocalCopy | None:
        """Release one activation through its ownership actor (or hibernate it, keeping the
        ownership); the local copy it leaves, if any."""
        assert host.ownership is not None
        if not keep_ownership:
            self._tell().released(host.cell_id)
        try:
            local: LocalCopy | None = ask_method(
                host.ownership, "release", self.settings.op_deadline, keep_ownership
            ).get(timeout=self.settings.op_deadline * 3)
        except pykka.Timeout:
            local = None
        host.ownership.stop(block=False)
        return local

    def release_dormant(self, cell_id: str) -> None:
        """Give up a hibernated cell's ownership; its file stays as a reusable local copy."""
        with self.lock:
            dormant = self._dormant.pop(cell_id, None)
            if dormant is None:
                return
            done = self._closing[cell_id] = threading.Event()
        self._tell().released(cell_id)
        copy = dormant.copy
        try:
            released = self.stores.ownership.release_owner(cell_id, copy.epoch, copy.last_txid)
        except (BucketError, AmbiguousWrite) as err:
            log.warning("release of hibernated %s failed: %s", cell_id, err)
            released = None
        try:
            with self.lock:
                if isinstance(released, Applied) and self._status() is NodeStatus.SERVING:
                    self._local[cell_id] = copy
                else:
                    remove_db_files(copy.path)
        finally:
            self._closed(cell_id, done)

    # --- the node's end -------------------------------------------------------------------

    def take_all(self) -> list[CellHost]:
        """Every activation, taken out of the catalogue; hibernated cells are forgotten
        (their files are never reused: a fence leaves nothing to vouch for them). Call with
        :attr:`lock` held, as the node's status changes."""
        hosts = list(self._hosts.values())
        self._hosts.clear()
        self._dormant.clear()
        return hosts

    @staticmethod
    def stop_taken(hosts: list[CellHost], error: BaseException) -> None:
        """Stop activations :meth:`take_all` took (a fence): their held answers fail with
        ``error``, nothing of them is released or written."""
        for host in hosts:
            if host.active is not None:
                host.active.runtime.channel.fail(error)
                host.active.snapshots.cancel()
                host.active.cell.stop(block=False)
                host.active.replicator.stop(block=False)
            if host.ownership is not None:
                host.ownership.stop(block=False)

    def drain(self) -> None:
        """Release every cell (activations under way finish first), a batch at a time, then
        every hibernated one, so that peers restore them without waiting for a takeover."""
        with self.lock:
            pending = [h for h in self._hosts.values() if not h.ready.is_set()]
        for host in pending:
            host.ready.wait(self.settings.op_deadline * 2)
        while True:
            with self.lock:
                hosts = [h for h in self._hosts.values() if h.active is not None][:16]
                for h in hosts:
                    del self._hosts[h.cell_id]
            if not hosts:
                break
            _in_threads([functools.partial(self.release, h) for h in hosts])
        # Cells being hibernated or released right now settle first.
        with self.lock:
            closing = list(self._closing.values())
        for event in closing:
            event.wait(self.settings.op_deadline)
        while True:
            with self.lock:
                dormant = list(self._dormant)[:16]
            if not dormant:
                break
            _in_threads([functools.partial(self.release_dormant, c) for c in dormant])


def _in_threads(jobs: list[Callable[[], object]]) -> None:
    """Run every job in a thread of its own and wait for all of them."""
    threads = [threading.Thread(target=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


__all__ = ["ActivationListener", "Activations", "Dormant", "Stores"]
