"""``CellActor``: the base class users subclass to write a cell.

A cell is a pykka actor: its messages are handled one at a time, in arrival order. Each
public method call runs as one SQLite transaction on the cell's own database (``self.db``, a
sqlite-utils ``Database``): committed when the method returns, rolled back when it raises.
The caller's answer is held until every transaction committed before it is durable in the
bucket (see :mod:`cellactors.actors.replicator`).

Lifecycle of an activation: the ownership actor acquires the cell and restores its database,
then creates the actor (:meth:`CellActor.start_unopened`) and opens it in the activating thread
(:meth:`CellActor.open_here`), which runs :meth:`CellActor.on_activate` in a transaction before
anyone else holds the cell. The actor's thread starts with its first message: a cell whose
calls all run inline (read-only calls on an idle cell) never starts one.

A call may carry an idempotency key (see :mod:`cellactors.persistence.celldb.calls`): a keyed call
that writes is recorded in the same transaction; a later call with that key is answered
from the record, through the same hold, without running.

Alarms (``set_alarm``/``on_alarm``), schedules (``schedule``/``on_schedule``) and the outbox
(``send``) are rows of runtime tables written in the call's own transaction
(:mod:`cellactors.persistence.celldb.runtime_tables`); a transaction that changed them hands
its new wake state to the replicator with its commit, so the wake entries are written once
it is durable and before its answer is released. Calls between cells (``self.cell(...)``) go
through the node with the call chain, so a cycle is refused instead of deadlocking.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, ClassVar, TypeVar, cast

import pykka
import sqlite_utils

from cellactors.actors.cell_gate import CellInbox, ExecGate
from cellactors.actors.cell_runtime import CellRuntime, check_arguments, check_serializable
from cellactors.actors.cell_schedules import ScheduleApi
from cellactors.actors.executor import NOT_MINE, CellExecutor
from cellactors.actors.messages import (
    Invoke,
)
from cellactors.actors.pykka_ext import LazyThreadingActor
from cellactors.actors.sockets import Connection, Here
from cellactors.actors.sockets import handle as handle_socket
from cellactors.actors.sockets import push as push_to
from cellactors.core import alarms, keys
from cellactors.core.principal import Principal
from cellactors.errors import (
    BadRequest,
    ConfigError,
)
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.celldb.socket_tables import SocketTables, target_of
from cellactors.tracing import spans

log = logging.getLogger(__name__)

#: How long a new activation's replicator holds ``on_activate``'s transaction back for the
#: first message's (which normally follows within a millisecond).
OPENING_LINGER_S = 0.1


def class_name(cls: type[CellActor] | str) -> str:
    """The served name of a cell class given as a class or a name."""
    return cls if isinstance(cls, str) else cls.__name__


class CellRef:
    """``self.cell(Other, "b")``: another cell, called from inside a method. Each call
    (keyword arguments only) blocks until the callee's answer is durable and returns it, or
    raises its error (a :class:`~cellactors.errors.CallError`); see docs/writing-a-cell.md,
    "Calls between cells"."""

    def __init__(self, caller: CellActor, cls_name: str, name: str, key: str | None = None):
        self._caller = caller
        self._cls = cls_name
        self._name = name
        self._key = key
        keys.make_cell_id(cls_name, name)

    def with_key(self, key: str) -> CellRef:
        """The same cell; its calls carry the idempotency key ``key``."""
        return CellRef(self._caller, self._cls, self._name, key)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(**kwargs: Any) -> Any:
            return self._caller._call_out(self._cls, self._name, method, kwargs, self._key)

        return call


_READ_ONLY = "__cellactors_read_only__"

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def read_only(method: F) -> F:
    """Mark a cell method read-only: it may read the cell's database, and nothing else.

    A call to it that writes a row or changes the schema is rolled back and fails
    (``MethodFailed``, outcome ``failed``); it may not call other cells, set alarms or send
    messages either. In exchange, when the cell is idle (no call running, none queued) the
    call runs right in the calling thread instead of crossing into the cell's own thread and
    back: on a serving node, that is the event loop, so keep such methods short (a query,
    not a scan of the whole database). Its answer still waits for every write committed
    before it to be durable. Called from another method of the cell it is an ordinary
    method."""
    setattr(method, _READ_ONLY, True)
    return method


@functools.cache
def _read_only_methods(cls: type) -> frozenset[str]:
    return frozenset(
        name for name in _exposed(cls) if getattr(getattr(cls, name), _READ_ONLY, False) is True
    )


@functools.cache
def _exposed(cls: type) -> frozenset[str]:
    return frozenset(
        name
        for name in dir(cls)
        if not name.startswith("_") and not hasattr(CellActor, name) and _is_method(cls, name)
    )


def _is_method(cls: type, name: str) -> bool:
    """Whether ``name`` is a method written in the body of ``cls`` or of one of its bases
    (a plain, static or class method; decorated, its decorator keeps ``functools.wraps``),
    not any other callable a class may hold: an alias of a function defined elsewhere
    (``dumps = staticmethod(json.dumps)``), a ``functools.partial``, a nested class, a
    callable object."""
    raw = inspect.getattr_static(cls, name, None)
    if isinstance(raw, staticmethod | classmethod):
        raw = raw.__func__
    if not inspect.isfunction(raw):
        return False
    written = inspect.unwrap(raw)
    owner = written.__qualname__.rpartition(".")[0]
    return any(
        base.__qualname__ == owner and base.__module__ == written.__module__ for base in cls.__mro__
    )


class CellActor(ScheduleApi, LazyThreadingActor):
    """Subclass this; public methods become the cell's API.

    Override :meth:`on_activate` to create tables. Do not override pykka's hooks
    (``on_receive``, ``on_start``, ``on_stop``): the runtime uses them.
    """

    use_daemon_thread = True  # a stuck cell must not keep the process alive

    #: Names reserved by the runtime; never exposed as cell methods.
    _RESERVED: ClassVar[frozenset[str]] = frozenset()

    #: A failing ``on_alarm`` runs again after ``alarm_backoff_s``, doubling each time up
    #: to ``alarm_backoff_max_s``, and is abandoned after ``alarm_max_failures`` failures.
    alarm_max_failures: ClassVar[int] = 6
    alarm_backoff_s: ClassVar[float] = 2.0
    alarm_backoff_max_s: ClassVar[float] = 300.0

    db: sqlite_utils.Database
    cell_id: str
    name: str
    _runtime: CellRuntime | None = None
    _chain: tuple[str, ...] = ()
    _caller: Principal | None = None
    _in_txn: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Taken by the cell's thread for every message, and by a caller running a read-only
        # call inline: the cell's code and database are used by one thread at a time.
        self.__gate = ExecGate(cast(CellInbox, self.actor_inbox))
        #: Runs the cell's messages once the activation attached its runtime.
        self.__executor: CellExecutor | None = None

    @classmethod
    def start_unopened(cls) -> CellActor:
        """Create and register a cell actor and return the actor itself, for the activating
        thread to open with :meth:`open_here` before it hands out the ref. Its thread
        starts with its first message."""
        return cls.start_lazily()

    def _may_stop_here(self) -> bool:
        """A stop that finds the cell's thread never started stops the cell in the stopping
        thread, but not while a read runs inline: then the stop is queued, and its sender
        may time out waiting for it as for any stop behind a running call."""
        return self.__gate.close_if_free()

    def open_here(self, runtime: CellRuntime) -> alarms.WakeState:
        """Attach the activation's runtime and run ``on_activate``, in the calling thread
        and under the cell's lock; the alarm and outbox state it leaves (the node mirrors it
        in wake entries). Its failure fails the activation."""
        with self.__gate.opening():
            self._runtime = runtime
            self.db = runtime.database.db
            self.cell_id = runtime.cell_id
            self.name = runtime.name
            reply: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
            self._chain = (self.cell_id,)
            self._caller = None
            self.__executor = CellExecutor(self, runtime)
            # The first message follows at once: on_activate's transaction waits for it in
            # the replicator and shares its upload (a new cell's schema and first write are
            # one batch). Its failure fails the activation; its acknowledgement is not
            # waited for: every answer of the cell waits for it anyway (txid order).
            runtime.channel.opening(OPENING_LINGER_S)
            self.__executor.transact(self.on_activate, (), {}, reply)
            with contextlib.suppress(pykka.Timeout):  # not yet acknowledged: not waited
                reply.get(timeout=0)  # raises what on_activate raised
            runtime.run_inline = self._run_inline
            runtime.trim_if_idle = self._trim_if_idle
            runtime.database.before_close = self.__gate.close
            return runtime.database.tables.state()

    def on_activate(self) -> None:
        """Runs once per activation, inside a transaction, before any call."""

    def on_alarm(self) -> None:
        """Runs when the alarm set with :meth:`set_alarm` is due, as one transaction like
        any call; the alarm is consumed in that transaction unless it sets a new one. If it
        raises, it is rolled back and retried (see ``alarm_max_failures``)."""

    def on_connect(self, conn: Connection) -> None:
        """Runs when a socket opens on the cell (``GET /cells/{cls}/{name}/ws``, or an event
        stream), as one transaction; raise to refuse it (closed with 4403). A class that
        defines this or :meth:`on_message` takes sockets; others refuse them (404)."""

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        """Runs for each message a socket sends (text as ``str``, binary as ``bytes``), one
        at a time with the cell's calls, as one transaction. If it raises, it is rolled back,
        nothing it sent leaves, and the socket is closed (1011)."""

    def on_close(self, conn: Connection, code: int, reason: str) -> None:
        """Runs when a socket closed: by its client, or 1006 when the node holding it was
        lost (not when the cell closed it with ``conn.close()``)."""

    @classmethod
    def takes_sockets(cls) -> bool:
        """Whether the class defines a socket handler (else sockets to it are refused)."""
        return cls.on_connect is not CellActor.on_connect or (
            cls.on_message is not CellActor.on_message
        )

    @classmethod
    def authorize(cls, caller: Principal | None, name: str, method: str) -> bool:
        """Whether ``caller`` may call ``method`` on the cell ``name`` of this class: the
        rule that needs the cell's name (a tenant per cell, say). Runs on the node that
        took the call, before the cell is activated, after the method's own rule
        (:func:`cellactors.allow`, :func:`cellactors.public`) admitted the caller; False
        answers 403 ``forbidden`` and the call does not run. It has no access to the
        cell's state. The default admits everyone the method's rule admitted."""
        return True

    # --- the API cells use inside their methods -----------------------------------------

    @property
    def caller(self) -> Principal | None:
        """Who called the running method: the principal the node authenticated (its
        ``name`` and ``roles``), carried unchanged into the calls and messages this method
        makes to other cells; None for an anonymous caller, ``on_activate`` and
        ``on_alarm``."""
        return self._caller

    def now(self) -> float:
        """The runtime's time in epoch seconds: the store's clock, which alarms fall due by
        (set alarms from it, not from ``time.time()``, whose machine may be off)."""
        return self._require_runtime().clock.now()

    def _now_ms(self) -> int:
        return self._require_runtime().clock.now_ms()

    def set_alarm(self, at: float | datetime) -> None:
        """Have :meth:`on_alarm` run at ``at`` (epoch seconds or a datetime), replacing any
        alarm set before. Part of the current transaction: it exists once that is durable.
        The alarm is one schedule among the cell's (named ``"@alarm"`` in
        :meth:`schedules`)."""
        at_ms = alarms.to_ms(at)
        with self._runtime_db().runtime_writes() as tables:
            tables.set_alarm(at_ms, trace=spans.traceparent())  # its fire links to this trace

    def get_alarm(self) -> float | None:
        """When the alarm is due (epoch seconds), or None when no alarm is set."""
        row = self._runtime_db(writing=False).tables.alarm()
        return None if row is None else row.at_ms / 1000

    def delete_alarm(self) -> None:
        """Remove the alarm, if any (part of the current transaction)."""
        with self._runtime_db().runtime_writes() as tables:
            tables.delete_alarm()

    def connections(self, tag: str | None = None) -> list[Connection]:
        """The sockets open on the cell (with ``tag``, if given), oldest first."""
        rows = self._runtime_db(writing=False).sockets.all(tag)
        return [Connection(row, self._socket_writes) for row in rows]

    def broadcast(self, data: str | bytes, tag: str | None = None) -> int:
        """Send ``data`` to every socket (with ``tag``, if given) once this transaction is
        durable; how many sockets it goes to."""
        with self._socket_writes() as tables:
            return push_to(tables, target_of(tag=tag), data)

    @contextlib.contextmanager
    def _socket_writes(self) -> Iterator[SocketTables]:
        database = self._runtime_db()
        with database.runtime_writes():
            yield database.sockets

    def _cellactors_socket(self, event: str, **fields: Any) -> Any:
        """The runtime's socket events (see :mod:`cellactors.actors.sockets`)."""
        rt = self._require_runtime()
        if rt.services is None:
            raise RuntimeError("this cell runs without a node: it has no sockets")
        ledger = rt.services.pushes
        here = Here(rt.cell_id, rt.epoch, ledger.holder, ledger.synced)
        return handle_socket(self, self._socket_writes, here, event, fields, rt.clock.now_ms())

    def cell(self, cls: type[CellActor] | str, name: str) -> CellRef:
        """Another cell, to call synchronously: ``self.cell(Account, "bob").credit(amount=5)``."""
        return CellRef(self, class_name(cls), name)

    def send(self, cls: type[CellActor] | str, name: str, method: str, /, **kwargs: Any) -> str:
        """Record a message to ``cls:name``'s ``method(**kwargs)`` in this transaction's
        outbox; it is delivered, exactly once, after this transaction is durable (and never
        if it rolls back). Returns the message id (its delivery's idempotency key)."""
        rt = self._require_runtime()
        database = self._runtime_db()
        cls_name = class_name(cls)
        if method.startswith("_"):  # the runtime's own (a socket event) included: never sent
            raise BadRequest(f"{cls_name} has no public method {method!r}")
        target = keys.make_cell_id(cls_name, name)
        if not isinstance(cls, str):
            if method not in cls.exposed_methods():
                raise BadRequest(f"{cls_name} has no public method {method!r}")
            check_arguments(cls, method, (), kwargs)  # a bad message fails its sender now
        check_serializable(kwargs, "message arguments")
        with database.runtime_writes() as tables:
            return tables.add_message(
                rt.next_txid,
                target,
                method,
                dict(kwargs),
                rt.clock.now_ms(),
                self._caller,
                spans.traceparent(),  # its delivery joins this call's trace
            )

    @classmethod
    def exposed_methods(cls) -> frozenset[str]:
        """Public callables defined by the subclass (not by CellActor or pykka); computed
        once per class, since every call checks it."""
        return _exposed(cls)

    @classmethod
    def read_only_methods(cls) -> frozenset[str]:
        """The exposed methods marked with :func:`read_only`."""
        return _read_only_methods(cls)

    @classmethod
    def check_definition(cls) -> None:
        """Refuse a subclass that overrides what the runtime relies on (pykka's lifecycle,
        ``start``/``stop``, the runtime's own hooks) or that exposes no method at all."""
        if not (isinstance(cls, type) and issubclass(cls, CellActor)) or cls is CellActor:
            raise ConfigError(f"{cls!r} is not a CellActor subclass")
        allowed = {
            "on_activate",
            "on_alarm",
            "on_schedule",
            "alarm_max_failures",
            "alarm_backoff_s",
            "alarm_backoff_max_s",
            "authorize",
            "on_connect",
            "on_message",
            "on_close",
            "_abc_impl",
        }
        clashes = sorted(
            name
            for klass in cls.__mro__
            if klass not in CellActor.__mro__
            for name in vars(klass)
            if name not in allowed and hasattr(CellActor, name) and not name.startswith("__")
        )
        if clashes:
            raise ConfigError(
                f"cell class {cls.__name__} overrides {', '.join(clashes)}, which the runtime "
                "uses; rename these methods"
            )
        if not cls.exposed_methods() and not cls.takes_sockets():
            raise ConfigError(f"cell class {cls.__name__} has no public method")

    # --- runtime side -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        with self.__gate.handling():
            executor = self.__executor
            answer = NOT_MINE if executor is None else executor.dispatch(message)
            return super().on_receive(message) if answer is NOT_MINE else answer

    def on_stop(self) -> None:
        self.__gate.close()  # waits for a read-only call running inline; none starts after

    def on_failure(self, *_exc_info: Any) -> None:
        self.__gate.close()

    def _run_inline(self, msg: Invoke) -> bool:
        """Run ``msg`` (a call to a read-only method) in the calling thread if the cell is
        idle and open (:class:`~cellactors.actors.cell_gate.ExecGate`). False: it did not
        run, send it to the mailbox. The answer is held like any other (``msg.reply``)."""
        return self.__gate.run_if_idle(
            lambda: self._require_executor().invoke_inline(msg), self.actor_stopped.is_set
        )

    def _trim_if_idle(self) -> bool:
        """Hand the database's caches back in the calling thread (the node's reaper), if the
        cell is idle. Never raises: a failed trim only leaves the caches where they were,
        and must not stop the reaper from hibernating and releasing every other cell."""
        database = self._require_runtime().database

        def trim() -> None:
            try:
                database.trim()
            except Exception:
                log.exception("trimming the caches of %s failed", self.cell_id)

        return self.__gate.run_if_idle(trim, self.actor_stopped.is_set)

    def _require_executor(self) -> CellExecutor:
        if self.__executor is None:
            raise RuntimeError("cell actor used before activation")
        return self.__executor

    def _require_runtime(self) -> CellRuntime:
        if self._runtime is None:
            raise RuntimeError("cell actor used before activation")
        return self._runtime

    def _runtime_db(self, writing: bool = True) -> CellDatabase:
        """The database, only inside a call's transaction (alarms and messages are part
        of one); ``writing`` (setting an alarm, sending a message) not in a read-only one."""
        if not self._in_txn:
            raise RuntimeError("alarms and messages can only be used inside a cell's method")
        database = self._require_runtime().database
        if writing and database.read_only:
            raise RuntimeError("a read-only method cannot set alarms or send messages")
        return database

    def _call_out(
        self, cls_name: str, name: str, method: str, kwargs: dict[str, Any], key: str | None
    ) -> Any:
        rt = self._require_runtime()
        if rt.database.read_only:
            raise RuntimeError("a read-only method cannot call other cells")
        if rt.services is None:
            raise RuntimeError("this cell runs without a node: it cannot call other cells")
        with spans.span(
            "cellactors.call_cell",
            kind=spans.SpanKind.CLIENT,
            cell=f"{cls_name}:{name}",
            cell_class=cls_name,
            cell_name=name,
            method=method,
        ) as span:
            result = rt.services.call_cell(
                cls_name, name, method, kwargs, key=key, chain=self._chain, caller=self._caller
            )
            span.outcome(None)
            return result
