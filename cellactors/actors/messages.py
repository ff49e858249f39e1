"""Messages passed between the node and a cell's actors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pykka
from pykka.messages import ProxyCall, ProxyGetAttr

from cellactors.core.principal import Principal
from cellactors.persistence.celldb.calls import Retention
from cellactors.tracing.spans import Context

if TYPE_CHECKING:
    from cellactors.persistence.celldb.runtime_tables import RuntimeTables


@dataclass
class Invoke:
    """Run ``method(*args, **kwargs)`` as one transaction; ``reply`` gets the held outcome."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    reply: pykka.Future[Any]
    #: Set by the cell when it takes the call: a stopped actor that never set it never ran it.
    #: (A plain flag: one thread sets it, others only read it.)
    started: bool = False
    #: The idempotency key: recorded with the call's writes; a recorded key answers from
    #: the record without running.
    key: str | None = None
    #: Runs on the result before commit; raising refuses it (rolled back, ``BadResult``).
    result_check: Callable[[Any], None] | None = None
    #: The node's key retention, applied by the write transactions of this call.
    retention: Retention = field(default_factory=Retention)
    #: The cells waiting on this call, outermost first (calls between cells): a call from
    #: it to any of them would deadlock and is refused (``CallCycle``).
    chain: tuple[str, ...] = ()
    #: Who called (the principal the public listener authenticated, carried through calls
    #: between cells and the outbox); None for an anonymous caller.
    caller: Principal | None = None
    #: A read-only call running on the serving event loop: its SQL is interrupted at this
    #: ``time.perf_counter()`` (None: never), and the call is then not answered but
    #: ``interrupted``, to be sent again off the loop (it had no effect).
    interrupt_at: float | None = None
    interrupted: bool = False
    #: The sender's trace context (None when it does not trace): the cell's thread runs the
    #: call in a span under it (contextvars do not cross into that thread on their own).
    trace: Context | None = None


@dataclass
class FireAlarm:
    """Run ``on_alarm`` if the cell's alarm is due; ``reply`` gets ``"not_due"``,
    ``"fired"``, ``"retry"`` or ``"abandoned"`` once that outcome is durable."""

    reply: pykka.Future[Any] = field(default_factory=pykka.ThreadingFuture)
    started: bool = False
    #: The alarm's span on the firing thread (None when it does not trace).
    trace: Context | None = None


@dataclass
class ReadOutbox:
    """Ask the cell for its undelivered outbox messages (oldest first) and its acked txid."""


@dataclass
class EditRuntime:
    """Run ``apply(tables, txid)`` on the cell's runtime tables in a transaction of the cell
    (the outbox's deliveries and dead letters; ``txid`` is the one it commits as, if it
    writes); ``reply`` gets its result once that, and every earlier transaction, is
    durable. ``started`` is set when the cell takes it."""

    apply: Callable[[RuntimeTables, int], Any]
    reply: pykka.Future[Any] = field(default_factory=pykka.ThreadingFuture)
    started: bool = False


@dataclass
class RollBack:
    """Make the cell's user tables what they were right after ``to_txid`` (``image``: the
    database then, restored from the bucket), in one transaction of the activation
    ``incarnation`` (refused, unchanged, in any other); ``reply`` gets a
    :class:`RolledBack` once that, and every earlier transaction, is durable. Without
    ``to_txid`` it only asks: ``reply`` gets (incarnation, epoch, latest txid) once every
    transaction up to that txid is durable."""

    to_txid: int | None = None
    image: bytes = b""
    incarnation: int | None = None
    reply: pykka.Future[Any] = field(default_factory=pykka.ThreadingFuture)
    started: bool = False


@dataclass(frozen=True)
class RolledBack:
    """A rollback's answer: the state is now that of ``to_txid``; ``txid`` is the rollback's
    own transaction (None when nothing differed), and rolling back to ``undo_txid`` (the
    txid before it) undoes it."""

    to_txid: int
    txid: int | None
    undo_txid: int


@dataclass
class TakeImage:
    """Ask the cell for (committed txid, database image) for a snapshot."""


@dataclass
class Kick:
    """Tell the replicator there may be committed, unshipped transactions."""


@dataclass
class Flush:
    """Ask the replicator to ship everything and answer when all is acknowledged or failed."""

    done: pykka.Future[Any] = field(default_factory=pykka.ThreadingFuture)


def ask_method(
    ref: pykka.ActorRef[Any], method: str, *args: Any, **kwargs: Any
) -> pykka.Future[Any]:
    """Call ``method`` on the actor behind ``ref``, in its thread: what
    ``ref.proxy().method(*args, **kwargs)`` does, without building the proxy (pykka
    inspects every attribute of the actor for each new proxy, which was a large part of
    activating and waking a cell)."""
    return ref.ask(ProxyCall(attr_path=(method,), args=args, kwargs=kwargs), block=False)


def ask_attribute(ref: pykka.ActorRef[Any], name: str) -> pykka.Future[Any]:
    """Read attribute ``name`` of the actor behind ``ref`` in its thread (no proxy)."""
    return ref.ask(ProxyGetAttr(attr_path=(name,)), block=False)
