"""``CellActor``: the base class users subclass to write a cell.

A cell is a pykka actor: its messages are handled one at a time, in arrival order. Each
public method call runs as one SQLite transaction on the cell's own database (``self.db``, a
sqlite-utils ``Database``): committed when the method returns, rolled back when it raises.
The caller's answer is held until every transaction committed before it is durable in the
bucket (see :mod:`cellactors.actors.replicator`).

Lifecycle of an activation: the ownership actor acquires the cell and restores its database,
then starts the actor and sends :class:`~cellactors.actors.messages.Open`, which runs
:meth:`CellActor.on_activate` in a transaction; calls queued behind it run next.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import pykka
import sqlite_utils

from cellactors.actors.channel import Outcome, ReplicaChannel
from cellactors.actors.messages import Invoke, Open, TakeImage
from cellactors.errors import BadRequest, ConfigError, MethodFailed
from cellactors.persistence.celldb import CellDatabase, to_txn


def check_serializable(value: Any, what: str = "result") -> None:
    """Raise :class:`BadRequest` unless msgpack can carry ``value`` unchanged."""
    try:
        msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as err:
        raise BadRequest(f"{what} is not msgpack-serializable: {err}") from err


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
        self._transact(fn, msg.args, msg.kwargs, msg.reply)

    def _transact(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], reply: pykka.Future[Any]
    ) -> None:
        rt = self._require_runtime()
        rt.last_used = time.monotonic()
        outcome = Outcome(reply)
        try:
            outcome.value, changes = rt.database.run(
                lambda: fn(*args, **kwargs), check_serializable
            )
        except BadRequest as err:
            outcome.error = err
        except Exception as err:  # the user's method raised: rolled back, reported
            outcome.error = MethodFailed(type(err).__name__, str(err))
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
