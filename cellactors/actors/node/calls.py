"""The path of one call through a node, as plain functions: the checks every call passes
before it is sent, the hand-off to the cell (inline for a quick read, else its mailbox),
the wait for the held answer, and the metrics every call is counted in."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pykka

from cellactors.actors.cell import CellActor
from cellactors.actors.cell_runtime import check_arguments, check_serializable
from cellactors.actors.lease import FenceDeadline
from cellactors.actors.messages import EditRuntime, FireAlarm, Invoke, RollBack
from cellactors.actors.metrics import OK, UNSERVED, NodeMetrics
from cellactors.actors.node.activations import Activations
from cellactors.actors.node.routes import RouteCache
from cellactors.actors.node.scratch import read_vacant
from cellactors.actors.node.settings import NodeSettings
from cellactors.actors.node.status import NodeStatus
from cellactors.actors.ownership import Active
from cellactors.actors.sockets import SOCKET_METHOD
from cellactors.clock import RuntimeClock
from cellactors.core import alarms as alarm_rules
from cellactors.core import keys
from cellactors.core.idempotency import check_key
from cellactors.core.principal import Principal
from cellactors.core.read_budget import QuickReads
from cellactors.errors import (
    NOT_RUN,
    UNKNOWN,
    ActivationFailed,
    BadRequest,
    CallCycle,
    CallError,
    CellVacant,
    InvalidCellId,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
    UnknownMethod,
)
from cellactors.persistence.celldb.runtime_tables import RuntimeTables
from cellactors.tracing import spans

T = TypeVar("T")


@dataclass(frozen=True)
class Submitted:
    """A call handed to an active cell without blocking (:meth:`Node.submit_here`)."""

    cls_name: str
    method: str
    invoke: Invoke
    active: Active
    started: float  # monotonic
    deadline: float  # monotonic: no answer by then is ``NotDurable``


def deliver(
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


def no_answer(active: Active) -> NotDurable:
    """The error of a call whose deadline passed with its answer still held (it may have
    run)."""
    return NotDurable(f"no answer from {active.runtime.cell_id} within the call timeout")


def await_answer(
    invoke: Invoke | FireAlarm | EditRuntime | RollBack, active: Active, deadline: float
) -> tuple[bool, Any]:
    """Wait for the held answer. Returns (False, None) when the cell actor stopped without
    ever starting the call (a stop raced the send), so it can be routed again."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            return True, invoke.reply.get(timeout=max(0.01, min(0.25, remaining)))
        except pykka.Timeout:
            if not invoke.started and not active.cell.is_alive():
                return False, None
            if remaining <= 0:
                raise no_answer(active) from None


def check_call(
    classes: Mapping[str, type[CellActor]],
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
    cls = classes.get(cls_name)
    if cls is None:
        raise UnknownCell(f"no cell class {cls_name!r} is served here")
    if method not in cls.exposed_methods() and not (
        method == SOCKET_METHOD and cls.takes_sockets()
    ):
        raise UnknownMethod(f"{cls_name} has no public method {method!r}")
    cell_id = keys.make_cell_id(cls_name, name)
    kwargs = dict(kwargs or {})
    check_arguments(cls, method, args, kwargs)
    check_serializable([list(args), kwargs], "arguments")
    if key is not None:
        check_key(key)
    return cls, cell_id, kwargs


def counted(
    metrics: NodeMetrics,
    classes: Mapping[str, type[CellActor]],
    cls_name: str,
    method: str,
    started: float,
    run: Callable[[], T],
) -> T:
    """``run()``, counted in the metrics by its outcome; a call found owned by a live peer
    (:class:`~cellactors.errors.RemoteOwner`) is counted as routed away instead, since the
    owner counts it."""
    cls = classes.get(cls_name)
    cls_label = cls_name if cls is not None else UNSERVED
    method_label = method if cls is not None and method in cls.exposed_methods() else UNSERVED
    try:
        result = run()
    except RemoteOwner:
        metrics.forwarded.labels(cls_label).inc()
        raise
    except CallError as err:
        metrics.call_done(cls_label, method_label, err.outcome)
        raise
    except InvalidCellId:
        metrics.call_done(cls_label, method_label, NOT_RUN)
        raise
    except BaseException:
        metrics.call_done(cls_label, method_label, UNKNOWN)
        raise
    metrics.call_done(cls_label, method_label, OK)
    metrics.call_answered(cls_label, time.monotonic() - started)
    return result


class RunnerHost(Protocol):
    """What a :class:`CallRunner` needs of its node (the node is one)."""

    @property
    def node_id(self) -> str: ...
    @property
    def status(self) -> NodeStatus: ...
    @property
    def classes(self) -> Mapping[str, type[CellActor]]: ...
    @property
    def settings(self) -> NodeSettings: ...
    @property
    def metrics(self) -> NodeMetrics: ...
    @property
    def activations(self) -> Activations: ...
    @property
    def quick_reads(self) -> QuickReads: ...
    @property
    def deadline(self) -> FenceDeadline: ...
    def fence(self, reason: str) -> None: ...
    def may_answer(self) -> bool: ...
    def activate_here(self, cell_id: str) -> Active: ...
    @property
    def clock(self) -> RuntimeClock: ...


class CallRunner:
    """Runs calls on a node's cells: the blocking path (activate, hand over, wait for the
    held answer), the event loop's non-blocking one (:meth:`submit_here`), and messages of
    the runtime's own (an alarm's fire, an edit of the runtime tables)."""

    def __init__(self, host: RunnerHost) -> None:
        self.host = host
        self.retention = host.settings.retention()  # every call carries it

    def call(
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
        caller: Principal | None = None,
    ) -> Any:
        """Run the call (see :meth:`cellactors.actors.node.Node.call`)."""
        if self.host.status is NodeStatus.SERVING and self.host.deadline.passed():
            self.host.fence("the lease deadline passed (was this process paused?)")
        cls, cell_id, kwargs = check_call(
            self.host.classes, cls_name, name, method, args, kwargs, key
        )
        chain = tuple(chain)
        if alarm_rules.cycle_in(chain, cell_id):
            raise CallCycle(
                f"call cycle: {' -> '.join((*chain, cell_id))}; {cell_id} is waiting on this "
                "call already, so it would deadlock"
            )
        if len(chain) >= alarm_rules.MAX_CHAIN:
            raise BadRequest(f"call chain longer than {alarm_rules.MAX_CHAIN} cells")
        budget = self.host.settings.call_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        # A read of a cell nobody created is answered from scratch, creating nothing.
        vacant_ok = method in cls.read_only_methods()

        def invoke_message() -> Invoke:
            return Invoke(
                method,
                tuple(args),
                kwargs,
                pykka.ThreadingFuture(),
                key=key,
                result_check=result_check,
                retention=self.retention,
                chain=chain,
                caller=caller,
                trace=spans.current(),
            )

        for _ in range(3):
            left = max(0.1, deadline - time.monotonic())
            try:
                active = self.host.activations.activate(cell_id, cls, forwarded, left, vacant_ok)
            except CellVacant:  # only a read asks: answer it from scratch, creating nothing
                vacant_ok = False  # or, if the scratch copy will not do, activate for real
                read, result = read_vacant(cls, cell_id, invoke_message(), self.host.clock, left)
                if read:
                    self.may_send_answer()
                    return result
                continue
            invoke = invoke_message()
            try:
                deliver(cls, active, invoke, self.host.quick_reads)
            except pykka.ActorDeadError:
                continue  # passivated or reset between lookup and send: route again
            delivered, result = await_answer(invoke, active, deadline)
            if not delivered:
                continue  # the cell stopped before it took the call: it ran nowhere
            self.may_send_answer()
            return result
        raise ActivationFailed(f"{cell_id} kept moving while routing the call")

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
        caller: Principal | None = None,
    ) -> Submitted | None:
        """Hand a call to its cell without blocking, when the cell is active on this node:
        an event loop can then wait for ``reply`` instead of parking a thread in
        :meth:`call`. Returns None whenever the call needs :meth:`call` instead (an
        activation, a route, a wake, a refusal, a node that is not serving): nothing was
        sent then. Finish a submitted call with :meth:`answer` once ``reply`` is set, and
        ask :meth:`still_pending` while it is not."""
        if self.host.status is not NodeStatus.SERVING or self.host.deadline.passed():
            return None
        try:
            cls, cell_id, kwargs = check_call(
                self.host.classes, cls_name, name, method, (), kwargs, key
            )
        except (CallError, InvalidCellId):
            return None
        active = self.host.activations.active(cell_id)
        if active is None:
            return None
        reading = method in cls.read_only_methods()
        if reading and not self.host.quick_reads.quick((cls_name, method)):
            return None  # not proven quick: it runs in a worker thread, off the loop
        invoke = Invoke(
            method,
            (),
            kwargs,
            reply,
            key=key,
            result_check=result_check,
            retention=self.retention,
            caller=caller,
            interrupt_at=time.perf_counter() + self.host.quick_reads.budget_s if reading else None,
            trace=spans.current(),
        )
        try:
            if not deliver(cls, active, invoke, self.host.quick_reads):
                return None  # interrupted past its budget: sent again off the loop
        except pykka.ActorDeadError:
            return None
        started = time.monotonic()
        budget = self.host.settings.call_timeout if timeout is None else timeout
        return Submitted(cls_name, method, invoke, active, started, started + budget)

    def still_pending(self, sub: Submitted) -> bool:
        """A submitted call without its answer yet: False if the cell stopped without taking
        it (it ran nowhere: send it again through :meth:`call`); raises ``NotDurable``
        (counted) once the call's deadline has passed, as :meth:`call` would."""
        if not sub.invoke.started and not sub.active.cell.is_alive():
            return False
        if time.monotonic() >= sub.deadline:

            def timed_out() -> None:
                raise no_answer(sub.active)

            counted(
                self.host.metrics,
                self.host.classes,
                sub.cls_name,
                sub.method,
                sub.started,
                timed_out,
            )
        return True

    def answer(self, sub: Submitted) -> Any:
        """The answer of a submitted call whose reply is set, counted in the metrics; held
        back (``NotDurable``) if the node fenced meanwhile, as :meth:`call` does."""

        def result() -> Any:
            value = sub.invoke.reply.get(timeout=0)
            self.may_send_answer()
            return value

        return counted(
            self.host.metrics, self.host.classes, sub.cls_name, sub.method, sub.started, result
        )

    def may_send_answer(self) -> None:
        """Checked right before a held answer leaves: a node that fenced (or whose lease
        deadline passed) while the answer was held answers nothing."""
        if not self.host.may_answer():
            raise NotDurable(
                f"node {self.host.node_id} fenced itself before the answer could be sent"
            )

    def run_here(
        self,
        cell_id: str,
        make: Callable[[], FireAlarm | EditRuntime | RollBack],
        during: str,
        check_answer: bool = True,
    ) -> Any:
        """Send a message made by ``make`` to the cell activated here (a new one for each
        try) and return its durable answer."""
        deadline = time.monotonic() + self.host.settings.call_timeout
        for _ in range(3):
            active = self.host.activate_here(cell_id)
            message = make()
            try:
                active.cell.tell(message)
            except pykka.ActorDeadError:
                continue
            delivered, result = await_answer(message, active, deadline)
            if delivered:
                if check_answer:
                    self.may_send_answer()
                return result
        raise ActivationFailed(f"{cell_id} kept moving while {during}")

    def edit_runtime(
        self, cell_id: str, apply: Callable[[RuntimeTables, int], T], routes: RouteCache
    ) -> T:
        """Run ``apply`` in a transaction of the cell on this node (never placed elsewhere);
        its result once durable, or :class:`~cellactors.errors.RemoteOwner` when a live peer
        owns the cell."""
        result: T = self.run_owned(
            cell_id, lambda: EditRuntime(apply), "its runtime tables were edited", routes
        )
        return result

    def run_owned(
        self,
        cell_id: str,
        make: Callable[[], EditRuntime | RollBack],
        during: str,
        routes: RouteCache,
    ) -> Any:
        """:meth:`run_here` for an operator's message: a cell a live peer owns raises
        :class:`~cellactors.errors.RemoteOwner` naming it."""
        try:
            return self.run_here(cell_id, make, during)
        except StaleRoute:
            route = routes.get(cell_id)
            if route is None:
                raise
            raise RemoteOwner(route.node, route.addr, route.generation) from None
