"""A node hosts cells: the composition root that wires its parts, its lifecycle, and the
calls it serves.

Its parts: the gated, metered bucket and control-record stores; the lease actor keeping
``nodes/<node>.json``; the activation catalogue (:mod:`.activations`); the collector
(:mod:`.collector`: trims, hibernates, releases idle cells); the route cache
(:mod:`.routes`); the alarm driver and the outbox, told of cells through the catalogue's
listener. The node starts them, fences or drains them, and runs calls (:mod:`.calls`).

Lifecycle (:mod:`.status`): ``starting`` until :meth:`Node.start` holds the lease, then
``serving``; :meth:`Node.drain` passes through ``draining`` to ``stopped``; :meth:`Node.fence`
makes it ``fenced`` for good. Nodes in one process share nothing (data, lease, actors, pools).
"""

from __future__ import annotations

import functools
import logging
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pykka

import cellactors.actors.node.calls as calls
import cellactors.actors.node.introspection as introspection
import cellactors.actors.node.status as status
from cellactors.actors.alarms import AlarmDriver
from cellactors.actors.cell import CellActor
from cellactors.actors.host import CellProxy
from cellactors.actors.lease import FenceDeadline, LeaseActor, LeaseClock
from cellactors.actors.messages import FireAlarm
from cellactors.actors.metrics import NodeMetrics
from cellactors.actors.node.activations import Activations, Stores
from cellactors.actors.node.collector import Collector
from cellactors.actors.node.history import History
from cellactors.actors.node.listener import CellEvents
from cellactors.actors.node.placement import Placement
from cellactors.actors.node.pushes import PushDriver
from cellactors.actors.node.routes import RouteCache
from cellactors.actors.node.settings import Forwarder, NodeSettings
from cellactors.actors.node.status import ENDED, NodeStatus
from cellactors.actors.outbox import OutboxWorkers
from cellactors.actors.ownership import Active
from cellactors.actors.pools import NodePools
from cellactors.actors.storage import StorageHealth
from cellactors.clock import RuntimeClock, local_time
from cellactors.core import keys
from cellactors.core.changes import Change
from cellactors.core.principal import Principal
from cellactors.core.read_budget import QuickReads
from cellactors.core.routing import reroutable_error
from cellactors.core.sockets import Holder
from cellactors.errors import CallError, NotDurable, RemoteOwner, UnknownCell
from cellactors.persistence.celldb.runtime_tables import DeadLetter, RuntimeTables
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.files import private_dir
from cellactors.persistence.history import feed
from cellactors.persistence.history.feed import FeedReader
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.gate import GatedBucket
from cellactors.persistence.store.metered import MeteredBucket
from cellactors.tracing import spans

T = TypeVar("T")

log = logging.getLogger(__name__)


class Node:
    """A cellactors node: hosts cells, routes calls, holds its lease."""

    def __init__(
        self,
        bucket: Bucket,
        node_id: str,
        classes: Iterable[type[CellActor]] = (),
        settings: NodeSettings | None = None,
        on_fence: Callable[[str], None] | None = None,
        pools: NodePools | None = None,
    ) -> None:
        self.settings = settings or NodeSettings()
        #: Which read-only methods have proven quick enough to run on the serving loop.
        self.quick_reads = QuickReads(self.settings.loop_read_budget)
        self.node_id = keys.validate_node_id(node_id)
        #: This node's thread pools, shut down by :meth:`stop` unless they were given.
        self.pools = pools or NodePools.create(self.node_id)
        self._own_pools = pools is None
        self.generation = secrets.token_hex(8)
        self.bucket = MeteredBucket(bucket)  # counts the requests really sent
        # Everything of this node reaches the bucket through the gate a fence closes.
        self.gate = GatedBucket(self.bucket)
        self.classes: dict[str, type[CellActor]] = {}
        for cls in classes:
            self.register(cls)
        self.ownership = OwnershipStore(self.gate, self.node_id)
        self.leases = LeaseStore(self.gate, self.node_id, self.settings.lease_ttl)
        self.metrics = NodeMetrics(self.bucket, lambda: introspection.sample(self))
        self.history = History(self.node_id, self.metrics)
        self.status = NodeStatus.STARTING
        self.fence_reason: str | None = None
        #: Called (with the reason) once the node has fenced itself.
        self.on_fence = on_fence
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.settings.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"cellactors-{self.node_id}-")
            base = Path(self._tmp.name)
        else:
            base = Path(self.settings.data_dir)
        self.cells_dir = private_dir(private_dir(private_dir(base) / self.node_id) / "cells")
        #: The runtime's time (alarms, key retention, transaction stamps): the store's.
        self.clock = RuntimeClock(self.gate.clock)
        #: Faults of the data directory; while degraded the node takes no new cells.
        self.storage = StorageHealth(
            self.cells_dir, self.node_id, on_fault=self.metrics.storage_faults.inc
        )
        self.deadline = FenceDeadline()
        #: Lease expiries are judged on the store's clock (docs/protocol.md, "Clocks").
        self.lease_clock = LeaseClock(
            self.gate.clock,
            self.settings.lease_ttl,
            on_forward_jump=self.fence,
            on_jump=self.metrics.clock_jumps.labels("store").inc,
        )
        self.lease: pykka.ActorRef[Any] = LeaseActor.start(
            self.leases,
            self.generation,
            self.settings.advertise,
            self._load,
            self.fence,
            self.deadline,
            self.settings.max_clock_skew,
            on_renewed=self.metrics.lease_renewals.inc,
            on_wall_jump=self.metrics.clock_jumps.labels("wall").inc,
        )
        self.routes = RouteCache(self.settings.lease_ttl)
        #: The catalogue of this node's cells.
        self.activations = Activations(
            self.node_id,
            self.settings,
            lambda: self.status,
            Stores(self.gate, self.ownership, self.leases),
            self.cells_dir,
            self.metrics,
            self.storage,
            self.clock,
            self.lease_clock.judge,
            self.routes,
            Placement(
                self.node_id,
                self.settings,
                self.storage,
                self.leases,
                lambda limit: self.activations.has_room(limit),
            ),
            services=self,
            pools=self.pools,
        )
        self.collector = Collector(
            self.node_id, self.settings, self.activations, self.storage, lambda: self.status
        )
        self.alarms = AlarmDriver(self, self.settings.alarm_scan_interval)
        self.outbox = OutboxWorkers(self)
        #: Pushes to sockets, sent once durable to the nodes holding the sockets.
        self.pushes = PushDriver(
            Holder(self.node_id, self.settings.advertise, self.generation), self.call_cell
        )
        self.activations.listener = CellEvents(self.alarms, self.outbox, self.pushes)
        self.runner = calls.CallRunner(self)
        #: How calls between cells reach a cell owned by another live node (None: they
        #: fail with ``RemoteOwner``, ``not_run``).
        self.forwarder: Forwarder | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, give_up_after: float | None = None) -> Node:
        """Take the node lease (waiting while another live process holds the identity)."""
        expires = self.lease.proxy().take(give_up_after).get()
        log.info(
            "node %s (generation %s) holds its lease until %s",
            self.node_id,
            self.generation,
            local_time(expires),
        )
        # This process holds the identity now; local copies of an earlier process of this
        # node cannot be proven current (nothing in memory vouches for them): drop them.
        for stale in self.cells_dir.iterdir():
            stale.unlink(missing_ok=True)
        self.status = NodeStatus.SERVING
        self.collector.start()
        self.history.start()
        self.alarms.start()  # its first scan runs now: alarms of orphaned cells fire
        return self

    def set_forwarder(self, forwarder: Forwarder | None) -> None:
        """Install how calls between cells reach cells owned by live peers."""
        self.forwarder = forwarder

    def register(self, cls: type[CellActor]) -> None:
        """Serve ``cls`` under its class name (checked for clashes with the runtime)."""
        cls.check_definition()
        self.classes[cls.__name__] = cls

    def fence(self, reason: str) -> None:
        """Self-fence: stop every cell, fail held calls, acknowledge and write nothing more."""
        with self.activations.lock:
            if self.status in ENDED:
                return
            # Close the gate first: from the SELF-FENCE line on, nothing reaches the bucket.
            self.gate.close_gate(reason)
            self.status = NodeStatus.FENCED
            self.fence_reason = reason
            self.metrics.fences.inc()
            hosts = self.activations.take_all()
        log.error("SELF-FENCE: node %s: %s", self.node_id, reason)
        self.lease_clock.close()
        self.alarms.stop()
        self.outbox.stop()
        try:
            self.lease.proxy().pause()  # a fenced node writes nothing more, not even its lease
        except pykka.ActorDeadError:
            pass
        # Held answers may belong to writes that are durable already: their outcome is unknown.
        error = NotDurable(
            f"node {self.node_id} fenced itself with this call's answer held: {reason}"
        )
        self.activations.stop_taken(hosts, error)
        self.collector.stop()
        if self.on_fence is not None:
            self.on_fence(reason)

    def drain(self) -> None:
        """Graceful stop: refuse new calls, finish queued ones, release every cell (a batch at
        a time), then expire the lease so peers can take over at once."""
        with self.activations.lock:
            if self.status in (*ENDED, NodeStatus.DRAINING):
                return
            self.status = NodeStatus.DRAINING
        self.collector.stop()
        self.alarms.stop()  # the entries stay in the bucket: peers' scans find them
        self.outbox.stop()
        self.activations.drain()
        try:
            self.lease.proxy().expire().get(timeout=self.settings.op_deadline)
        except (pykka.Timeout, pykka.ActorDeadError):
            pass
        self.lease.stop(block=False)
        self.status = NodeStatus.STOPPED

    def stop(self) -> None:
        """Drain if serving; always stop the lease actor and clean temporary files."""
        if self.status in (NodeStatus.SERVING, NodeStatus.STARTING):
            self.drain()
        self.lease_clock.close()
        self.collector.stop()
        self.history.stop()
        self.alarms.stop()
        self.outbox.stop()
        self.pushes.stop()
        try:
            # A fenced node does not wait for a lease request that may hang: it writes nothing
            # more anyway, and its process must exit promptly.
            self.lease.stop(block=self.status is not NodeStatus.FENCED, timeout=5)
        except pykka.Timeout:
            pass
        if self.status is not NodeStatus.FENCED:
            self.status = NodeStatus.STOPPED
        if self._own_pools:
            self.pools.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()

    def may_send(self) -> bool:
        """Whether this node may still write to the bucket on its own initiative (wake
        entry clean-up, scans): serving or draining, and within its lease deadline."""
        return status.may_send(self.status, self.deadline.passed())

    def may_answer(self) -> bool:
        """Whether an answer may still be sent, checked right before a held answer leaves the
        node (see :func:`cellactors.actors.node.status.may_answer`)."""
        return status.may_answer(self.status, self.fence_reason is not None, self.deadline.passed())

    # --- calls --------------------------------------------------------------------------

    def cell(self, cls: type[CellActor] | str, name: str) -> CellProxy:
        cls_name = cls if isinstance(cls, str) else cls.__name__
        if not isinstance(cls, str) and cls_name not in self.classes:
            self.register(cls)
        return CellProxy(self, cls_name, name)

    def call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any] | None = None,
        *,
        args: tuple[Any, ...] = (),
        forwarded: bool = False,
        timeout: float | None = None,
        key: str | None = None,
        result_check: Callable[[Any], None] | None = None,
        chain: tuple[str, ...] = (),
        caller: Principal | None = None,
    ) -> Any:
        """Run ``method`` on cell ``cls_name:name``; returns once the result is durable.

        ``chain``: the cells waiting on this call (a cycle is refused, ``CallCycle``).
        ``key``: the idempotency key, recorded per ``caller`` (``self.caller`` in the
        method). ``result_check`` runs on the result before commit; raising rolls the call
        back (``BadResult``). Counted in the metrics by outcome (a call routed to a live
        peer as routed away: the owner counts it)."""
        run = functools.partial(self.runner.call, cls_name, name, method, kwargs, args)
        return calls.counted(
            self.metrics,
            self.classes,
            cls_name,
            method,
            time.monotonic(),
            lambda: run(forwarded, timeout, key, result_check, chain, caller),
        )

    def submit_here(
        self, cls_name: str, name: str, method: str, kwargs: dict[str, Any], **options: Any
    ) -> calls.Submitted | None:
        """Hand a call to its cell without blocking, when the cell is active here; the
        ``options`` and the answer are those of
        :meth:`cellactors.actors.node.calls.CallRunner.submit_here`."""
        return self.runner.submit_here(cls_name, name, method, kwargs, **options)

    def still_pending(self, sub: calls.Submitted) -> bool:
        """A submitted call without its answer yet (see :class:`calls.CallRunner`)."""
        return self.runner.still_pending(sub)

    def answer(self, sub: calls.Submitted) -> Any:
        """The answer of a submitted call whose reply is set (see :class:`calls.CallRunner`)."""
        return self.runner.answer(sub)

    def call_cell(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        chain: tuple[str, ...] = (),
        caller: Principal | None = None,
    ) -> Any:
        """A call from a cell (or the outbox) to any cell of the fleet: run here, or sent
        to its live owner through :attr:`forwarder`. An answer proving the call ran nowhere
        because of the route (:mod:`cellactors.core.routing`) makes the node look the owner
        up once more."""
        for attempt in (1, 2):
            try:
                return self.call(
                    cls_name, name, method, kwargs, key=key, chain=chain, caller=caller
                )
            except RemoteOwner as owner:
                if self.forwarder is None:
                    raise
                try:
                    return self.forwarder(owner, cls_name, name, method, kwargs, key, chain, caller)
                except CallError as err:
                    if attempt == 2 or not reroutable_error(err):
                        raise
                    self.forget_route(cls_name, name)
        raise AssertionError("unreachable")  # pragma: no cover

    def activate_here(self, cell_id: str) -> Active:
        """Activate (or resume) a cell on this node through the ownership path, never
        placing it elsewhere: :class:`StaleRoute` when a live peer owns it."""
        cls_name = cell_id.split(":", 1)[0]
        cls = self.classes.get(cls_name)
        if cls is None:
            raise UnknownCell(f"no cell class {cls_name!r} is served here")
        return self.activations.activate(cell_id, cls, True, self.settings.call_timeout)

    def fire_alarm(self, cell_id: str) -> Any:
        """Run the cell's alarm here if it is due (activating or resuming the cell);
        returns the cell's answer (``fired``, ``retry``, ``abandoned``, ``not_due``) once
        it is durable."""

        def fire() -> FireAlarm:
            return FireAlarm(trace=spans.current())  # run under the alarm's span

        return self.runner.run_here(cell_id, fire, "its alarm was due", check_answer=False)

    # --- dead letters (the outbox's messages given up) ----------------------------------

    def dead_letters(self, cls: type[CellActor] | str, name: str) -> list[DeadLetter]:
        """The cell's dead letters, oldest first (activating the cell here if no live peer
        owns it; :class:`~cellactors.errors.RemoteOwner` when one does)."""
        letters: list[DeadLetter] = self._edit_runtime(
            cls, name, lambda tables, _txid: tables.dead_letters()
        )
        return letters

    def retry_dead_letters(
        self, cls: type[CellActor] | str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]:
        """Move the cell's dead letters ``ids`` (default: all) back into its outbox, durably,
        to be delivered again under the same message ids (idempotency keys); returns the
        ids moved (unknown ones are skipped)."""
        wanted = None if ids is None else list(ids)
        moved: list[str] = self._edit_runtime(
            cls, name, lambda tables, txid: tables.revive(wanted, txid, self.clock.now_ms())
        )
        return moved

    def purge_dead_letters(
        self, cls: type[CellActor] | str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]:
        """Delete the cell's dead letters ``ids`` (default: all) for good, durably; returns
        the ids deleted."""
        wanted = None if ids is None else list(ids)
        gone: list[str] = self._edit_runtime(cls, name, lambda tables, _txid: tables.purge(wanted))
        return gone

    def _edit_runtime(
        self, cls: type[CellActor] | str, name: str, apply: Callable[[RuntimeTables, int], T]
    ) -> T:
        """Run ``apply`` in a transaction of the cell on this node; its result once durable."""
        cell_id = keys.make_cell_id(cls if isinstance(cls, str) else cls.__name__, name)
        result: T = self.runner.edit_runtime(cell_id, apply, self.routes)
        return result

    # --- routes -------------------------------------------------------------------------

    def routed_elsewhere(self, cell_id: str) -> bool:
        """A live peer owned the cell when this node last looked (a cached route)."""
        return self.routes.get(cell_id) is not None

    def forget_route(self, cls_name: str, name: str) -> None:
        self.routes.forget(keys.make_cell_id(cls_name, name))

    # --- idle cells (the collector does this on its own) --------------------------------

    def passivate(self, cell_id: str) -> bool:
        """Release one idle cell, keeping its local copy for a quick reactivation."""
        return self.activations.put_away(cell_id, hibernate=False)

    def hibernate(self, cell_id: str) -> bool:
        """Close one idle cell, keeping its ownership (it resumes with no bucket request)."""
        return self.activations.put_away(cell_id, hibernate=True)

    # --- introspection ------------------------------------------------------------------

    def resident_cells(self) -> int:
        """Active cells (a thread, a connection and a file each); hibernated ones not counted."""
        return self.activations.resident_count()

    def hibernated_cells(self) -> int:
        return self.activations.dormant_count()  # owned, closed, nothing running

    def _load(self) -> dict[str, Any]:
        """What the lease advertises to peers' placement (a degraded node gets no cells)."""
        return introspection.load(self)

    def store_time(self) -> float:
        """The store's time in epoch seconds, as this node knows it (signed forwards)."""
        return self.gate.clock.now_ms() / 1000

    def state(self) -> dict[str, Any]:
        """This node and its resident cells (``GET /state``)."""
        return introspection.node_state(self)

    def fleet(self) -> dict[str, Any]:
        """Every node lease in the bucket, live or expired (``GET /fleet``), through this
        node's gate."""
        return introspection.fleet_view(self.node_id, self.leases, self.gate.clock.now_ms)

    def metrics_text(self) -> str:
        """This node's metrics in the Prometheus text format (``GET /metrics``)."""
        return self.metrics.render().decode("utf-8")

    # --- change feed: logic in cellactors.persistence.history.feed -----------------------

    def feed_reader(self, cell_id: str) -> FeedReader:
        """A reader of ``cell_id``'s change feed through this node's gated bucket."""
        return FeedReader(self.gate, cell_id, self.pools.feed)

    def feed_stream_refused(self) -> None:
        """Count a follow stream the public listener refused at its cap."""
        self.metrics.feed_streams_refused.inc()

    def changes(self, cls_name: str, name: str, after: int = 0, **kw: Any) -> Iterator[Change]:
        """The cell's acknowledged transactions after ``after`` from the bucket
        (:func:`cellactors.persistence.history.feed.changes`: ``follow``, ``wait``, ...)."""
        kw.setdefault("pool", self.pools.feed)
        return feed.changes(self.gate, keys.make_cell_id(cls_name, name), after, **kw)


__all__ = ["CellProxy", "Node", "NodeSettings"]
