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

Alarms (``set_alarm``/``on_alarm``) and the outbox (``send``) are rows of runtime tables
written in the call's own transaction (:mod:`cellactors.persistence.celldb.runtime_tables`); a
transaction that changed them hands its new wake state to the replicator with its commit, so
the wake entries are written once it is durable and before its answer is released. Calls
between cells (``self.cell(...)``) go through the node with the call chain, so a cycle is
refused instead of deadlocking.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar, cast

import msgpack
import pykka
import sqlite_utils

from cellactors.actors.cell_gate import CellInbox, ExecGate
from cellactors.actors.channel import Outcome, ReplicaChannel
from cellactors.actors.messages import (
    EditRuntime,
    FireAlarm,
    Invoke,
    ReadOutbox,
    TakeImage,
)
from cellactors.actors.pykka_ext import LazyThreadingActor
from cellactors.clock import RuntimeClock, StoreClock
from cellactors.core import alarms, keys
from cellactors.errors import (
    UNKNOWN,
    BadRequest,
    BadResult,
    ConfigError,
    KeyConflict,
    MethodFailed,
    NodeStorageFault,
)
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.capture import TxnChanges
from cellactors.persistence.celldb.database import CellDatabase, ReadInterrupted, to_txn

log = logging.getLogger(__name__)


def check_serializable(value: Any, what: str = "result") -> None:
    """Raise :class:`BadRequest` unless msgpack can carry ``value`` unchanged."""
    try:
        msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as err:
        raise BadRequest(f"{what} is not msgpack-serializable: {err}") from err


def encode_result(value: Any) -> bytes:
    """msgpack of a method's result; :class:`BadResult` when msgpack cannot carry it."""
    try:
        return calls.encode(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise BadResult(f"result is not msgpack-serializable: {err}") from err


def run_result_check(check: Callable[[Any], None], value: Any) -> None:
    """Run the caller's ``result_check``; whatever it raises becomes :class:`BadResult`."""
    try:
        check(value)
    except BadResult:
        raise
    except Exception as err:
        raise BadResult(f"the result was refused: {err}") from err


_signatures: dict[tuple[type, str], inspect.Signature | None] = {}


def bound_arguments(
    cls: type, method: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """Parameter name -> value of a call, as ``fn`` would bind it (None if it would not), so a
    key's arguments compare equal whether they were passed by position or by name."""
    if (cls, method) not in _signatures:
        try:
            _signatures[(cls, method)] = inspect.signature(fn)
        except (TypeError, ValueError):
            _signatures[(cls, method)] = None
    sig = _signatures[(cls, method)]
    if sig is None:
        return None
    try:
        return dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return None  # the call will fail as the method is called; nothing is recorded


@functools.cache
def _call_signature(cls: type, method: str) -> tuple[inspect.Signature, bool] | None:
    """How a call of ``cls.method`` binds its arguments: the signature and whether it takes
    the instance first (a plain method does; a static or class method does not). None when
    Python cannot tell (a builtin): such calls are not checked."""
    raw = inspect.getattr_static(cls, method, None)
    takes_self = inspect.isfunction(raw)
    try:
        return inspect.signature(getattr(cls, method)), takes_self
    except (TypeError, ValueError):
        return None


def check_arguments(cls: type, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise :class:`BadRequest` (``not_run``) when ``args`` and ``kwargs`` do not fit the
    method's parameters (one missing, one unknown, one given twice): such a call would fail
    before the method's first line, so it is refused before the cell is activated and
    leaves nothing behind."""
    found = _call_signature(cls, method)
    if found is None:
        return
    sig, takes_self = found
    try:
        sig.bind(*((None,) if takes_self else ()), *args, **kwargs)
    except TypeError as err:
        raise BadRequest(
            f"bad arguments for {cls.__name__}.{method}{sig_text(sig, takes_self)}: {err}"
        ) from None


def sig_text(sig: inspect.Signature, takes_self: bool) -> str:
    """The parameters a caller gives, as ``(name, by=1)``."""
    params = list(sig.parameters.values())[1 if takes_self else 0 :]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


class CellServices(Protocol):
    """What a cell asks of its node: calls to other cells (run here or forwarded)."""

    def call_cell(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        chain: tuple[str, ...] = (),
    ) -> Any: ...


@dataclass
class CellRuntime:
    """What an activation gives the actor: identity, epoch, database and channel."""

    cell_id: str
    name: str
    epoch: int
    database: CellDatabase
    channel: ReplicaChannel
    next_txid: int
    last_used: float = field(default_factory=time.monotonic)
    services: CellServices | None = None
    #: The runtime's clock (alarms, key retention, transaction stamps): the node's.
    clock: RuntimeClock = field(default_factory=lambda: RuntimeClock(StoreClock("local")))
    #: The ``last_used`` of the idle period whose memory was last trimmed (node's reaper).
    trimmed_for: float | None = None
    #: Runs a call to a read-only method in the calling thread when the cell is idle
    #: (set by the cell when it opens; see :func:`read_only`). False: send it instead.
    run_inline: Callable[[Invoke], bool] | None = None
    #: Hands the database's caches back in the calling thread if the cell is idle (set
    #: when it opens). False: it is not idle, and nothing was done.
    trim_if_idle: Callable[[], bool] | None = None


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
        if not name.startswith("_")
        and not hasattr(CellActor, name)
        and callable(getattr(cls, name, None))
    )


class CellActor(LazyThreadingActor):
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
    _in_txn: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Taken by the cell's thread for every message, and by a caller running a read-only
        # call inline: the cell's code and database are used by one thread at a time.
        self.__gate = ExecGate(cast(CellInbox, self.actor_inbox))

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
            self._transact(self.on_activate, (), {}, reply)
            reply.get()
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

    # --- the API cells use inside their methods -----------------------------------------

    def now(self) -> float:
        """The runtime's time in epoch seconds: the store's clock, which alarms fall due by
        (set alarms from it, not from ``time.time()``, whose machine may be off)."""
        return self._require_runtime().clock.now()

    def set_alarm(self, at: float | datetime) -> None:
        """Have :meth:`on_alarm` run at ``at`` (epoch seconds or a datetime), replacing any
        alarm set before. Part of the current transaction: it exists once that is durable."""
        at_ms = alarms.to_ms(at)
        with self._runtime_db().runtime_writes() as tables:
            tables.set_alarm(at_ms)

    def get_alarm(self) -> float | None:
        """When the alarm is due (epoch seconds), or None when no alarm is set."""
        row = self._runtime_db(writing=False).tables.alarm()
        return None if row is None else row.at_ms / 1000

    def delete_alarm(self) -> None:
        """Remove the alarm, if any (part of the current transaction)."""
        with self._runtime_db().runtime_writes() as tables:
            tables.delete_alarm()

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
        target = keys.make_cell_id(cls_name, name)
        if not isinstance(cls, str) and method not in cls.exposed_methods():
            raise BadRequest(f"{cls_name} has no public method {method!r}")
        check_serializable(kwargs, "message arguments")
        with database.runtime_writes() as tables:
            return tables.add_message(rt.next_txid, target, method, dict(kwargs), rt.clock.now_ms())

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
            "alarm_max_failures",
            "alarm_backoff_s",
            "alarm_backoff_max_s",
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
        if not cls.exposed_methods():
            raise ConfigError(f"cell class {cls.__name__} has no public method")

    # --- runtime side -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        with self.__gate.handling():
            return self._dispatch(message)

    def on_stop(self) -> None:
        self.__gate.close()  # waits for a read-only call running inline; none starts after

    def on_failure(self, *_exc_info: Any) -> None:
        self.__gate.close()

    def _run_inline(self, msg: Invoke) -> bool:
        """Run ``msg`` (a call to a read-only method) in the calling thread if the cell is
        idle and open (:class:`~cellactors.actors.cell_gate.ExecGate`). False: it did not
        run, send it to the mailbox. The answer is held like any other (``msg.reply``)."""
        return self.__gate.run_if_idle(lambda: self._invoke_inline(msg), self.actor_stopped.is_set)

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

    def _invoke_inline(self, msg: Invoke) -> None:
        try:
            self._invoke(msg)
        except BaseException as err:  # the read-only transaction rolled back; never the
            # caller's thread (the event loop) that goes down with it
            log.exception("read-only call %s.%s failed inline", self.cell_id, msg.method)
            failure = MethodFailed(type(err).__name__, str(err))
            with contextlib.suppress(queue.Full):  # unless it was answered already
                msg.reply.set_exception((type(failure), failure, None))

    def _dispatch(self, message: Any) -> Any:
        if isinstance(message, Invoke):
            self._invoke(message)
            return None
        if isinstance(message, TakeImage):
            rt = self._require_runtime()
            return self._reading(lambda: (rt.next_txid - 1, rt.database.image()))
        if isinstance(message, FireAlarm):
            self._fire(message)
            return None
        if isinstance(message, ReadOutbox):
            rt = self._require_runtime()
            return self._reading(lambda: (rt.database.tables.messages(), rt.channel.acked))
        if isinstance(message, EditRuntime):
            self._edit_runtime(message)
            return None
        return super().on_receive(message)

    def _reading(self, read: Callable[[], R]) -> R:
        """A read of the runtime's outside any call (a snapshot image, the outbox): never
        from a broken file, and a storage error raised as the fault it is."""
        database = self._require_runtime().database
        database.check_usable()
        try:
            return read()
        except Exception as err:
            fault = database.storage_fault(err)
            if fault is None:
                raise
            raise fault from err

    def _storage_fault_of(self, err: BaseException) -> NodeStorageFault | None:
        """``err`` as a fault of this cell's own storage: one its database raised, or a raw
        storage error of a read outside a transaction. A fault another cell's node raised
        into a method is none of this cell's."""
        database = self._require_runtime().database
        if database.raised_here(err):
            assert isinstance(err, NodeStorageFault)
            return err
        if isinstance(err, NodeStorageFault):
            return None
        return database.storage_fault(err)

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
        return rt.services.call_cell(cls_name, name, method, kwargs, key=key, chain=self._chain)

    def _alarm_policy(self) -> alarms.AlarmPolicy:
        cls = type(self)
        return alarms.AlarmPolicy(
            cls.alarm_max_failures, cls.alarm_backoff_s, cls.alarm_backoff_max_s
        )

    def _run(
        self,
        fn: Callable[[], Any],
        check: Callable[[Any], None] | None = None,
        on_write: Callable[[Any], None] | None = None,
        read_only: bool = False,
        interrupt_at: float | None = None,
    ) -> tuple[Any, TxnChanges]:
        """One transaction of this cell (alarm and outbox usable inside it, unless
        ``read_only``: then it may not write at all)."""
        rt = self._require_runtime()
        rt.database.tables.touched = False
        self._in_txn = True
        try:
            return rt.database.run(
                fn, check, on_write, read_only=read_only, interrupt_at=interrupt_at
            )
        finally:
            self._in_txn = False

    def _commit(self, changes: TxnChanges, outcome: Outcome) -> None:
        """Hand a committed transaction to the replicator, with its new wake state when it
        touched the alarm or the outbox; a refusal of the channel fails ``outcome``."""
        rt = self._require_runtime()
        if changes.empty:
            return
        try:
            effect = rt.database.tables.state() if rt.database.tables.touched else None
            image = rt.database.image() if changes.schema_changed else None
        except Exception as err:
            # Committed in the file, but it cannot be shipped: the file is not the bucket's
            # any more. Nothing of it leaves this node, and the file is discarded.
            fault = rt.database.storage_fault(err, broken=True)
            if fault is None:
                raise
            outcome.error, outcome.value = fault, None
            return
        txn = to_txn(rt.next_txid, changes, image, rt.clock.now_ms())
        rt.next_txid += 1
        try:
            rt.channel.commit(txn, effect)
        except BaseException as err:
            outcome.error, outcome.value = err, None

    def _fire(self, msg: FireAlarm) -> None:
        """Run ``on_alarm`` if the alarm is due; on failure, record the retry (or drop the
        alarm after the last one) in a transaction of its own."""
        msg.started = True
        rt = self._require_runtime()
        outcome = Outcome(msg.reply, "not_due")
        try:
            self._fire_if_due(rt, outcome)
        except Exception as err:  # the node's storage failed: the alarm stays as it was
            fault = self._storage_fault_of(err)
            if fault is None:
                raise
            outcome.error, outcome.value = fault, None
        rt.channel.hold(outcome)
        rt.channel.note_progress()

    def _fire_if_due(self, rt: CellRuntime, outcome: Outcome) -> None:
        """The body of :meth:`_fire`: a fault of this node's storage is raised, never
        counted as a failure of ``on_alarm``."""
        rt.database.check_usable()
        row = rt.database.tables.alarm()
        if row is not None and row.at_ms <= rt.clock.now_ms():
            rt.last_used = time.monotonic()
            self._chain = (self.cell_id,)

            def body() -> None:
                self.on_alarm()
                with rt.database.runtime_writes() as tables:
                    tables.delete_alarm(row.nonce)  # consumed, unless on_alarm set a new one

            try:
                _, changes = self._run(body)
                outcome.value = "fired"
            except Exception as err:
                if self._storage_fault_of(err) is not None:
                    raise
                failures = row.failures + 1
                again = alarms.retry_at(self._alarm_policy(), failures, rt.clock.now_ms())
                log.warning(
                    "on_alarm of %s failed (%d in a row): %s: %s",
                    self.cell_id,
                    failures,
                    type(err).__name__,
                    err,
                )

                def record() -> None:
                    with rt.database.runtime_writes() as tables:
                        if again is None:
                            tables.delete_alarm(row.nonce)
                        else:
                            tables.set_alarm(again, failures)

                try:
                    _, changes = self._run(record)
                    outcome.value = "abandoned" if again is None else "retry"
                except Exception as failure:  # the retry could not be recorded: fire again
                    outcome.error, outcome.value = failure, None
                    changes = TxnChanges()
            self._commit(changes, outcome)

    def _edit_runtime(self, msg: EditRuntime) -> None:
        """The runtime's own transaction on its tables (the outbox deleting delivered
        messages and burying dead letters, an operator's retry or purge); its answer is held
        like a call's. A failure rolls it back and is the answer."""
        msg.started = True
        rt = self._require_runtime()
        outcome = Outcome(msg.reply)

        def body() -> Any:
            with rt.database.runtime_writes() as tables:
                return msg.apply(tables, rt.next_txid)

        try:
            outcome.value, changes = self._run(body)
            self._commit(changes, outcome)
        except Exception as err:
            outcome.error, outcome.value = err, None
        rt.channel.hold(outcome)
        rt.channel.note_progress()

    def _invoke(self, msg: Invoke) -> None:
        msg.started = True
        fn = getattr(self, msg.method)
        self._chain = (*msg.chain, self.cell_id)
        digest = ""
        if msg.key is not None:
            answered, digest = self._replay(msg, fn)
            if answered:
                return
        self._transact(fn, msg.args, msg.kwargs, msg.reply, msg, digest)

    def _replay(self, msg: Invoke, fn: Any) -> tuple[bool, str]:
        """Answer a keyed call from its record if the key is recorded: (True, ""). Else
        (False, digest of its arguments), taken before the method can touch them."""
        assert msg.key is not None
        rt = self._require_runtime()
        outcome = Outcome(msg.reply)
        try:
            arguments = bound_arguments(type(self), msg.method, fn, msg.args, msg.kwargs)
            digest = calls.args_digest(arguments, msg.args, msg.kwargs)
            rt.database.check_usable()
            try:
                recorded = rt.database.calls.lookup(msg.key, msg.retention, rt.clock.now_ms())
            except Exception as err:
                fault = rt.database.storage_fault(err)
                if fault is None:
                    raise
                raise fault from err
            if recorded is None:
                return False, digest
            rt.last_used = time.monotonic()
            if recorded.method != msg.method:
                raise KeyConflict(
                    f"idempotency key {msg.key!r} is recorded for method {recorded.method!r}"
                )
            if recorded.args_sha256 != digest:
                raise KeyConflict(
                    f"idempotency key {msg.key!r} is recorded for {msg.method} with other arguments"
                )
            outcome.value = calls.decode(recorded.result)
            if msg.result_check is not None:
                try:
                    run_result_check(msg.result_check, outcome.value)
                except BadResult as err:
                    # The recorded call did take effect: "failed" (rolled back) would be false.
                    err.outcome = UNKNOWN
                    raise
        except Exception as err:
            outcome.error, outcome.value = err, None
        # Like any answer, it waits for every earlier transaction (the record's included).
        rt.channel.hold(outcome)
        rt.channel.note_progress()
        return True, ""

    def _transact(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: pykka.Future[Any],
        call: Invoke | None = None,
        digest: str = "",
    ) -> None:
        """Run one call (or ``on_activate``, with no ``call``) as a transaction and hold its
        answer; a keyed call that writes is recorded under ``digest`` in the same one."""
        rt = self._require_runtime()
        rt.last_used = time.monotonic()
        outcome = Outcome(reply)
        key = call.key if call is not None else None
        encoded = b""

        def check(result: Any) -> None:
            nonlocal encoded
            encoded = encode_result(result)
            # A keyed call answers what its record will replay: the msgpack round trip.
            outcome.value = calls.decode(encoded) if key is not None else result
            if call is not None and call.result_check is not None:
                run_result_check(call.result_check, outcome.value)

        def on_write(_result: Any) -> None:
            assert call is not None
            now = rt.clock.now_ms()
            if key is not None:
                rt.database.calls.record(key, call.method, digest, encoded, now)
            rt.database.calls.collect(call.retention, now)

        try:
            _, changes = self._run(
                lambda: fn(*args, **kwargs),
                check,
                on_write if call is not None else None,
                read_only=call is not None and call.method in type(self).read_only_methods(),
                interrupt_at=call.interrupt_at if call is not None else None,
            )
        except ReadInterrupted:
            assert call is not None
            call.interrupted = True  # not answered: the node sends it again off the loop
            return
        except BadResult as err:
            outcome.error, outcome.value = err, None
        except Exception as err:  # the user's method raised, or the node's storage failed
            fault = self._storage_fault_of(err)
            if fault is not None:  # rolled back: nothing applied, nothing shipped
                outcome.error, outcome.value = fault, None
            else:  # rolled back, reported; the original (with its traceback) as the cause
                failure = MethodFailed(type(err).__name__, str(err))
                failure.__cause__ = err
                outcome.error, outcome.value = failure, None
        else:
            self._commit(changes, outcome)
        rt.channel.hold(outcome)
        rt.channel.note_progress()
