"""``CellActor``: the base class users subclass to write a cell.

A cell is a pykka actor: its messages are handled one at a time, in arrival order. Each
public method call runs as one SQLite transaction on the cell's own database (``self.db``, a
sqlite-utils ``Database``): committed when the method returns, rolled back when it raises.
The caller's answer is held until every transaction committed before it is durable in the
bucket (see :mod:`cellactors.actors.replicator`).

Lifecycle of an activation: the ownership actor acquires the cell and restores its database,
then starts the actor and sends :class:`~cellactors.actors.messages.Open`, which runs
:meth:`CellActor.on_activate` in a transaction; calls queued behind it run next.

A call may carry an idempotency key (see :mod:`cellactors.persistence.calls`): a keyed call
that writes is recorded in the same transaction; a later call with that key is answered
from the record, through the same hold, without running.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import pykka
import sqlite_utils

from cellactors.actors.channel import Outcome, ReplicaChannel
from cellactors.actors.messages import Invoke, Open, TakeImage
from cellactors.errors import UNKNOWN, BadRequest, BadResult, ConfigError, KeyConflict, MethodFailed
from cellactors.persistence import calls
from cellactors.persistence.celldb import CellDatabase, to_txn


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


@functools.cache
def _exposed(cls: type) -> frozenset[str]:
    return frozenset(
        name
        for name in dir(cls)
        if not name.startswith("_")
        and not hasattr(CellActor, name)
        and callable(getattr(cls, name, None))
    )


class CellActor(pykka.ThreadingActor):
    """Subclass this; public methods become the cell's API.

    Override :meth:`on_activate` to create tables. Do not override pykka's hooks
    (``on_receive``, ``on_start``, ``on_stop``): the runtime uses them.
    """

    use_daemon_thread = True  # a stuck cell must not keep the process alive

    #: Names reserved by the runtime; never exposed as cell methods.
    _RESERVED: ClassVar[frozenset[str]] = frozenset()

    db: sqlite_utils.Database
    cell_id: str
    name: str
    _runtime: CellRuntime | None = None

    def on_activate(self) -> None:
        """Runs once per activation, inside a transaction, before any call."""

    @classmethod
    def exposed_methods(cls) -> frozenset[str]:
        """Public callables defined by the subclass (not by CellActor or pykka); computed
        once per class, since every call checks it."""
        return _exposed(cls)

    @classmethod
    def check_definition(cls) -> None:
        """Refuse a subclass that overrides what the runtime relies on (pykka's lifecycle,
        ``start``/``stop``, the runtime's own hooks) or that exposes no method at all."""
        if not (isinstance(cls, type) and issubclass(cls, CellActor)) or cls is CellActor:
            raise ConfigError(f"{cls!r} is not a CellActor subclass")
        allowed = {"on_activate", "_abc_impl"}
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
        if isinstance(message, Invoke):
            self._invoke(message)
            return None
        if isinstance(message, Open):
            return self._open(message.runtime)
        if isinstance(message, TakeImage):
            rt = self._require_runtime()
            return (rt.next_txid - 1, rt.database.image())
        return super().on_receive(message)

    def _require_runtime(self) -> CellRuntime:
        if self._runtime is None:
            raise RuntimeError("cell actor used before activation")
        return self._runtime

    def _open(self, runtime: CellRuntime) -> None:
        self._runtime = runtime
        self.db = runtime.database.db
        self.cell_id = runtime.cell_id
        self.name = runtime.name
        reply: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        self._transact(self.on_activate, (), {}, reply)
        reply.get()  # on_activate failures fail the activation

    def _invoke(self, msg: Invoke) -> None:
        msg.started.set()
        fn = getattr(self, msg.method)
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
            recorded = rt.database.calls.lookup(msg.key, msg.retention, calls.now_ms())
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
            now = calls.now_ms()
            if key is not None:
                rt.database.calls.record(key, call.method, digest, encoded, now)
            rt.database.calls.collect(call.retention, now)

        try:
            _, changes = rt.database.run(
                lambda: fn(*args, **kwargs), check, on_write if call is not None else None
            )
        except BadResult as err:
            outcome.error, outcome.value = err, None
        except Exception as err:  # the user's method raised: rolled back, reported
            outcome.error, outcome.value = MethodFailed(type(err).__name__, str(err)), None
        else:
            if not changes.empty:
                image = rt.database.image() if changes.schema_changed else None
                txn = to_txn(rt.next_txid, changes, image, int(time.time() * 1000))
                rt.next_txid += 1
                try:
                    rt.channel.commit(txn)
                except BaseException as err:
                    outcome.error, outcome.value = err, None
        rt.channel.hold(outcome)
        rt.channel.note_progress()
