"""A node hosts cells: it routes calls, activates cells through their ownership actors,
passivates idle ones, and keeps the node lease through the lease actor.

Several nodes may live in one process against one bucket (the protocol tests do this);
each has its own data directory, lease and actors.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pykka

import cellactors.actors.limits as limits
from cellactors.actors.alarms import AlarmDriver
from cellactors.actors.cell import CellActor, check_arguments, check_serializable
from cellactors.actors.host import CellHost, CellProxy
from cellactors.actors.lease import FenceDeadline, LeaseActor, LeaseClock
from cellactors.actors.messages import EditRuntime, FireAlarm, Invoke, ask_method
from cellactors.actors.metrics import OK, UNSERVED, NodeMetrics, NodeSample
from cellactors.actors.outbox import OutboxWorkers
from cellactors.actors.ownership import Active, LocalCopy, OwnershipActor
from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.actors.storage import DEGRADED, StorageHealth
from cellactors.clock import RuntimeClock
from cellactors.core import acquire, keys
from cellactors.core import alarms as alarm_rules
from cellactors.core.dead_letters import DeadLetterPolicy
from cellactors.core.idempotency import check_key
from cellactors.core.read_budget import DEFAULT_BUDGET_S, QuickReads
from cellactors.errors import (
    NOT_RUN,
    UNKNOWN,
    ActivationFailed,
    AmbiguousWrite,
    BadRequest,
    BucketError,
    CallCycle,
    CallError,
    ConfigError,
    InvalidCellId,
    NodeStorageFault,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
    UnknownMethod,
)
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.database import remove_db_files
from cellactors.persistence.celldb.runtime_tables import DeadLetter, RuntimeTables
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Applied, Bucket
from cellactors.persistence.store.gate import GatedBucket
from cellactors.persistence.store.metered import MeteredBucket

T = TypeVar("T")

#: Seconds without a call after which a resident cell's SQLite caches are handed back
#: (``PRAGMA shrink_memory``; about a third of an idle cell's memory).
TRIM_AFTER_S = 2.0
log = logging.getLogger(__name__)


@dataclass
class NodeSettings:
    """Tunables of a node; the defaults match docs/protocol.md."""

    lease_ttl: float = 10.0
    op_deadline: float = 15.0
    call_timeout: float = 30.0
    #: Idle seconds before a cell is released (passivated): ownership given up, its file kept
    #: only as a local copy that a later activation of this process may reuse.
    idle_timeout: float = 300.0
    #: Idle seconds before a resident cell hibernates: it keeps its ownership and its file but
    #: holds no thread, connection or file descriptor, and wakes with no bucket request.
    #: Hibernation is off when this is not below ``idle_timeout``.
    hibernate_timeout: float = 30.0
    max_resident_cells: int = 10_000
    max_clock_skew: float | None = None  # seconds; None: TTL/4
    advertise: str = ""
    data_dir: Path | None = None
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    #: How long a cell remembers an idempotency key (a retry after that runs again).
    idempotency_window_s: float = calls.DEFAULT_WINDOW_S
    #: How many keys a cell remembers at most (the oldest are forgotten first).
    idempotency_max_keys: int = calls.DEFAULT_MAX_KEYS
    #: Seconds between two scans of the bucket's due wake entries (one LIST request each
    #: when nothing is due): an alarm of a cell whose node died or was drained fires within
    #: this of its time (once that node's lease expired); a node scans when an alarm of a
    #: cell it released falls due, so those fire within a second.
    alarm_scan_interval: float = 30.0
    #: Seconds a read-only call may take on the serving event loop (``submit_here``): a
    #: method runs there only once its last runs each took less, and its SQL is interrupted
    #: (and the call run again in a worker thread) past it.
    loop_read_budget: float = DEFAULT_BUDGET_S
    #: An outbox message is a dead letter after this many deliveries refused because the
    #: target serves no such class or method (at once when refused for good or it raised).
    outbox_max_attempts: int = 10
    #: ... or once it has been undelivered this many seconds, for any reason.
    outbox_max_age: float = 3600.0

    def __post_init__(self) -> None:
        self.retention()  # refuse bad idempotency settings when the node is configured
        if not self.alarm_scan_interval > 0:
            raise ConfigError(f"alarm scan interval must be positive: {self.alarm_scan_interval}")
        try:
            DeadLetterPolicy(self.outbox_max_attempts, self.outbox_max_age)
        except ValueError as err:
            raise ConfigError(f"outbox dead-letter bounds: {err}") from err

    def retention(self) -> calls.Retention:
        """The idempotency-key retention these settings describe."""
        return calls.Retention(self.idempotency_window_s, self.idempotency_max_keys)


#: Sends a call to the live node that owns the cell (``cellactors serve`` installs a
#: signed HTTP forwarder; in-process fleets may call the owner's ``Node`` directly):
#: ``(owner, cls_name, name, method, kwargs, key, chain) -> result``.
Forwarder = Callable[[RemoteOwner, str, str, str, dict[str, Any], str | None, tuple[str, ...]], Any]


@dataclass(frozen=True)
class Dormant:
    """A hibernated cell: ``own.json`` still names this node at ``copy.epoch`` and
    ``copy.path`` is the file it closed; ``last_used`` is when it was last called."""

    copy: LocalCopy
    last_used: float


def _deliver(
    cls: type[CellActor], active: Active, invoke: Invoke, reads: QuickReads | None = None
) -> bool:
    """Hand a call to its cell: run right here when the method is read-only and the cell is
    idle (:func:`~cellactors.actors.cell.read_only`), timed into ``reads``, else into its
    mailbox (which raises ``ActorDeadError`` when the cell has stopped). False when an inline
    run was interrupted past its budget (``invoke.interrupt_at``): it had no effect and no
    answer, and must be sent again off the loop."""
    run_inline = active.runtime.run_inline
    if run_inline is not None and invoke.method in cls.read_only_methods():
        started = time.perf_counter()
        if run_inline(invoke):
            if reads is not None:
                reads.ran((cls.__name__, invoke.method), time.perf_counter() - started)
            return not invoke.interrupted
    active.cell.tell(invoke)
    return True


def _no_answer(active: Active) -> NotDurable:
    """The error of a call whose deadline passed with its answer still held (it may have
    run)."""
    return NotDurable(f"no answer from {active.runtime.cell_id} within the call timeout")


@dataclass(frozen=True)
class Submitted:
    """A call handed to an active cell without blocking (:meth:`Node.submit_here`)."""

    cls_name: str
    method: str
    invoke: Invoke
    active: Active
    started: float  # monotonic
    deadline: float  # monotonic: no answer by then is ``NotDurable``


class Node:
    """A cellactors node: hosts cells, routes calls, holds its lease."""

    def __init__(
        self,
        bucket: Bucket,
        node_id: str,
        classes: Iterable[type[CellActor]] = (),
        settings: NodeSettings | None = None,
        on_fence: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings or NodeSettings()
        self._retention = self.settings.retention()  # every call carries it
        #: Which read-only methods have proven quick enough to run on the serving loop.
        self.quick_reads = QuickReads(self.settings.loop_read_budget)
        self.node_id = keys.validate_node_id(node_id)
        self.generation = secrets.token_hex(8)
        self.bucket = MeteredBucket(bucket)  # counts the requests really sent
        # Everything of this node reaches the bucket through the gate a fence closes.
        self.gate = GatedBucket(self.bucket)
        self.classes: dict[str, type[CellActor]] = {}
        for cls in classes:
            self.register(cls)
        self.ownership = OwnershipStore(self.gate, self.node_id)
        self.leases = LeaseStore(self.gate, self.node_id, self.settings.lease_ttl)
        self.metrics = NodeMetrics(self.bucket, self._sample)
        self.status = "starting"
        self.fence_reason: str | None = None
        self._on_fence = on_fence
        self._lock = threading.RLock()
        self._hosts: dict[str, CellHost] = {}
        self._closing: dict[str, threading.Event] = {}
        self._local: dict[str, LocalCopy] = {}
        self._dormant: dict[str, Dormant] = {}  # hibernated: still owned, nothing running
        self._routes: dict[str, tuple[acquire.Remote, float]] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.settings.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"cellactors-{self.node_id}-")
            base = Path(self._tmp.name)
        else:
            base = Path(self.settings.data_dir)
        self.cells_dir = base / self.node_id / "cells"
        self.cells_dir.mkdir(parents=True, exist_ok=True)
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
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name=f"reaper-{node_id}", daemon=True)
        self.alarms = AlarmDriver(self, self.settings.alarm_scan_interval)
        self.outbox = OutboxWorkers(self)
        #: How calls between cells reach a cell owned by another live node (None: they
        #: fail with ``RemoteOwner``, ``not_run``).
        self.forwarder: Forwarder | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, give_up_after: float | None = None) -> Node:
        """Take the node lease (waiting while another live process holds the identity)."""
        expires = self.lease.proxy().take(give_up_after).get()
        log.info(
            "node %s (generation %s) holds its lease until %d",
            self.node_id,
            self.generation,
            expires,
        )
        # This process holds the identity now; local copies of an earlier process of this
        # node cannot be proven current (nothing in memory vouches for them): drop them.
        for stale in self.cells_dir.iterdir():
            stale.unlink(missing_ok=True)
        self.status = "serving"
        self._reaper.start()
        self.alarms.start()  # its first scan runs now: alarms of orphaned cells fire
        return self

    def set_forwarder(self, forwarder: Forwarder | None) -> None:
        """Install how calls between cells reach cells owned by live peers."""
        self.forwarder = forwarder

    def may_send(self) -> bool:
        """Whether this node may still write to the bucket on its own initiative (wake
        entry clean-up, scans): serving or draining, and within its lease deadline."""
        return self.status in ("serving", "draining") and not self.deadline.passed()

    def register(self, cls: type[CellActor]) -> None:
        """Serve ``cls`` under its class name (checked for clashes with the runtime)."""
        cls.check_definition()
        self.classes[cls.__name__] = cls

    def _load(self) -> dict[str, Any]:
        """What the lease advertises to peers' placement (a degraded node gets no cells)."""
        return {
            "resident_cells": self.resident_cells(),
            "hibernated_cells": len(self._dormant),
            "storage": self.storage.state,
        }

    def resident_cells(self) -> int:
        """Active cells (a thread, a connection and a file each); hibernated ones not counted."""
        with self._lock:
            return sum(1 for h in self._hosts.values() if h.active is not None)

    def hibernated_cells(self) -> int:
        with self._lock:
            return len(self._dormant)

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
    ) -> Any:
        """Run ``method`` on cell ``cls_name:name``; returns once the result is durable.

        ``chain`` lists the cells waiting on this call (a call between cells): if the
        target is one of them the call is refused with
        :class:`~cellactors.errors.CallCycle` (``not_run``) instead of deadlocking.

        ``key`` is the call's idempotency key: a call whose key the cell has recorded returns
        the recorded result without running again. ``result_check`` runs on the result inside
        the transaction, before commit (e.g. "encodable as JSON"); if it raises, the
        transaction is rolled back and the call fails with
        :class:`~cellactors.errors.BadResult`.

        Every call is counted in the metrics by its outcome; one found owned by a live peer
        (:class:`~cellactors.errors.RemoteOwner`) is counted as routed away instead, since
        the owner counts it."""
        return self._counted(
            cls_name,
            method,
            time.monotonic(),
            lambda: self._call(
                cls_name, name, method, kwargs, args, forwarded, timeout, key, result_check, chain
            ),
        )

    def _counted(self, cls_name: str, method: str, started: float, run: Callable[[], T]) -> T:
        """``run()``, counted in the metrics by its outcome (see :meth:`call`)."""
        cls = self.classes.get(cls_name)
        cls_label = cls_name if cls is not None else UNSERVED
        method_label = method if cls is not None and method in cls.exposed_methods() else UNSERVED
        try:
            result = run()
        except RemoteOwner:
            self.metrics.forwarded.labels(cls_label).inc()
            raise
        except CallError as err:
            self.metrics.call_done(cls_label, method_label, err.outcome)
            raise
        except InvalidCellId:
            self.metrics.call_done(cls_label, method_label, NOT_RUN)
            raise
        except BaseException:
            self.metrics.call_done(cls_label, method_label, UNKNOWN)
            raise
        self.metrics.call_done(cls_label, method_label, OK)
        self.metrics.call_answered(cls_label, time.monotonic() - started)
        return result

    def submit_here(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        reply: pykka.Future[Any],
        timeout: float | None = None,
        key: str | None = None,
        result_check: Callable[[Any], None] | None = None,
    ) -> Submitted | None:
        """Hand a call to its cell without blocking, when the cell is active on this node:
        an event loop can then wait for ``reply`` instead of parking a thread in
        :meth:`call`. Returns None whenever the call needs :meth:`call` instead (an
        activation, a route, a wake, a refusal, a node that is not serving): nothing was
        sent then. Finish a submitted call with :meth:`answer` once ``reply`` is set, and
        ask :meth:`still_pending` while it is not."""
        if self.status != "serving" or self.deadline.passed():
            return None
        try:
            cls, cell_id, kwargs = self._checked(cls_name, name, method, (), kwargs, key)
        except (CallError, InvalidCellId):
            return None
        host = self._hosts.get(cell_id)
        active = host.active if host is not None and host.ready.is_set() else None
        if active is None:
            return None
        reading = method in cls.read_only_methods()
        if reading and not self.quick_reads.quick((cls_name, method)):
            return None  # not proven quick: it runs in a worker thread, off the loop
        invoke = Invoke(
            method,
            (),
            kwargs,
            reply,
            key=key,
            result_check=result_check,
            retention=self._retention,
            interrupt_at=time.perf_counter() + self.quick_reads.budget_s if reading else None,
        )
        try:
            if not _deliver(cls, active, invoke, self.quick_reads):
                return None  # interrupted past its budget: sent again off the loop
        except pykka.ActorDeadError:
            return None
        started = time.monotonic()
        budget = self.settings.call_timeout if timeout is None else timeout
        return Submitted(cls_name, method, invoke, active, started, started + budget)

    def still_pending(self, sub: Submitted) -> bool:
        """A submitted call without its answer yet: False if the cell stopped without taking
        it (it ran nowhere: send it again through :meth:`call`); raises ``NotDurable``
        (counted) once the call's deadline has passed, as :meth:`call` would."""
        if not sub.invoke.started and not sub.active.cell.is_alive():
            return False
        if time.monotonic() >= sub.deadline:

            def timed_out() -> None:
                raise _no_answer(sub.active)

            self._counted(sub.cls_name, sub.method, sub.started, timed_out)
        return True

    def answer(self, sub: Submitted) -> Any:
        """The answer of a submitted call whose reply is set, counted in the metrics; held
        back (``NotDurable``) if the node fenced meanwhile, as :meth:`call` does."""

        def result() -> Any:
            value = sub.invoke.reply.get(timeout=0)
            self._may_send_answer()
            return value

        return self._counted(sub.cls_name, sub.method, sub.started, result)

    def _checked(
        self,
        cls_name: str,
        name: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        key: str | None,
    ) -> tuple[type[CellActor], str, dict[str, Any]]:
        """What every call is checked for before it is sent: a served class and public
        method, a valid cell id and key, serializable arguments. Returns the class, the cell
        id and a copy of the keyword arguments; raises the error to answer (``not_run``)."""
        cls = self.classes.get(cls_name)
        if cls is None:
            raise UnknownCell(f"no cell class {cls_name!r} is served here")
        if method not in cls.exposed_methods():
            raise UnknownMethod(f"{cls_name} has no public method {method!r}")
        cell_id = keys.make_cell_id(cls_name, name)
        kwargs = dict(kwargs or {})
        check_arguments(cls, method, args, kwargs)
        check_serializable([list(args), kwargs], "arguments")
        if key is not None:
            check_key(key)
        return cls, cell_id, kwargs

    def _may_send_answer(self) -> None:
        """Checked right before a held answer leaves: a node that fenced (or whose lease
        deadline passed) while the answer was held answers nothing."""
        if not self.may_answer():
            raise NotDurable(f"node {self.node_id} fenced itself before the answer could be sent")

    def _call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any] | None,
        args: tuple[Any, ...],
        forwarded: bool,
        timeout: float | None,
        key: str | None,
        result_check: Callable[[Any], None] | None,
        chain: tuple[str, ...] = (),
    ) -> Any:
        """The body of :meth:`call`."""
        if self.status == "serving" and self.deadline.passed():
            self.fence("the lease deadline passed (was this process paused?)")
        cls, cell_id, kwargs = self._checked(cls_name, name, method, args, kwargs, key)
        chain = tuple(chain)
        if alarm_rules.cycle_in(chain, cell_id):
            raise CallCycle(
                f"call cycle: {' -> '.join((*chain, cell_id))}; {cell_id} is waiting on this "
                "call already, so it would deadlock"
            )
        if len(chain) >= alarm_rules.MAX_CHAIN:
            raise BadRequest(f"call chain longer than {alarm_rules.MAX_CHAIN} cells")
        retention = self._retention
        budget = self.settings.call_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        for _ in range(3):
            active = self._activate(cell_id, cls, forwarded, max(0.1, deadline - time.monotonic()))
            invoke = Invoke(
                method,
                tuple(args),
                kwargs,
                pykka.ThreadingFuture(),
                key=key,
                result_check=result_check,
                retention=retention,
                chain=chain,
            )
            try:
                _deliver(cls, active, invoke, self.quick_reads)
            except pykka.ActorDeadError:
                continue  # passivated or reset between lookup and send: route again
            delivered, result = self._await(invoke, active, deadline)
            if not delivered:
                continue  # the cell stopped before it took the call: it ran nowhere
            self._may_send_answer()
            return result
        raise ActivationFailed(f"{cell_id} kept moving while routing the call")

    def call_cell(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        chain: tuple[str, ...] = (),
    ) -> Any:
        """A call from a cell (or the outbox) to any cell of the fleet: run here, or sent
        to its live owner through :attr:`forwarder`. An answer proving the call ran nowhere
        (stale route, owner unavailable, the owner's storage failing) makes the node look
        the owner up once more."""
        for attempt in (1, 2):
            try:
                return self.call(cls_name, name, method, kwargs, key=key, chain=chain)
            except RemoteOwner as owner:
                if self.forwarder is None:
                    raise
                try:
                    return self.forwarder(owner, cls_name, name, method, kwargs, key, chain)
                except (StaleRoute, NodeUnavailable, NodeStorageFault):
                    if attempt == 2:
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
        return self._activate(cell_id, cls, True, self.settings.call_timeout)

    def fire_alarm(self, cell_id: str) -> Any:
        """Run the cell's alarm here if it is due (activating or resuming the cell);
        returns the cell's answer (``fired``, ``retry``, ``abandoned``, ``not_due``) once
        it is durable."""
        deadline = time.monotonic() + self.settings.call_timeout
        for _ in range(3):
            active = self.activate_here(cell_id)
            fire = FireAlarm()
            try:
                active.cell.tell(fire)
            except pykka.ActorDeadError:
                continue
            delivered, result = self._await(fire, active, deadline)
            if delivered:
                return result
        raise ActivationFailed(f"{cell_id} kept moving while its alarm was due")

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
        cls_name = cls if isinstance(cls, str) else cls.__name__
        cell_id = keys.make_cell_id(cls_name, name)
        deadline = time.monotonic() + self.settings.call_timeout
        for _ in range(3):
            try:
                active = self.activate_here(cell_id)
            except StaleRoute:
                route = self._cached_route(cell_id)
                if route is None:
                    raise
                raise RemoteOwner(route.node, route.addr, route.generation) from None
            edit = EditRuntime(apply)
            try:
                active.cell.tell(edit)
            except pykka.ActorDeadError:
                continue
            delivered, result = self._await(edit, active, deadline)
            if delivered:
                self._may_send_answer()
                return result  # type: ignore[no-any-return]
        raise ActivationFailed(f"{cell_id} kept moving while its dead letters were handled")

    def _cached_route(self, cell_id: str) -> acquire.Remote | None:
        """The live peer that owned the cell when this node last looked, if still fresh."""
        with self._lock:
            route = self._routes.get(cell_id)
        return route[0] if route is not None and route[1] > time.monotonic() else None

    def routed_elsewhere(self, cell_id: str) -> bool:
        """A live peer owned the cell when this node last looked (a cached route)."""
        with self._lock:
            route = self._routes.get(cell_id)
        return route is not None and route[1] > time.monotonic()

    def _await(
        self, invoke: Invoke | FireAlarm | EditRuntime, active: Active, deadline: float
    ) -> tuple[bool, Any]:
        """Wait for the held answer. Returns (False, None) when the cell actor stopped
        without ever starting the call (a stop raced the send), so it can be routed again."""
        while True:
            remaining = deadline - time.monotonic()
            try:
                return True, invoke.reply.get(timeout=max(0.01, min(0.25, remaining)))
            except pykka.Timeout:
                if not invoke.started and not active.cell.is_alive():
                    return False, None
                if remaining <= 0:
                    raise _no_answer(active) from None

    def _activate(
        self, cell_id: str, cls: type[CellActor], forwarded: bool, timeout: float
    ) -> Active:
        inline = False
        with self._lock:
            if self.status != "serving":
                raise NodeUnavailable(f"node {self.node_id} is {self.status}")
            host = self._hosts.get(cell_id)
            if host is None:
                route = self._routes.get(cell_id)
                if route and route[1] > time.monotonic() and not forwarded:
                    raise RemoteOwner(route[0].node, route[0].addr, route[0].generation)
                host = CellHost(cell_id, cls)
                self._hosts[cell_id] = host
                # A hibernated cell wakes from its own file with no bucket request: in this
                # thread, sparing a thread start. Anything else activates in a thread of its
                # own, so that a slow store cannot keep the caller past its timeout.
                inline = cell_id in self._dormant
                if not inline:
                    threading.Thread(
                        target=self._run_activation,
                        args=(host, forwarded),
                        daemon=True,
                        name=f"activate-{cell_id}",
                    ).start()
        if inline:
            self._run_activation(host, forwarded)
        return host.wait(timeout)

    def _run_activation(self, host: CellHost, forwarded: bool) -> None:
        cell_id = host.cell_id
        closing = self._closing.get(cell_id)
        if closing is not None:
            closing.wait(self.settings.op_deadline)
        own: pykka.ActorRef[Any] | None = None
        try:
            own, host.active = self._start_ownership(host)
            host.ownership = own
            if host.active is None:
                outcome = ask_method(own, "acquire", lambda: self._place(forwarded)).get()
                if isinstance(outcome, acquire.Remote):
                    with self._lock:
                        expiry = time.monotonic() + self.settings.lease_ttl
                        self._routes[cell_id] = (outcome, expiry)
                    raise (
                        StaleRoute(f"{cell_id} is owned by {outcome.node}")
                        if forwarded
                        else RemoteOwner(outcome.node, outcome.addr, outcome.generation)
                    )
                with self._lock:
                    local = self._local.pop(cell_id, None)
                prev = None if outcome.takeover else outcome.epoch - 1
                host.active = ask_method(own, "activate", outcome, local, prev).get()
            self.metrics.activations.labels(host.cls.__name__, host.active.restored_from).inc()
            if self.status in ("fenced", "stopped"):  # a draining node releases it below
                raise NodeUnavailable(f"node {self.node_id} is {self.status}")
            self._opened(host.active)
        except BaseException as err:
            host.error = (
                err
                if isinstance(err, CallError)
                else ActivationFailed(f"activation of {cell_id} failed: {err}")
            )
            if not isinstance(err, CallError):
                log.exception("activation of %s failed", cell_id)
            with self._lock:
                if self._hosts.get(cell_id) is host:
                    del self._hosts[cell_id]
            self.alarms.released(cell_id)  # hosted nowhere here: scans treat it as such
            try:
                if own is not None and host.active is not None:
                    ask_method(own, "abandon", host.error).get()
            except pykka.ActorDeadError:
                pass  # a fence already stopped the ownership actor and failed the cell
            finally:
                if own is not None:
                    own.stop(block=False)
        else:
            with self._lock:
                self._routes.pop(cell_id, None)
        finally:
            host.ready.set()

    def _opened(self, active: Active) -> None:
        """A cell opened here: mirror its wake entries, schedule its alarm, wake its
        outbox. Before its first call: a failure fails the activation."""
        cell_id = active.runtime.cell_id
        state = active.wakes
        self.alarms.activated(
            cell_id, active.epoch, state, resumed=active.restored_from == "hibernated"
        )
        if state.outbox:
            self.outbox.kick(cell_id)

    def _start_ownership(self, host: CellHost) -> tuple[pykka.ActorRef[Any], Active | None]:
        """Start the cell's ownership actor. A cell hibernating here is resumed first, in
        this thread, before the actor starts (no bucket request, no hand-off): the actor
        and the active cell. Otherwise, or when the hibernated file cannot be resumed (its
        copy is then offered to the ordinary acquire path, which claims the next epoch and
        reuses the file if it is intact), the actor and None."""
        cell_id = host.cell_id
        args = (
            cell_id,
            host.cls,
            self.gate,
            self.ownership,
            self.leases,
            self.cells_dir,
            lambda err: self._reset(host, err),
            self.settings.op_deadline,
            self.settings.snapshots,
        )
        kwargs: dict[str, Any] = {
            "on_acked": self.metrics.ack_latency.observe,
            "services": self,
            "sink": lambda epoch: self.alarms.sink(cell_id, epoch),
            "judge": self.lease_clock.judge,
            "clock": self.clock,
            "on_storage_fault": lambda fault: self._storage_fault(host, fault),
            "on_broken": lambda: self._give_up(host),
        }
        with self._lock:
            dormant = self._dormant.pop(cell_id, None)
        if dormant is not None:
            try:
                return OwnershipActor.start_with(
                    lambda actor: actor.resume(dormant.copy), *args, **kwargs
                )
            except (ActivationFailed, NodeStorageFault) as err:
                log.info("hibernated %s not resumed: %s", cell_id, err)
                with self._lock:
                    self._local[cell_id] = dormant.copy
        return OwnershipActor.start(*args, **kwargs), None

    def _place(self, forwarded: bool = False) -> acquire.Remote | None:
        """Placement of an unowned cell: here while there is room, else the least-loaded
        live peer with room (None means here); a forwarded call is placed where it lands.

        While this node's storage is degraded (and a probe, when due, does not pass) it
        takes no cell: the least-loaded healthy peer does, and with none (or for a call a
        peer forwarded here: never a third hop) the call is refused with
        :class:`~cellactors.errors.NodeStorageFault` before anything is written."""
        if not self.storage.healthy():
            peer = None if forwarded else self._roomy_peer()
            if peer is None:
                raise NodeStorageFault(
                    f"node {self.node_id} takes no new cells while its local storage is "
                    f"failing ({self.storage.reason}); the call did not run"
                )
            return peer
        if forwarded or self.resident_cells() < self.settings.max_resident_cells:
            return None
        return self._roomy_peer()

    def _roomy_peer(self) -> acquire.Remote | None:
        """The least-loaded live peer with room and healthy storage, if any."""
        limit = self.settings.max_resident_cells
        peers = [
            p
            for p in self.leases.read_capacity_peers()
            if p.load.get("storage") != DEGRADED and int(p.load.get("resident_cells", 0)) < limit
        ]
        if not peers:
            return None
        best = min(peers, key=lambda p: (int(p.load.get("resident_cells", 0)), p.node))
        return acquire.Remote(best.node, best.addr, best.generation)

    def forget_route(self, cls_name: str, name: str) -> None:
        with self._lock:
            self._routes.pop(keys.make_cell_id(cls_name, name), None)

    # --- failure, passivation, drain ---------------------------------------------------

    def _reset(self, host: CellHost, error: BaseException) -> None:
        """The replicator could not prove a write: drop this activation and its local copy."""

        def run() -> None:
            with self._lock:
                if self._hosts.get(host.cell_id) is host:
                    del self._hosts[host.cell_id]
                self._local.pop(host.cell_id, None)
            self.alarms.released(host.cell_id)
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
        with self._lock:
            if self._hosts.get(host.cell_id) is not host or host.active is None:
                return  # activating (that fails on its own), or already going
        threading.Thread(
            target=self._put_away,
            args=(host.cell_id, False, False, host),
            name=f"give-up-{host.cell_id}",
            daemon=True,
        ).start()

    def passivate(self, cell_id: str) -> bool:
        """Release one idle cell, keeping its local copy for a quick reactivation."""
        return self._put_away(cell_id, hibernate=False)

    def hibernate(self, cell_id: str) -> bool:
        """Stop one idle cell's threads and close its file, keeping its ownership: the next
        call resumes it at the same epoch with no bucket request."""
        return self._put_away(cell_id, hibernate=True)

    def _put_away(
        self,
        cell_id: str,
        hibernate: bool,
        keep_copy: bool = True,
        expected: CellHost | None = None,
    ) -> bool:
        """Release (or hibernate) one active cell; ``keep_copy=False`` discards its file
        instead of keeping it as a local copy. ``expected``: only that activation."""
        with self._lock:
            host = self._hosts.get(cell_id)
            if host is None or host.active is None or expected not in (None, host):
                return False
            del self._hosts[cell_id]
            done = self._closing[cell_id] = threading.Event()
        try:
            last_used = host.active.runtime.last_used
            local = self._release(host, keep_ownership=hibernate)
            if local is None or not hibernate:
                self.alarms.released(cell_id)
            if local is not None and not keep_copy:
                with contextlib.suppress(OSError):
                    remove_db_files(local.path)
            elif local is not None:
                with self._lock:
                    if not hibernate:
                        self._local[cell_id] = local
                    elif self.status in ("serving", "draining"):
                        self._dormant[cell_id] = Dormant(local, last_used)
            return True
        finally:
            self._closed(cell_id, done)

    def _closed(self, cell_id: str, done: threading.Event) -> None:
        done.set()
        with self._lock:
            if self._closing.get(cell_id) is done:
                del self._closing[cell_id]

    def _release(self, host: CellHost, keep_ownership: bool = False) -> LocalCopy | None:
        assert host.ownership is not None
        if not keep_ownership:
            self.alarms.released(host.cell_id)
        try:
            local: LocalCopy | None = ask_method(
                host.ownership, "release", self.settings.op_deadline, keep_ownership
            ).get(timeout=self.settings.op_deadline * 3)
        except pykka.Timeout:
            local = None
        host.ownership.stop(block=False)
        return local

    def _release_dormant(self, cell_id: str) -> None:
        """Give up a hibernated cell's ownership; its file stays as a reusable local copy."""
        with self._lock:
            dormant = self._dormant.pop(cell_id, None)
            if dormant is None:
                return
            done = self._closing[cell_id] = threading.Event()
        self.alarms.released(cell_id)
        copy = dormant.copy
        try:
            released = self.ownership.release_owner(cell_id, copy.epoch, copy.last_txid)
        except (BucketError, AmbiguousWrite) as err:
            log.warning("release of hibernated %s failed: %s", cell_id, err)
            released = None
        try:
            with self._lock:
                if isinstance(released, Applied) and self.status == "serving":
                    self._local[cell_id] = copy
                else:
                    remove_db_files(copy.path)
        finally:
            self._closed(cell_id, done)

    def _reap(self) -> None:
        """Trim the memory of cells idle past :data:`TRIM_AFTER_S` (once per idle period);
        hibernate cells idle past ``hibernate_timeout``; release those idle past
        ``idle_timeout``, resident or hibernated."""
        release_after = self.settings.idle_timeout
        hibernate_after = self.settings.hibernate_timeout
        hibernating = hibernate_after < release_after
        interval = min(1.0, (hibernate_after if hibernating else release_after) / 4)
        while not self._reaper_stop.wait(interval):
            self.storage.healthy()  # while degraded: probes when due, ends the episode
            now = time.monotonic()
            with self._lock:
                trim: list[Active] = []
                idle: list[tuple[str, float]] = []
                for cid, h in self._hosts.items():
                    if h.active is None:
                        continue
                    rt = h.active.runtime
                    idle_for = now - rt.last_used
                    if idle_for > TRIM_AFTER_S and rt.trimmed_for != rt.last_used:
                        trim.append(h.active)
                    if idle_for > min(hibernate_after, release_after) and rt.channel.idle():
                        idle.append((cid, idle_for))
                expired = [
                    cid for cid, d in self._dormant.items() if now - d.last_used > release_after
                ]
            for active in trim:
                rt = active.runtime
                used = rt.last_used
                if rt.trim_if_idle is not None and rt.trim_if_idle():
                    rt.trimmed_for = used
            for cid, idle_for in idle:
                if self.status != "serving":
                    return
                if idle_for > release_after:
                    self.passivate(cid)
                elif hibernating:
                    self.hibernate(cid)
            for cid in expired:
                if self.status != "serving":
                    return
                self._release_dormant(cid)

    def fence(self, reason: str) -> None:
        """Self-fence: stop every cell, fail held calls, acknowledge and write nothing more."""
        with self._lock:
            if self.status in ("fenced", "stopped"):
                return
            # Close the gate first: from the SELF-FENCE line on, nothing reaches the bucket.
            self.gate.close_gate(reason)
            self.status = "fenced"
            self.fence_reason = reason
            self.metrics.fences.inc()
            hosts = list(self._hosts.values())
            self._hosts.clear()
            self._dormant.clear()  # their files are never reused: nothing vouches for them now
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
        for host in hosts:
            if host.active is not None:
                host.active.runtime.channel.fail(error)
                host.active.snapshots.cancel()
                host.active.cell.stop(block=False)
                host.active.replicator.stop(block=False)
            if host.ownership is not None:
                host.ownership.stop(block=False)
        self._reaper_stop.set()
        if self._on_fence is not None:
            self._on_fence(reason)

    def drain(self) -> None:
        """Graceful stop: refuse new calls, finish queued ones, release every cell (a batch at
        a time), then expire the lease so peers can take over at once."""
        with self._lock:
            if self.status in ("fenced", "stopped", "draining"):
                return
            self.status = "draining"
        self._reaper_stop.set()
        self.alarms.stop()  # the entries stay in the bucket: peers' scans find them
        self.outbox.stop()
        # Activations already under way finish first, so that their cells are released too.
        with self._lock:
            pending = [h for h in self._hosts.values() if not h.ready.is_set()]
        for host in pending:
            host.ready.wait(self.settings.op_deadline * 2)
        while True:
            with self._lock:
                hosts = [h for h in self._hosts.values() if h.active is not None][:16]
                for h in hosts:
                    del self._hosts[h.cell_id]
            if not hosts:
                break
            threads = [threading.Thread(target=self._release, args=(h,)) for h in hosts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        # Cells being hibernated or released right now settle first, then the hibernated
        # ones are released too, so that peers restore them without waiting for a takeover.
        with self._lock:
            closing = list(self._closing.values())
        for event in closing:
            event.wait(self.settings.op_deadline)
        while True:
            with self._lock:
                dormant = list(self._dormant)[:16]
            if not dormant:
                break
            threads = [threading.Thread(target=self._release_dormant, args=(c,)) for c in dormant]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        try:
            self.lease.proxy().expire().get(timeout=self.settings.op_deadline)
        except (pykka.Timeout, pykka.ActorDeadError):
            pass
        self.lease.stop(block=False)
        self.status = "stopped"

    def stop(self) -> None:
        """Drain if serving; always stop the lease actor and clean temporary files."""
        if self.status in ("serving", "starting"):
            self.drain()
        self.lease_clock.close()
        self._reaper_stop.set()
        self.alarms.stop()
        self.outbox.stop()
        try:
            # A fenced node does not wait for a lease request that may hang: it writes nothing
            # more anyway, and its process must exit promptly.
            self.lease.stop(block=self.status != "fenced", timeout=5)
        except pykka.Timeout:
            pass
        if self.status != "fenced":
            self.status = "stopped"
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- introspection ------------------------------------------------------------------

    def may_answer(self) -> bool:
        """Whether an answer may still be sent, checked right before a held answer leaves the
        node: never once fenced; while serving or draining, only before the lease deadline.
        A node stopped gracefully proved its answers before it released its cells, so an
        answer that was on its way out when the stop completed is still sent."""
        if self.status == "stopped":
            return self.fence_reason is None
        return self.status in ("serving", "draining") and not self.deadline.passed()

    def store_time(self) -> float:
        """The store's time in epoch seconds, as this node knows it (signed forwards)."""
        return self.gate.clock.now_ms() / 1000

    def state(self) -> dict[str, Any]:
        """This node and its resident cells (``GET /state``): per cell its epoch, acked and
        committed txids, ``unacked`` (their difference: answers waiting for the bucket) and
        ``idle_s`` (seconds since its last call or transaction)."""
        lease = self.lease.proxy()
        try:
            expires = lease.expires_ms.get(timeout=1)
        except (pykka.Timeout, pykka.ActorDeadError):
            expires = 0
        now = time.monotonic()
        with self._lock:
            cells = []
            for cid, h in sorted(self._hosts.items()):
                if h.active is None:
                    continue
                channel = h.active.runtime.channel
                acked = channel.acked  # first: committed read later is never below it
                committed = channel.committed
                cells.append(
                    {
                        "cell": cid,
                        "epoch": h.active.epoch,
                        "acked_txid": acked,
                        "committed_txid": committed,
                        "unacked": committed - acked,
                        "idle_s": round(max(0.0, now - h.active.runtime.last_used), 3),
                        "restored_from": h.active.restored_from,
                    }
                )
        return {
            "node": self.node_id,
            "generation": self.generation,
            "status": self.status,
            "lease_expires_ms": expires,
            "limits": {
                "max_resident_cells": self.settings.max_resident_cells,
                "max_active_cells_by_open_files": limits.max_active_cells(),
            },
            "cells": cells,
            "hibernated_cells": self.hibernated_cells(),
            "storage": self.storage.state,
        }

    def fleet(self) -> dict[str, Any]:
        """Every node lease in the bucket, live or expired (``GET /fleet``): one listing of
        ``nodes/`` and one read per lease, through this node's gate. ``now_ms`` is the
        store's time, which expiries are in."""
        leases = self.leases.read_all()
        now = self.gate.clock.now_ms()
        nodes = [
            {
                "node": lease.node,
                "addr": lease.addr,
                "generation": lease.generation,
                "expires_ms": lease.expires_ms,
                "alive": lease.is_live(now),
                "load": lease.load,
                "self": lease.node == self.node_id,
            }
            for lease in leases
        ]
        return {"node": self.node_id, "now_ms": now, "nodes": nodes}

    def metrics_text(self) -> str:
        """This node's metrics in the Prometheus text format (``GET /metrics``)."""
        return self.metrics.render().decode("utf-8")

    def _sample(self) -> NodeSample:
        """The gauges of :class:`~cellactors.actors.metrics.NodeMetrics`, read at scrape."""
        resident = unacked = busy = 0
        with self._lock:
            for h in self._hosts.values():
                if h.active is None:
                    continue
                channel = h.active.runtime.channel
                resident += 1
                acked = channel.acked  # first: committed read later is never below it
                unacked += channel.committed - acked
                busy += 0 if channel.idle() else 1
            hibernated = len(self._dormant)
        return NodeSample(
            self.node_id,
            self.generation,
            self.status,
            resident,
            unacked,
            busy,
            hibernated,
            self.storage.degraded,
        )

    # --- change feed: logic in cellactors.persistence.history.feed ------------------------------

    def feed_reader(self, cell_id: str) -> Any:
        """A reader of ``cell_id``'s change feed through this node's gated bucket."""
        from cellactors.persistence.history.feed import FeedReader

        return FeedReader(self.gate, cell_id)

    def changes(self, cls_name: str, name: str, after: int = 0, **kw: Any) -> Any:
        """The cell's acknowledged transactions after ``after`` from the bucket
        (:func:`cellactors.persistence.history.feed.changes`: ``follow``, ``wait``, ...)."""
        from cellactors.persistence.history.feed import changes

        return changes(self.gate, keys.make_cell_id(cls_name, name), after, **kw)


__all__ = ["CellProxy", "Node", "NodeSettings"]
